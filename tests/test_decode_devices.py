"""A batch split over local devices (decoding/devices.py): the same tokens as one device, an
eighth of the work on each of eight, and no collective in the compiled loop."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compiled import jit_call
from spec_fixtures import random_models
from xpress_jax.decoding.devices import batch_mesh, decode_batch_split, replicate
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodeOptions, _decode, _decode_loop, generate
from xpress_jax.errors import InputError


def test_eight_devices_decode_the_same_tokens_as_one():
    models = random_models("xpress")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 47, rng.integers(3, 12)).tolist() for _ in range(11)]  # 11: rows are padded to 16
    one = generate(models, prompts, decoder="xpress", max_new_tokens=24, stop_ids=(5,))
    split = generate(models, prompts, decoder="xpress", max_new_tokens=24, stop_ids=(5,), devices=8)
    assert split.tokens == one.tokens and split.stopped == one.stopped
    for k, v in one.stats.items():
        np.testing.assert_array_equal(split.stats[k], v, err_msg=k)
    assert len({len(t) for t in one.tokens}) > 2 and any(one.stopped)  # rows that end at different steps


def test_each_of_eight_devices_does_an_eighth_of_the_work_with_no_collective():
    models = random_models("xpress")
    graphdef, state = nnx.split(models)
    opts = DecodeOptions(decoder="xpress", max_len=64, settings=DecodeSettings())
    ids, lengths = jnp.zeros((16, 16), jnp.int32), jnp.full((16,), 8, jnp.int32)
    rest = (jnp.asarray([5], jnp.int32), jax.random.key(0), jnp.float32(1.0), jnp.int32(24), jnp.int32(4))
    mesh = batch_mesh(8)
    one = _decode.lower(graphdef, state, ids, lengths, *rest, opts).compile()
    split = decode_batch_split.lower(_decode_loop, graphdef, replicate(state, mesh), ids, lengths, *rest, opts,
                                     mesh).compile()

    def flops(compiled):
        cost = compiled.cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    assert flops(split) / flops(one) < 1.25 / 8, (flops(split), flops(one))
    temps = split.memory_analysis().temp_size_in_bytes / one.memory_analysis().temp_size_in_bytes
    assert temps < 0.2, temps  # the KV cache and the loop's buffers hold each device's rows only
    assert not re.findall(r"all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter", split.as_text())


def test_more_devices_than_this_process_has_are_refused():
    with pytest.raises(InputError, match=r"devices=9: this process has 8 device"):
        generate(random_models("dflash"), [[1, 2, 3]], max_new_tokens=4, devices=9)


def split_target_models(seed=0):
    """A target with 8 heads, 4 KV heads, vocabulary 256 (all divisible by 4), a drafter and an
    XPress head, with peaked random weights."""
    from spec_fixtures import make_head, redraw
    from xpress_jax.decoding.speculative import DecodingModels
    from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig
    from xpress_jax.models.qwen3 import Qwen3, Qwen3Config
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=16, rope_theta=10_000.0)
    dcfg = DrafterConfig.from_target(cfg, num_layers=1, block_size=4, mask_token_id=255)
    return DecodingModels(redraw(Qwen3(cfg, rngs=nnx.Rngs(seed)), seed),
                      redraw(DFlashDrafter(dcfg, rngs=nnx.Rngs(seed + 1)), seed + 1), make_head("xpress", dcfg, seed + 2))


def collectives(hlo: str) -> dict[str, list[int]]:
    """Each collective's result sizes (elements) in an HLO text."""
    found: dict[str, list[int]] = {}
    for dtype_dims, op in re.findall(r"= \w+\[([\d,]*)\][^ ]* (all-gather|all-reduce|all-to-all|collective-permute)\(",
                                     hlo):
        found.setdefault(op, []).append(int(np.prod([int(d) for d in dtype_dims.split(",") if d])))
    return found


def test_a_target_split_over_four_devices_decodes_the_same_tokens_with_a_quarter_of_the_work():
    from xpress_jax.decoding.devices import decode_tensor_split, place_on_tensor_mesh, target_mesh, tensor_mesh
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 255, rng.integers(4, 12)).tolist() for _ in range(3)]
    one, split = split_target_models(), split_target_models()
    mesh = tensor_mesh(4, split.target.cfg)
    place_on_tensor_mesh(split, mesh)
    assert target_mesh(split) == mesh and split.target.lm_head[...].sharding.spec == jax.sharding.PartitionSpec(
        None, "tensor")
    for decoder in ("target", "xpress"):
        for batch in ([prompts[0]], prompts):
            a = generate(one, batch, decoder=decoder, max_new_tokens=20)
            b = generate(split, batch, decoder=decoder, max_new_tokens=20)
            assert a.tokens == b.tokens, (decoder, len(batch))
    with pytest.raises(InputError, match="devices=2 splits the batch, but the target is split over 4 devices"):
        generate(split, prompts, devices=2)

    # target-only decoding at batch 1 and 4: each device computes a quarter and holds a quarter of
    # the weights and of the cache (its rows are head-major, so split by KV head at any batch); the
    # only collectives are the hidden state's all-reduces and the vocabulary-split argmax's few values
    opts = DecodeOptions(decoder="target", max_len=64, settings=DecodeSettings())
    cost = lambda c: (c.cost_analysis()[0] if isinstance(c.cost_analysis(), list) else c.cost_analysis())["flops"]  # noqa: E731
    for batch in (1, 4):
        ids, lengths = jnp.zeros((batch, 16), jnp.int32), jnp.full((batch,), 8, jnp.int32)
        rest = (jnp.asarray([5], jnp.int32), jax.random.key(0), jnp.float32(1.0), jnp.int32(16), jnp.int32(4))
        whole = _decode.lower(*nnx.split(one), ids, lengths, *rest, opts).compile()
        parts = decode_tensor_split.lower(_decode_loop, *nnx.split(split), ids, lengths, *rest, opts, mesh).compile()
        ratio = {k: getattr(parts.memory_analysis(), k) / getattr(whole.memory_analysis(), k)
                 for k in ("argument_size_in_bytes", "temp_size_in_bytes")}
        assert ratio["argument_size_in_bytes"] < 0.35 and ratio["temp_size_in_bytes"] < 0.4, (batch, ratio)
        assert cost(parts) / cost(whole) < 0.3, (batch, cost(parts), cost(whole))
        found = collectives(parts.as_text())
        assert set(found) <= {"all-reduce", "all-gather"} and found.get("all-reduce"), (batch, found)
        assert max(found.get("all-gather", [0])) < 64, (batch, found)  # under one hidden state: the argmax's values


def test_a_tensor_split_target_loads_shard_by_shard(tmp_path, monkeypatch):
    """eval.tensor_parallel=8 on 8 simulated devices: the target's weights go from the safetensors
    straight to their shards. After every tensor placed, no device holds more than an eighth of
    the target plus the norms' scales it keeps whole (measured from the live arrays' shards), and
    the split target's logits are the whole one's."""
    import weakref

    import jax
    import jax.numpy as jnp
    from conftest import make_hf_qwen3
    from xpress_jax.cli import DEFAULT_CONFIG, with_overrides
    from xpress_jax.eval.evaluate import build_methods
    from xpress_jax.models.build import build_target
    hf_dir = make_hf_qwen3(str(tmp_path / "t"), vocab_size=512, num_layers=4, hidden_size=64,
                           num_attention_heads=8, num_key_value_heads=8, head_dim=16)
    config = with_overrides(DEFAULT_CONFIG, **{"target.hf_dir": hf_dir})

    views = {}  # id -> weak reference: the shards' own arrays, which this count makes, not counted again

    def per_device() -> dict:
        held = {}
        for a in jax.live_arrays():
            if (seen := views.get(id(a))) is not None and seen() is a:
                continue
            for shard in a.addressable_shards:
                data = shard.data
                views[id(data)] = weakref.ref(data)
                held[shard.device] = held.get(shard.device, 0) + data.nbytes
        return held

    before, peak = per_device(), {}
    place = jax.make_array_from_callback

    def placed(*args, **kwargs):
        out = place(*args, **kwargs)
        for device, held in per_device().items():
            peak[device] = max(peak.get(device, 0), held - before.get(device, 0))
        return out

    monkeypatch.setattr(jax, "make_array_from_callback", placed)
    target, _ = build_methods(config, [], "float32", tensor_parallel=8)
    monkeypatch.undo()
    params = jax.tree.leaves(nnx.state(target, nnx.Param))
    total = sum(p.nbytes for p in params)
    # the norms' scales are the only tensors every device holds whole; all else is split 8 ways, and
    # no device holds more at any moment (a replicated lm_head alone would add 7/8 of 128 KiB)
    replicated = sum(p.nbytes for p in params if p.ndim == 1)
    assert len(peak) == 8 and max(peak.values()) <= (total - replicated) / 8 + replicated, (peak, total, replicated)
    whole = build_target(config)
    tokens = jnp.asarray([[1, 2, 3, 4, 5]])
    np.testing.assert_allclose(np.asarray(jit_call(target, tokens).logits), np.asarray(jit_call(whole, tokens).logits),
                               atol=1e-5)
