"""Decoding one batch over several local devices. Each device runs the whole jitted loop on its
share of the prompts (`shard_map` over a one-axis mesh, the weights replicated): no collective
inside the loop, and each device's loop ends when its own rows are done. This is how
`xpress_jax.generate` uses every GPU of a host; a model too large for one device needs the
training mesh's tensor split instead."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from xpress_jax.errors import InputError

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


def split_batch(mesh: Mesh, decode: Callable) -> Callable:
    """decode(state, prompt, prompt_lens, stop_ids, key, temperature) -> outputs with a leading
    batch axis, run per device on its rows. Each device draws from its own key."""
    def local(state, prompt, prompt_lens, stop_ids, key, temperature):
        key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))
        return decode(state, prompt, prompt_lens, stop_ids, key, temperature)
    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P(), P(), P()), out_specs=P(AXIS),
                         check_vma=False)  # the loop's trip count differs per device by design
