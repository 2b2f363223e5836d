"""Device mesh and logical-axis sharding rules (MaxText style).

Parameters carry logical axis names (`axes` metadata); rules map each to mesh axes. A dimension
that a mesh axis does not divide stays replicated rather than failing.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from typing import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xpress_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes it may be split over, in order of preference
DEFAULT_RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    # a KV cache's leading [kv_heads * batch] axis (`qwen3.KVCache.ORDER`, heads first): split as
    # kv_heads, as the queries are (tests/test_sharding.py checks the two rules agree)
    "kv_rows": ("tensor",),
    "mlp": ("tensor",),
    "head_dim": (),
    "features": ("tensor",),
    "rank": (),
    "block": (),
    "layers": (),
}


@contextlib.contextmanager
def subset_meshes_expected() -> Iterator[None]:
    """Within this block a mesh over some of the devices is no warning (dry runs and scaling
    tables build them on purpose)."""
    log = logging.getLogger(__name__)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def make_mesh(shape: Sequence[int], devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh; -1 in one place takes the remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ConfigError(f"mesh.shape={tuple(shape)}: at most one -1")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if len(devices) % rest:
            raise ConfigError(f"mesh.shape={tuple(shape)}: {len(devices)} devices are not a multiple of {rest}")
        shape[shape.index(-1)] = len(devices) // rest
    if math.prod(shape) > len(devices) or len(devices) % math.prod(shape):
        raise ConfigError(f"mesh.shape={tuple(shape)} needs {math.prod(shape)} devices, have {len(devices)}")
    if math.prod(shape) < len(devices):
        logging.getLogger(__name__).warning("mesh %s uses %d of %d devices", tuple(shape), math.prod(shape), len(devices))
    return Mesh(np.asarray(devices[:math.prod(shape)]).reshape(shape), MESH_AXES)


def refuse_uneven_splits(mesh: Mesh, sizes: dict[str, tuple[str, int]]) -> None:
    """A ConfigError naming the first config field that the mesh axes of its logical axis do not
    divide. `logical_to_spec` would leave such a dimension whole on every device, and the work
    meant to be split would be repeated. sizes: config field -> (logical axis, size). KV heads are
    not checked: fewer KV heads than tensor devices are replicated, as GQA models usually are."""
    for field, (logical, size) in sizes.items():
        axes = [a for a in DEFAULT_RULES[logical] if mesh.shape[a] > 1]
        split = math.prod(mesh.shape[a] for a in axes)
        if size % split:
            over = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
            raise ConfigError(f"mesh.shape={tuple(mesh.shape.values())}: {field}={size} does not split over "
                              f"{over} ({split} devices); choose a mesh whose {'/'.join(axes)} axes divide it")


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: dict[str, tuple[str, ...]] | None = None) -> PartitionSpec:
    rules = DEFAULT_RULES if rules is None else rules
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        if name is not None and name not in rules:
            raise ValueError(f"no sharding rule for logical axis {name!r}")
        chosen = []
        size = 1
        for mesh_axis in rules.get(name, ()) if name else ():
            n = mesh.shape[mesh_axis]
            if mesh_axis in used or n == 1 or dim % (size * n):
                continue
            chosen.append(mesh_axis)
            size *= n
        used.update(chosen)
        spec.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
    return PartitionSpec(*spec)


def named_sharding(axes, shape, mesh: Mesh | None, rules=None):
    if mesh is None:  # this process's first device: jax.devices()[0] belongs to process 0 alone
        return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


# The mesh that activations are laid out on while a step is traced (None: no constraint). A
# context variable, so the model code names logical axes and never needs the mesh passed in.
_ACTIVATION_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("activation_mesh", default=None)


@contextlib.contextmanager
def activations_on(mesh: Mesh | None) -> Iterator[None]:
    """Within this block (while a function is traced), `constrain` pins activations to `mesh`."""
    token = _ACTIVATION_MESH.set(mesh)
    try:
        yield
    finally:
        _ACTIVATION_MESH.reset(token)


def activation_mesh() -> Mesh | None:
    """The mesh of `activations_on` while a step is traced (None outside it)."""
    return _ACTIVATION_MESH.get()


def with_activations_on(mesh: Mesh, fn):
    """fn, traced with its activations pinned to `mesh` (what jit-compiled steps wrap)."""
    def traced(*args, **kwargs):
        with activations_on(mesh):
            return fn(*args, **kwargs)
    return traced


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Pins activation x to its logical axes by the same rules as the parameters, so the batch is
    split over (data, fsdp) at every layer boundary instead of whatever XLA propagates from the
    weights' layout (fsdp-sharded weights would otherwise carry a hidden split through the network
    and every device would compute the whole batch). A no-op outside `activations_on` or on one
    device."""
    mesh = _ACTIVATION_MESH.get()
    if mesh is None or mesh.size == 1:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh)))
