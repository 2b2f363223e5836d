"""The serial baselines XPress is compared with (reference §4).

DSpark Markov head: delta_k = W1[x_{k-1}] W2^T, a bigram bias (XPress with only the token input).
Domino GRU head: a GRU (no bias) over the target embeddings of the realised previous tokens;
delta_k = W_b silu(W_a [h_k ; state_k]), state_k = GRU(state_{k-1}, embed(x_{k-1})).
Both are decoded serially (`decode_serial`, B-1 dependent steps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from xpress_jax.models.layers import loop_unroll, param


def choose(l_k: jax.Array, noise_k: jax.Array | None, temperature: float) -> jax.Array:
    """argmax l (greedy), or argmax(l / T + G): a sample from softmax(l / T) (Gumbel-max)."""
    if noise_k is None:
        return jnp.argmax(l_k, axis=-1).astype(jnp.int32)
    return jnp.argmax(l_k / temperature + noise_k, axis=-1).astype(jnp.int32)


def _positions_first(x):
    return None if x is None else jnp.moveaxis(x, 1, 0)


class MarkovHead(nnx.Module):
    def __init__(self, *, vocab_size: int, rank: int = 256, rngs: nnx.Rngs, dtype=jnp.float32,
                 param_dtype=jnp.float32, **_):
        self.dtype = dtype
        self.markov_w1 = param(rngs, (vocab_size, rank), ("vocab", "rank"), param_dtype)
        self.markov_w2 = param(rngs, (vocab_size, rank), ("vocab", "rank"), param_dtype)

    def step_delta(self, prev: jax.Array) -> jax.Array:
        """prev: [...] token ids -> delta [..., vocab]."""
        e = jnp.take(self.markov_w1[...].astype(self.dtype), prev, axis=0)
        return jnp.einsum("...r,vr->...v", e, self.markov_w2[...].astype(self.dtype), preferred_element_type=jnp.float32)

    def __call__(self, s, h, prev_tokens, embed=None):
        return s.astype(jnp.float32) + self.step_delta(prev_tokens)

    def decode_serial(self, s, h, anchor, embed=None, noise=None, temperature=1.0):
        """Left to right (greedy, or sampled with Gumbel noise [batch, n, vocab]):
        tokens [batch, n], logits [batch, n, vocab]."""
        def step(prev, inputs):
            s_k, g_k = inputs
            l_k = s_k.astype(jnp.float32) + self.step_delta(prev)
            tok = choose(l_k, g_k, temperature)
            return tok, (tok, l_k)
        xs = (jnp.moveaxis(s, 1, 0), _positions_first(noise))
        _, (tokens, logits) = jax.lax.scan(step, anchor.astype(jnp.int32), xs)
        return jnp.moveaxis(tokens, 0, 1), jnp.moveaxis(logits, 0, 1)


class GRUHead(nnx.Module):
    def __init__(self, *, vocab_size: int, hidden_size: int, gru_hidden: int = 256, proj_dim: int = 256,
                 rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32, **_):
        self.dtype = dtype
        self.gru_w_ih = param(rngs, (hidden_size, 3, gru_hidden), ("embed", None, "rank"), param_dtype)  # gates r, z, n
        self.gru_w_hh = param(rngs, (gru_hidden, 3, gru_hidden), ("rank", None, None), param_dtype)
        self.proj_in = param(rngs, (hidden_size + gru_hidden, proj_dim), (None, "rank"), param_dtype)
        self.proj_out = param(rngs, (proj_dim, vocab_size), ("rank", "vocab"), param_dtype)

    def gru_step(self, state: jax.Array, x: jax.Array) -> jax.Array:
        """PyTorch GRU cell without bias: state [batch, G], x [batch, hidden] -> new state."""
        gi = jnp.einsum("bh,hcg->bcg", x, self.gru_w_ih[...].astype(self.dtype))
        gh = jnp.einsum("bh,hcg->bcg", state, self.gru_w_hh[...].astype(self.dtype))
        r = jax.nn.sigmoid(gi[:, 0] + gh[:, 0])
        z = jax.nn.sigmoid(gi[:, 1] + gh[:, 1])
        n = jnp.tanh(gi[:, 2] + r * gh[:, 2])
        return (1 - z) * n + z * state

    def step_delta(self, h_k: jax.Array, state: jax.Array) -> jax.Array:
        feats = jnp.concatenate([h_k.astype(self.dtype), state], axis=-1)
        hidden = jax.nn.silu(feats @ self.proj_in[...].astype(self.dtype))
        return jnp.einsum("...p,pv->...v", hidden, self.proj_out[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)

    def _init_state(self, batch):
        return jnp.zeros((batch, self.gru_w_hh.shape[0]), self.dtype)

    def __call__(self, s, h, prev_tokens, embed):
        """Teacher-forced: the GRU walks the given previous tokens (still a scan over positions)."""
        e = embed(prev_tokens).astype(self.dtype)  # [batch, n, hidden]

        def step(state, x):
            state = self.gru_step(state, x)
            return state, state
        _, states = jax.lax.scan(step, self._init_state(s.shape[0]), jnp.moveaxis(e, 1, 0),
                                 unroll=loop_unroll(e.shape[1]))
        return s.astype(jnp.float32) + self.step_delta(h, jnp.moveaxis(states, 0, 1))

    def decode_serial(self, s, h, anchor, embed, noise=None, temperature=1.0):
        def step(carry, inputs):
            state, prev = carry
            s_k, h_k, g_k = inputs
            state = self.gru_step(state, embed(prev[:, None])[:, 0].astype(self.dtype))
            l_k = s_k.astype(jnp.float32) + self.step_delta(h_k, state)
            tok = choose(l_k, g_k, temperature)
            return (state, tok), (tok, l_k)
        init = (self._init_state(s.shape[0]), anchor.astype(jnp.int32))
        xs = (jnp.moveaxis(s, 1, 0), jnp.moveaxis(h, 1, 0), _positions_first(noise))
        _, (tokens, logits) = jax.lax.scan(step, init, xs)
        return jnp.moveaxis(tokens, 0, 1), jnp.moveaxis(logits, 0, 1)
