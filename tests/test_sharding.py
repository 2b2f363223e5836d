"""Loading onto a device mesh (8 fake CPU devices) places each tensor by its logical axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from compiled import jit_call
from xpress_jax import sharding
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3


def test_logical_rules_skip_axes_that_do_not_divide():
    mesh = sharding.make_mesh((2, 2, 2))
    assert sharding.logical_to_spec(("embed", "heads", "head_dim"), (32, 4, 24), mesh) == P("fsdp", "tensor", None)
    assert sharding.logical_to_spec(("vocab", "embed"), (127, 32), mesh) == P(None, "fsdp")
    assert sharding.logical_to_spec(("batch", None), (8, 3), mesh) == P(("data", "fsdp"), None)
    with pytest.raises(ValueError, match="no sharding rule"):
        sharding.logical_to_spec(("nonsense",), (4,), mesh)


def test_make_mesh_shapes():
    assert sharding.make_mesh((-1, 1, 2)).shape == {"data": 4, "fsdp": 1, "tensor": 2}
    with pytest.raises(ValueError, match="needs 16 devices"):
        sharding.make_mesh((4, 2, 2))
    assert sharding.make_mesh((1, 1, 1)).devices.size == 1  # a subset, for single-device references


def test_sharded_load_gives_the_same_logits(tiny_dirs):
    assert jax.device_count() == 8
    mesh = sharding.make_mesh((2, 2, 2))
    plain = load_qwen3(tiny_dirs["untied_gqa4"])
    sharded = load_qwen3(tiny_dirs["untied_gqa4"], mesh=mesh)
    q = sharded.layers[0].self_attn.q_proj[...]
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert len({s.device for s in q.addressable_shards}) == 8
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 6)))
    np.testing.assert_allclose(np.asarray(jit_call(sharded, tokens).logits), np.asarray(jit_call(plain, tokens).logits),
                               atol=1e-5)


def _target_forward(devices: int, *, constrained: bool, batch: int = 8):
    """The target's forward and logsumexp, bf16, compiled on a (1, devices, 1) mesh with the
    parameters placed by their logical axes: (per-device temporary bytes, per-device flops, the
    compiled program, and its value on a batch of ids)."""
    from flax import nnx
    from xpress_jax.models.qwen3 import Qwen3, Qwen3Config
    from xpress_jax.train import state as st
    cfg = Qwen3Config(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = Qwen3(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    mesh = sharding.make_mesh((1, devices, 1), devices=jax.devices()[:devices])
    graphdef, params = st.split_params(model)
    shardings = st.param_shardings(st.flat_axes(model), {k: v.shape for k, v in params.items()}, mesh)
    params = {k: jax.device_put(v, shardings[k]) for k, v in params.items()}

    def forward(p, ids):
        return jax.nn.logsumexp(st.merge(graphdef, p)(ids).logits.astype(jnp.float32), -1).sum()

    fn = sharding.with_activations_on(mesh, forward) if constrained else forward
    ids = jax.device_put(np.random.default_rng(0).integers(0, 4096, (batch, 128)).astype(np.int32),
                         sharding.named_sharding(("batch", None), (batch, 128), mesh))
    compiled = jax.jit(fn).lower(params, ids).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return compiled.memory_analysis().temp_size_in_bytes, cost["flops"], compiled, float(compiled(params, ids))


def test_activations_split_over_the_batch_so_memory_and_flops_fall_with_devices():
    """At a fixed global batch, twice the devices hold half the activations and do half the work;
    without the layer-boundary constraints XLA carries the fsdp split of the weights through the
    network and every device computes the whole batch (memory and flops rise with devices)."""
    temp4, flops4, _, value4 = _target_forward(4, constrained=True)
    temp8, flops8, compiled8, value8 = _target_forward(8, constrained=True)
    assert temp8 <= 0.6 * temp4 and flops8 <= 0.6 * flops4
    _, flops1, _, value1 = _target_forward(1, constrained=True)
    assert flops8 * 8 <= 1.3 * flops1  # no device repeats another's work
    assert value8 == pytest.approx(value1, rel=1e-2) and value4 == pytest.approx(value1, rel=1e-2)  # bf16
    hlo = compiled8.as_text()
    logits_reduce = [line for line in hlo.splitlines() if "all-reduce(" in line and ",4096]" in line]
    assert not logits_reduce, logits_reduce[:2]  # no device holds [global batch, T, vocab] logits
    unconstrained_temp8, unconstrained_flops8, _, _ = _target_forward(8, constrained=False)
    assert unconstrained_flops8 > 1.5 * flops8 and unconstrained_temp8 > 4 * temp8  # what the constraints prevent


def test_the_cache_row_rule_splits_whole_kv_heads_in_the_caches_order():
    """The logical rule for the cache's merged rows agrees with the rule of the factor its order
    puts first, and placing a cache by KVCache.AXES on a tensor split gives each device the rows of
    whole KV heads (every sequence of them); the same rule over batch-first rows would mix heads."""
    from xpress_jax.models.layers import BATCH_MAJOR, HEADS_MAJOR
    from xpress_jax.models.qwen3 import KVCache
    for order in (BATCH_MAJOR, HEADS_MAJOR):
        assert sharding.DEFAULT_RULES[order.axis] == sharding.DEFAULT_RULES[order.major], order
    assert KVCache.AXES[0] == KVCache.ORDER.axis
    mesh = sharding.make_mesh((1, 1, 4), jax.devices()[:4])
    batch, kv_heads, slots, head_dim = 3, 4, 5, 2
    x = jnp.broadcast_to(jnp.arange(kv_heads, dtype=jnp.float32)[None, None, :, None],
                         (batch, slots, kv_heads, head_dim))  # every value is its KV head's index
    for order, whole_heads in ((KVCache.ORDER, True), (BATCH_MAJOR, False)):
        rows = jax.device_put(order.rows(x), sharding.named_sharding(KVCache.AXES, (batch * kv_heads, slots, head_dim),
                                                                     mesh))
        heads_per_device = [set(np.unique(np.asarray(s.data)).tolist()) for s in rows.addressable_shards]
        assert all(len(h) == 1 for h in heads_per_device) is whole_heads, (order, heads_per_device)
