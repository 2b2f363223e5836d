"""The registry of methods is where heads and decoders are listed: everything that builds,
trains, decodes or saves a head reads it, so a new head is one entry (checked here by
registering a head that exists only in this file, and a copy of the Markov head under a new
name, and using them end to end)."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from head_fixtures import SHAPE, SIZES, inputs
from train_helpers import train_config
from xpress_jax import methods
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.errors import InputError
from xpress_jax.models.heads.baselines import choose
from xpress_jax.train.state import merge


def test_every_decoder_names_a_registered_head_and_real_knobs():
    fields = {f.name for f in dataclasses.fields(DecodeSettings)}
    for name, spec in methods.DECODERS.items():
        assert spec.head is None or spec.head in methods.HEADS, name
        assert set(spec.knobs) <= fields, name
        assert DecodeSettings(max_iters=7, top_k=3, branches=2).for_decoder(name) == dataclasses.replace(
            DecodeSettings(), **{k: getattr(DecodeSettings(max_iters=7, top_k=3, branches=2), k) for k in spec.knobs})
    assert methods.decoders_reading("branches") == ("dloop", "dloop+xpress")
    assert methods.decoders_reading("top_k") == ("xpress", "dloop+xpress")
    assert "target" not in methods.spec_decoders() and set(methods.spec_decoders()) < set(methods.DECODERS)


class EchoHead(nnx.Module):
    """A head that exists only in this file: delta_k = silu(embed(x_{k-1}) W_down) W_up, with its
    own size (`heads.echo_rank`) and its own loss term (`train.loss.echo`)."""

    def __init__(self, *, vocab_size, hidden_size, echo_rank, rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        self.down = nnx.Param(0.02 * jax.random.normal(rngs.params(), (hidden_size, echo_rank), param_dtype))
        self.up = nnx.Param(0.02 * jax.random.normal(rngs.params(), (echo_rank, vocab_size), param_dtype))

    def __call__(self, s, h, prev_tokens, embed):
        e = embed(prev_tokens).astype(jnp.float32)  # [batch, n, hidden]
        return s.astype(jnp.float32) + jax.nn.silu(e @ self.down[...]) @ self.up[...]

    def decode_serial(self, s, h, anchor, embed, noise=None, temperature=1.0):
        def step(prev, inputs):
            s_k, g_k = inputs
            l_k = self(s_k[:, None], None, prev[:, None], embed)[:, 0]  # [batch, vocab]
            tok = choose(l_k, g_k, temperature)
            return tok, (tok, l_k)
        noise = None if noise is None else jnp.moveaxis(noise, 1, 0)
        _, (tokens, logits) = jax.lax.scan(step, anchor.astype(jnp.int32), (jnp.moveaxis(s, 1, 0), noise))
        return jnp.moveaxis(tokens, 0, 1), jnp.moveaxis(logits, 0, 1)


ECHO = methods.HeadSpec(
    EchoHead, {"echo_rank": 4},
    lambda sizes, d: {"vocab_size": d.vocab_size, "hidden_size": d.hidden_size, "echo_rank": sizes["echo_rank"]},
    methods.SERIAL, "l_k = s_k + silu(embed(x_{k-1}) down) up", loss_weights={"echo": 1.0},
    dims=lambda t: {"echo_rank": t["down"][1]})


@pytest.fixture
def echo_registered():
    methods.register_head("echo", ECHO)
    yield
    del methods.HEADS["echo"], methods.DECODERS["echo"]


def test_a_head_registered_in_a_test_file_trains_exports_and_evaluates(tmp_path, echo_registered):
    """One `register_head` call and nothing else: the config gains heads.echo_rank and
    train.loss.echo, a train step changes the head's weights and logs its loss, the export
    writes heads/echo.*, and eval decodes through it losslessly."""
    from xpress_jax.eval.evaluate import evaluate, parse_methods
    from xpress_jax.eval.settings import EvalSettings
    from xpress_jax.models.build import build_trainable, target_config
    from xpress_jax.train.run import train

    config = train_config(tmp_path / "run", **{"train.heads": "('echo',)", "train.trainable": "heads",
                                                 "train.steps": "2", "heads.echo_rank": "6"})
    assert config.train.loss.echo == 1.0
    before = build_trainable(config, target_config(config)).echo
    result = train(config)
    after = nnx.state(merge(result["setup"].graphdef, jax.device_get(result["state"]["params"])).echo, nnx.Param)
    moved = [float(np.abs(np.asarray(after[k][...]) - np.asarray(before_v[...])).max())
             for k, before_v in nnx.state(before, nnx.Param).items()]
    assert all(m > 0 for m in moved), moved  # every tensor of the head received gradient
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["loss/echo"]) and r["loss/echo"] > 0 for r in logged) and len(logged) == 2

    export = tmp_path / "run" / "export"
    recorded = json.loads((export / "heads" / "echo.config.json").read_text())
    assert recorded["echo_rank"] == 6 and recorded["head"] == "echo" and (export / "heads" / "echo.safetensors").is_file()

    math500 = os.path.join(os.path.dirname(__file__), "data", "benchmarks", "math500")  # its published schema
    s = dataclasses.replace(EvalSettings.from_config(config.eval), datasets=(f"math500={math500}",), num_prompts=2,
                            max_new_tokens=6, out_dir=str(tmp_path / "eval"), time_split=False, iteration_sweep=(),
                            lossless_reference="target_only")
    report, failures = evaluate(config, parse_methods(None, ["echo"], str(export)), s, check_lossless=True)
    row = report["results"]["math500"]["echo"]
    assert failures == 0 and row["lossless"] is True and row["tau"] >= 1.0 and row["new_tokens"] == 12


def test_a_head_spec_must_declare_the_terms_its_loss_returns(echo_registered):
    spec = dataclasses.replace(ECHO, loss=lambda head, b: {"echo": (1.0, 1.0), "echo_extra": (1.0, 1.0)})
    with pytest.raises(ValueError, match=r"terms \['echo_extra'\] that its HeadSpec.loss_weights does not declare"):
        spec.loss_terms(None, None)
    with pytest.raises(ValueError, match="size defaults"):
        methods.register_head("echo_wide", dataclasses.replace(ECHO, sizes={"echo_rank": 8}))
    with pytest.raises(ValueError, match="already registered"):
        methods.register_head("echo", ECHO)


def test_a_new_head_is_one_registry_entry(tmp_path, monkeypatch):
    """'markov2' (the Markov head under another name) is built, decoded serially, saved in its
    file layout and loaded, and refused knobs it would ignore, with no other change."""
    from xpress_jax.models.build import build_head, new_head
    from xpress_jax.checkpoints.heads import load_head, save_head
    from xpress_jax.decoding.refine import refine_block

    monkeypatch.setitem(methods.HEADS, "markov2", methods.HEADS["markov"])
    monkeypatch.setitem(methods.DECODERS, "markov2", methods.DecoderSpec(head="markov2"))

    config = train_config(tmp_path)
    spec = methods.HEADS["markov2"]
    head = spec.module(rngs=nnx.Rngs(0), **spec.kwargs(SIZES, SHAPE))
    s, h, _, embed = inputs(1)
    anchor = jnp.array([1, 2, 3])
    got = refine_block("markov2", head, s, h, anchor, embed)
    expect, _ = head.decode_serial(s, h, anchor, embed)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expect))

    path = save_head(head, str(tmp_path / "ckpt"), "markov2")
    assert path.endswith("heads/markov2.safetensors")
    recorded = json.loads((tmp_path / "ckpt" / "heads" / "markov2.config.json").read_text())
    assert "markov_head.markov_w1.weight" in recorded["tensors"] and recorded["rank"] == SIZES["rank"]
    loaded = load_head(nnx.eval_shape(lambda: head), str(tmp_path / "ckpt"), "markov2")
    np.testing.assert_array_equal(np.asarray(loaded.markov_w1.get_value()), np.asarray(head.markov_w1.get_value()))

    assert type(build_head("markov2", config, SHAPE)) is type(new_head("markov", config, SHAPE))
    with pytest.raises(InputError, match="max_iters=2 would be ignored by decoder 'markov2'"):
        DecodeSettings(max_iters=2).check("markov2", block=4)
