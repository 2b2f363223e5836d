"""Loading onto a device mesh (8 fake CPU devices) places each tensor by its logical axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

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
    np.testing.assert_allclose(np.asarray(sharded(tokens).logits), np.asarray(plain(tokens).logits), atol=1e-5)
