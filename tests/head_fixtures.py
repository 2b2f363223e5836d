"""Small randomised heads and their inputs (tests of the heads and of the Jacobi solver)."""

import types

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from xpress_jax.methods import HEADS

V, H, N, R = 60, 12, 9, 8


def randomised(module, seed):
    """Every parameter redrawn from N(0, 1): the zero/identity inits would hide bugs."""
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    for _, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        var.set_value(0.5 * jax.random.normal(next(keys), var.shape))
    return module


SIZES = ml_collections.ConfigDict({"rank": R, "gru_hidden": R, "proj_dim": R})
SHAPE = types.SimpleNamespace(vocab_size=V, hidden_size=H, block_size=N + 1)  # the drafter fields that size a head


def make_head(name, seed=0):
    """Head `name` built through the registry (methods.HEADS), every weight redrawn."""
    return randomised(HEADS[name].module(rngs=nnx.Rngs(seed), **HEADS[name].kwargs(SIZES, SHAPE)), seed)


def inputs(seed, batch=3):
    k = jax.random.split(jax.random.key(100 + seed), 4)
    embed_table = jax.random.normal(k[0], (V, H))
    return (jax.random.normal(k[1], (batch, N, V)), jax.random.normal(k[2], (batch, N, H)),
            jax.random.randint(k[3], (batch, N), 0, V), lambda ids: jnp.take(embed_table, ids, axis=0))
