"""A model's call in a test as one compiled program.

Called eagerly, a tiny model's forward compiles each of its ~60 operations as a program of its
own the first time it meets their shapes (about a second on this CPU); `jit_call` compiles the
whole call once. Arrays (jax or numpy) are traced; every other leaf of the arguments (ints,
tuples of layer ids, flags) is static, as the model's own code treats it.
"""

import functools

import jax
import numpy as np
from flax import nnx


def jit_call(module, *args, method: str = "__call__", **kwargs):
    """`getattr(module, method)(*args, **kwargs)` under `nnx.jit`."""
    leaves, treedef = jax.tree.flatten((args, kwargs))
    is_array = [isinstance(x, (jax.Array, np.ndarray)) for x in leaves]
    static = tuple((i, x) for i, (x, a) in enumerate(zip(leaves, is_array)) if not a)
    arrays = [x for x, a in zip(leaves, is_array) if a]
    return _call(module, arrays, treedef, static, method)


@functools.partial(nnx.jit, static_argnums=(2, 3, 4))
def _call(module, arrays, treedef, static, method):
    fixed, traced = dict(static), iter(arrays)
    leaves = [fixed[i] if i in fixed else next(traced) for i in range(treedef.num_leaves)]
    args, kwargs = jax.tree.unflatten(treedef, leaves)
    return getattr(module, method)(*args, **kwargs)
