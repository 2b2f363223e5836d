"""Exported heads for PyTorch users: a torch implementation of the XPress refiner written from
the paper's equations, loaded from the exported file, gives our refined logits."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.torch import load_file

from xpress_jax.checkpoints.heads import save_head
from xpress_jax.models.heads import XPressRefiner


def torch_xpress_logits(w: dict, s, h, prev):
    """XPress (i)-(v) in torch: s [b, n, V], h [b, n, H], prev x_{k-1} [b, n] -> l [b, n, V]."""
    g = h.mean(dim=1, keepdim=True)  # g = mean_k h_k
    e = w["W_e"][prev]  # W_e[x_{k-1}]
    u = torch.cat([e, h @ w["W_h"], (g @ w["W_g"]).expand_as(e)], dim=-1) @ w["W_in"]  # (i)
    n = w["L"].shape[0]
    L = w["L"] * torch.tril(torch.ones(n, n))[:, :, None]
    m = torch.einsum("kjr,bjr->bkr", L, u)  # (ii) m_k = sum_{j<=k} L_kj * u_j
    z = m + (torch.nn.functional.silu(m @ w["mlp_gate"]) * (m @ w["mlp_up"])) @ w["mlp_down"]  # (iii)
    return s + z @ w["W_r"]  # (iv) delta_k = W_r z_k, (v) l_k = s_k + delta_k


def test_torch_reference_matches_the_jax_refiner_from_the_exported_file(tmp_path):
    vocab, hidden, n, rank = 50, 24, 7, 8
    head = XPressRefiner(vocab_size=vocab, hidden_size=hidden, num_positions=n, rank=rank, rngs=nnx.Rngs(0))
    # trained-like weights: W_r nonzero, L off the identity
    head.W_r.set_value(5.0 * jax.random.normal(jax.random.key(1), head.W_r.shape))
    head.L.set_value(head.L[...] + 0.2 * jax.random.normal(jax.random.key(2), head.L.shape))
    path = save_head(head, str(tmp_path), "xpress")
    config = json.loads((tmp_path / "heads" / "xpress.config.json").read_text())
    assert config["block_size"] == n + 1 and config["rank"] == rank and config["vocab_size"] == vocab
    weights = {k: v.float() for k, v in load_file(path).items()}
    assert set(weights) == set(config["tensors"])

    rng = np.random.default_rng(0)
    s = rng.normal(size=(3, n, vocab)).astype(np.float32)
    h = rng.normal(size=(3, n, hidden)).astype(np.float32)
    prev = rng.integers(0, vocab, (3, n)).astype(np.int64)
    ours = np.asarray(head(jnp.asarray(s), jnp.asarray(h), jnp.asarray(prev, jnp.int32)))
    ref = torch_xpress_logits(weights, torch.tensor(s), torch.tensor(h), torch.tensor(prev)).numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
    # the folded inference form reads the same file to the same logits
    folded = head.fold()
    c = folded.block_constant(jnp.asarray(h))
    np.testing.assert_allclose(np.asarray(folded.logits(jnp.asarray(s), c, jnp.asarray(prev, jnp.int32))), ref,
                               atol=1e-4, rtol=1e-4)
    assert np.abs(ref - s).max() > 0.1  # the refiner really changes the logits


# ---- python -m xpress_jax.export ----

@pytest.fixture(scope="module")
def drafter_run(tmp_path_factory):
    """A 4-step drafter + XPress run with checkpoints at steps 2 and 4."""
    from train_helpers import train_config
    from xpress_jax.train.run import train
    out = tmp_path_factory.mktemp("run")
    train(train_config(out, **{"train.steps": "4", "train.save_every": "2", "train.async_checkpointing": "false",
                               "train.keep": "5"}))
    return out


def test_export_any_step_loads_in_the_official_dflash_package(drafter_run, tmp_path):
    from dflash import model as dflash_model
    from cli_helpers import invoke, last_json, run
    from xpress_jax.checkpoints.safetensors_io import SafetensorsFile
    r = run("xpress_jax.export", f"--run={drafter_run}", "--step=2", f"--out={tmp_path / 'step2'}", "--dtype=float32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_json(r.stdout) == {"step": 2, "drafter": str(tmp_path / "step2"), "heads": ["xpress"]}
    latest = invoke("xpress_jax.export", f"--run={drafter_run}", f"--out={tmp_path / 'latest'}", "--dtype=float32")
    assert latest.returncode == 0 and last_json(latest.stdout)["step"] == 4
    config = json.loads((tmp_path / "step2" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 6
    assert set(config["dflash_config"]) >= {"target_layer_ids", "mask_token_id"}
    model = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path / "step2"))
    assert model.block_size == 6
    a = SafetensorsFile(str(tmp_path / "step2" / "model.safetensors"))
    b = SafetensorsFile(str(tmp_path / "latest" / "model.safetensors"))
    assert any(not np.array_equal(a.get(k), b.get(k)) for k in a.keys())  # two different steps
    # the end-of-run export is the same code: the latest step exported again equals it byte for byte
    end = SafetensorsFile(str(drafter_run / "export" / "heads" / "xpress.safetensors"))
    again = SafetensorsFile(str(tmp_path / "latest" / "heads" / "xpress.safetensors"))
    for k in end.keys():
        np.testing.assert_array_equal(end.get(k), again.get(k))
    assert (tmp_path / "latest" / "heads" / "xpress.config.json").is_file()


def test_export_errors_are_one_line(drafter_run, tmp_path):
    from cli_helpers import invoke
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "a_file").write_text("x")
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    (empty_run / "config.json").write_text((drafter_run / "config.json").read_text())
    cases = [
        ([f"--run={tmp_path / 'nope'}", f"--out={tmp_path / 'o1'}"], "no such directory"),
        ([f"--run={tmp_path / 'full'}", f"--out={tmp_path / 'o2'}"], "not a run directory"),
        ([f"--run={drafter_run}", "--step=3", f"--out={tmp_path / 'o3'}"], "no checkpoint at step 3; steps there: [1, 2, 4]"),
        ([f"--run={drafter_run}", f"--out={tmp_path / 'full'}"], "exists and is not empty"),
        ([f"--run={drafter_run}", f"--out={tmp_path / 'a_file' / 'sub'}"], "is not writable"),
        ([f"--run={empty_run}", f"--out={tmp_path / 'o4'}"], "no checkpoint in"),
        ([f"--run={drafter_run}", f"--out={tmp_path / 'o5'}", "--target"], "target was random"),
    ]
    for args, message in cases:
        r = invoke("xpress_jax.export", *args)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-1500:])
    ok = invoke("xpress_jax.export", f"--run={drafter_run}", f"--out={tmp_path / 'full'}", "--overwrite")
    assert ok.returncode == 0, ok.stderr[-1500:]
