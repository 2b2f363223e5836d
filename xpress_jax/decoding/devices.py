"""Decoding over several local devices, two ways.

- The batch split (`generate(devices=N)`): each device runs the whole jitted loop on its share of
  the prompts (`shard_map` over a one-axis mesh, the weights replicated), with no collective
  inside the loop, and each device's loop ends when its own rows are done. This is how
  `xpress_jax.generate` uses every GPU of a host.
- The tensor split (`tensor_mesh`, `place_on_tensor_mesh`): a target too large for one device
  has its heads, MLP width and vocabulary split over a (1, 1, N) mesh by the training rules, its
  KV cache split with its KV heads; the drafter and heads are replicated. `generate` sees the
  target's mesh and pins the activations to it. Megatron-style: two all-reduces of the hidden
  state per layer.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from xpress_jax import sharding
from xpress_jax.errors import ConfigError, InputError

AXIS = "batch"


def batch_mesh(devices: int) -> Mesh | None:
    """A mesh over this process's first `devices` devices (None for one: the plain program)."""
    local = jax.local_devices()
    if not 1 <= devices <= len(local):
        raise InputError(f"devices={devices}: this process has {len(local)} device(s) "
                         f"({local[0].platform}); choose 1..{len(local)}")
    return None if devices == 1 else Mesh(np.array(local[:devices]), (AXIS,))


def replicate(tree, mesh: Mesh):
    """`tree` on every device of `mesh` (no copy when it is already there)."""
    return jax.device_put(tree, NamedSharding(mesh, P()))


# `loop` is the decode loop (`speculative._decode_loop`): (graphdef, state, prompt, prompt_lens,
# stop_ids, key, temperature, max_new, max_iters, opts) -> outputs with a leading batch axis.
STATIC = ("loop", "graphdef", "opts", "mesh")


@functools.partial(jax.jit, static_argnames=STATIC)
def decode_batch_split(loop, graphdef, state, prompt, prompt_lens, stop_ids, key, temperature, max_new, max_iters,
                       opts, mesh: Mesh):
    """The loop run per device of `mesh` on its rows of the batch, each device drawing from its own key."""
    def local(state, prompt, prompt_lens, stop_ids, key, temperature, max_new, max_iters):
        key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))
        return loop(graphdef, state, prompt, prompt_lens, stop_ids, key, temperature, max_new, max_iters, opts)
    split = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P(), P(), P(), P(), P()),
                          out_specs=P(AXIS), check_vma=False)  # the loop's trip count differs per device by design
    return split(state, prompt, prompt_lens, stop_ids, key, temperature, max_new, max_iters)


@functools.partial(jax.jit, static_argnames=STATIC)
def decode_tensor_split(loop, graphdef, state, prompt, prompt_lens, stop_ids, key, temperature, max_new, max_iters,
                        opts, mesh: Mesh):
    """The loop for a target split over `mesh` (`place_on_tensor_mesh`), its activations pinned there."""
    with sharding.activations_on(mesh):
        return loop(graphdef, state, prompt, prompt_lens, stop_ids, key, temperature, max_new, max_iters, opts)


def tensor_mesh(devices: int, cfg, pool=None) -> Mesh | None:
    """A (1, 1, N) mesh over the first `devices` devices of `pool` (this process's by default) for a
    target of config `cfg` (None for 1), refused in one line when the devices do not exist or do not
    divide its heads, vocabulary or MLP width. Nothing is built, so a bad count costs nothing."""
    if devices == 1:
        return None
    local = list(pool) if pool is not None else jax.local_devices()
    if not 1 <= devices <= len(local):
        raise ConfigError(f"a target split over {devices} devices: this process has {len(local)}")
    mesh = sharding.make_mesh((1, 1, devices), local[:devices])
    sharding.refuse_uneven_splits(mesh, {"num_attention_heads": ("heads", cfg.num_attention_heads),
                                         "vocab_size": ("vocab", cfg.vocab_size),
                                         "intermediate_size": ("mlp", cfg.intermediate_size)})
    return mesh


def place_on_tensor_mesh(models, mesh: Mesh) -> None:
    """Splits `models.target` (a DecodingModels) over `mesh` by its parameters' logical axes and
    replicates the drafter and head there (a no-op for what is already placed so)."""
    for path, var in nnx.to_flat_state(nnx.state(models, nnx.Param)):
        axes = var.get_metadata().get("axes", ()) if path[0] == "target" else ()
        var.set_value(jax.device_put(var.get_value(), sharding.named_sharding(
            axes or (None,) * var.get_value().ndim, var.shape, mesh)))


def target_mesh(models) -> Mesh | None:
    """The mesh the target's weights are split over (`place_on_tensor_mesh`), or None."""
    placed = getattr(models.target.embed_tokens[...], "sharding", None)  # replicated for the batch split
    if isinstance(placed, NamedSharding) and placed.mesh.shape.get("tensor", 1) > 1:
        return placed.mesh
    return None
