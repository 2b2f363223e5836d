"""HF directory <-> model: round trips, the key map and its inverse, and each bad input's error."""

import json
import os
import shutil

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

from compiled import jit_call
from xpress_jax.checkpoints import safetensors_io
from xpress_jax.checkpoints.hf_qwen3 import QWEN3_RULES, load_qwen3, qwen3_rules, save_qwen3
from xpress_jax.checkpoints.keymap import KeyRule
from xpress_jax.errors import CheckpointError, ConfigError
from xpress_jax.models.qwen3 import Qwen3Config


def logits_hf(path, tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()


@pytest.mark.parametrize("name", ["tied_gqa1", "untied_gqa4"])
def test_round_trip_port_to_hf_directory(tmp_path, tiny_dirs, qwen3_tokenizer_dir, name):
    model = load_qwen3(tiny_dirs[name])
    out = tmp_path / "export"
    save_qwen3(model, str(out), tokenizer_dir=qwen3_tokenizer_dir, max_shard_bytes=40_000)
    files = sorted(os.listdir(out))
    assert "model.safetensors.index.json" in files and "tokenizer.json" in files
    assert sum(f.startswith("model-") for f in files) > 1  # really sharded
    tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (2, 8))
    ours = np.asarray(jit_call(model, jnp.asarray(tokens)).logits)
    np.testing.assert_allclose(logits_hf(str(out), tokens), ours, atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits_hf(tiny_dirs[name], tokens), ours, atol=1e-4, rtol=0)
    assert transformers.AutoTokenizer.from_pretrained(out)("Hello")["input_ids"] == [9707]


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_saved_tensors_equal_the_originals(tmp_path, tiny_dirs, scan):
    """The key map and its inverse, in either layer layout: per-layer HF tensors in, the same out."""
    src = tiny_dirs["untied_gqa2"]
    model = load_qwen3(src, scan=scan)
    if scan:
        assert model.layers.self_attn.q_proj.shape[0] == model.cfg.num_hidden_layers  # one stacked array
    save_qwen3(model, str(tmp_path))
    a, b = safetensors_io.SafetensorsDir(src), safetensors_io.SafetensorsDir(str(tmp_path))
    assert sorted(a.keys()) == sorted(b.keys())
    for key in a.keys():
        np.testing.assert_array_equal(a.get(key), b.get(key))


def test_bfloat16_save_and_load(tmp_path, tiny_dirs):
    model = load_qwen3(tiny_dirs["untied_gqa2"])
    save_qwen3(model, str(tmp_path), dtype=ml_dtypes.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = load_qwen3(str(tmp_path), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    assert reloaded.embed_tokens[...].dtype == jnp.bfloat16
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert hf.model.embed_tokens.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("in_dims, model_shape", [(None, (7,)), (None, (5, 3)), (1, (4, 6)), (1, (4, 2, 3)), (2, (2, 3, 4))])
def test_key_rule_layout_inverse(in_dims, model_shape):
    rule = KeyRule("w", "w", in_dims)
    hf = np.random.default_rng(0).normal(size=rule.hf_shape(model_shape))
    model = rule.to_model(hf, model_shape)
    assert model.shape == model_shape
    np.testing.assert_array_equal(rule.to_hf(model), hf)
    np.testing.assert_array_equal(rule.to_model(rule.to_hf(model), model_shape), model)


@pytest.mark.parametrize("tied", [True, False])
def test_key_map_covers_exactly_the_hf_state_dict(tied):
    hf_cfg = transformers.Qwen3Config(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)
    hf_keys = set(transformers.Qwen3ForCausalLM(hf_cfg).state_dict())
    if tied:
        hf_keys.discard("lm_head.weight")  # shared with the embedding; not saved
    rules = qwen3_rules(Qwen3Config.from_hf(hf_cfg.to_dict()))
    assert {r.hf for r in rules} == hf_keys
    assert len({(r.path, r.layer) for r in rules}) == len(rules)  # the inverse map is a function too
    assert all("{i}" in r.hf or "{i}" not in r.path for r in QWEN3_RULES)


# ---- bad inputs: each a CheckpointError/ConfigError that names the file and the key ----

@pytest.fixture
def copy_of(tmp_path, tiny_dirs):
    def make(name="untied_gqa2", sharded=False):
        dst = tmp_path / "ckpt"
        if sharded:
            dst.mkdir()
            save_qwen3(load_qwen3(tiny_dirs[name]), str(dst), max_shard_bytes=40_000)
        else:
            shutil.copytree(tiny_dirs[name], dst)
        return dst
    return make


def rewrite(path, edit):
    """Rewrites one safetensors file with edit(dict of arrays) applied."""
    f = safetensors_io.SafetensorsFile(str(path))
    tensors = {k: np.array(f.get(k)) for k in f.keys()}
    del f
    edit(tensors)
    safetensors_io.write_file(str(path), tensors.items())


def test_missing_shard(copy_of):
    d = copy_of(sharded=True)
    victim = sorted(p for p in os.listdir(d) if p.startswith("model-"))[1]
    os.remove(d / victim)
    with pytest.raises(CheckpointError, match=f"missing.*{victim}"):
        load_qwen3(str(d))


def test_no_weights_at_all(copy_of):
    d = copy_of()
    os.remove(d / "model.safetensors")
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        load_qwen3(str(d))


def test_missing_key(copy_of):
    d = copy_of()
    rewrite(d / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing keys \['model.layers.1.mlp.up_proj.weight'\]"):
        load_qwen3(str(d))


def test_unexpected_key(copy_of):
    d = copy_of()
    rewrite(d / "model.safetensors", lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": np.zeros(4, np.float32)}))
    with pytest.raises(CheckpointError, match=r"unexpected keys \['model.layers.0.self_attn.q_proj.bias'\].*model.safetensors"):
        load_qwen3(str(d))


def test_shape_mismatch(copy_of):
    d = copy_of()
    key = "model.layers.2.self_attn.k_proj.weight"
    rewrite(d / "model.safetensors", lambda t: t.update({key: t[key][:-1]}))
    with pytest.raises(CheckpointError, match=rf"model.safetensors: '{key}' has shape \(47, 32\), the model expects \(48, 32\)"):
        load_qwen3(str(d))


def test_dtype_mismatch(copy_of):
    d = copy_of()
    key = "model.norm.weight"
    rewrite(d / "model.safetensors", lambda t: t.update({key: t[key].astype(np.int32)}))
    with pytest.raises(CheckpointError, match=rf"'{key}' has dtype I32, expected a float dtype"):
        load_qwen3(str(d))


def test_truncated_file(copy_of):
    d = copy_of()
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="past the end of the file"):
        load_qwen3(str(d))


def test_config_that_is_not_qwen3(copy_of):
    d = copy_of()
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="config.json: model_type is 'llama'"):
        load_qwen3(str(d))


def test_index_pointing_at_wrong_shard(copy_of):
    d = copy_of(sharded=True)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    key = next(k for k, v in index["weight_map"].items() if v == shards[0])
    index["weight_map"][key] = shards[1]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"maps '{key}' to {shards[1]}, which does not hold it"):
        load_qwen3(str(d))


def test_writer_output_reads_in_official_safetensors(tmp_path):
    from safetensors.numpy import load_file
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones((5,), np.float16)}
    safetensors_io.write_file(str(tmp_path / "x.safetensors"), arrays.items())
    back = load_file(str(tmp_path / "x.safetensors"))
    for k in arrays:
        np.testing.assert_array_equal(back[k], arrays[k])
    assert not os.path.exists(tmp_path / "x.safetensors.tmp")


def test_head_checkpoint_round_trip(tmp_path):
    from flax import nnx

    from xpress_jax.checkpoints.heads import load_head, save_head
    from xpress_jax.models.heads import MarkovHead, XPressRefiner
    head = MarkovHead(vocab_size=20, rank=4, rngs=nnx.Rngs(0))
    path = save_head(head, str(tmp_path), "markov")
    from xpress_jax.checkpoints.safetensors_io import SafetensorsFile
    assert sorted(SafetensorsFile(path).keys()) == ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight"]
    back = load_head(nnx.eval_shape(lambda: MarkovHead(vocab_size=20, rank=4, rngs=nnx.Rngs(1))), str(tmp_path), "markov")
    np.testing.assert_array_equal(np.asarray(back.markov_w1[...]), np.asarray(head.markov_w1[...]))
    with pytest.raises(CheckpointError, match="no xpress head"):
        load_head(nnx.eval_shape(lambda: XPressRefiner(vocab_size=20, hidden_size=8, num_positions=3, rank=4,
                                                       rngs=nnx.Rngs(0))), str(tmp_path), "xpress")
