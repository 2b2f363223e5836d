"""The XPress causal refiner (xpress.txt §2; reference §4).

    (i)   fuse  u_k = W_in [W_e[x_{k-1}] ; W_h h_k ; W_g g]      g = mean_j h_j
    (ii)  mix   m_k = sum_{j<=k} L_{k,j} * u_j                    per-channel lower-triangular L
    (iii)       z_k = m_k + MLP(m_k)                              gated r -> 2r -> r
    (iv)  delta_k = W_r z_k
    (v)   l_k = s_k + delta_k

(i) and (ii) are linear, so at inference they fold: the h/g part of m is a per-block constant,
and the token part is mix(E[x]) with E = W_e W_in_e (`fold()` -> FoldedXPress).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from xpress_jax.models.layers import param


def causal_mix(L: jax.Array, u: jax.Array) -> jax.Array:
    """m_k = sum_{j<=k} L_{k,j} * u_j.  L: [n, n, r] (masked here); u: [batch, n, r] -> [batch, n, r]."""
    n = L.shape[0]
    tril = jnp.tril(jnp.ones((n, n), L.dtype))[:, :, None]
    return jnp.einsum("kjr,bjr->bkr", L * tril, u)


def gated_mlp_residual(m, gate, up, down):
    """z = m + down(silu(m gate) * (m up))."""
    return m + (jax.nn.silu(m @ gate) * (m @ up)) @ down


class XPressRefiner(nnx.Module):
    def __init__(self, *, vocab_size: int, hidden_size: int, num_positions: int, rank: int = 256,
                 rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        r = rank
        self.dtype = dtype
        self.W_e = param(rngs, (vocab_size, r), ("vocab", "rank"), param_dtype)
        self.W_h = param(rngs, (hidden_size, r), ("embed", "rank"), param_dtype)
        self.W_g = param(rngs, (hidden_size, r), ("embed", "rank"), param_dtype)
        self.W_in = param(rngs, (3 * r, r), (None, "rank"), param_dtype)
        # L starts as the identity per channel: no mixing until training asks for it.
        self.L = nnx.Param(jnp.broadcast_to(jnp.eye(num_positions, dtype=param_dtype)[:, :, None],
                                            (num_positions, num_positions, r)), axes=("block", None, "rank"))
        self.mlp_gate = param(rngs, (r, 2 * r), ("rank", None), param_dtype)
        self.mlp_up = param(rngs, (r, 2 * r), ("rank", None), param_dtype)
        self.mlp_down = param(rngs, (2 * r, r), (None, "rank"), param_dtype)
        # W_r starts at zero: the untrained refiner leaves the drafter's logits unchanged.
        self.W_r = nnx.Param(jnp.zeros((r, vocab_size), param_dtype), axes=("rank", "vocab"))

    def _w(self, p):
        return p[...].astype(self.dtype)

    def delta(self, h: jax.Array, prev_tokens: jax.Array) -> jax.Array:
        """delta [batch, n, vocab] from h [batch, n, hidden] and prev_tokens x_{k-1} [batch, n]."""
        h = h.astype(self.dtype)
        g = jnp.mean(h, axis=1, keepdims=True)  # [batch, 1, hidden]
        e = jnp.take(self._w(self.W_e), prev_tokens, axis=0)  # [batch, n, r]
        g_r = jnp.broadcast_to(g @ self._w(self.W_g), e.shape)
        u = jnp.concatenate([e, h @ self._w(self.W_h), g_r], axis=-1) @ self._w(self.W_in)  # (i)  [batch, n, r]
        m = causal_mix(self._w(self.L), u)  # (ii)
        z = gated_mlp_residual(m, self._w(self.mlp_gate), self._w(self.mlp_up), self._w(self.mlp_down))  # (iii)
        return jnp.einsum("bnr,rv->bnv", z, self._w(self.W_r), preferred_element_type=jnp.float32)  # (iv)

    def __call__(self, s: jax.Array, h: jax.Array, prev_tokens: jax.Array, embed=None) -> jax.Array:
        """l_k = s_k + delta_k (v): [batch, n, vocab] float32."""
        return s.astype(jnp.float32) + self.delta(h, prev_tokens)

    def fold(self) -> "FoldedXPress":
        """The inference form: W_in split by input and multiplied into W_e, W_h, W_g."""
        r = self.W_in.shape[1]
        W_in = self._w(self.W_in)
        return FoldedXPress(E=self._w(self.W_e) @ W_in[:r], H=self._w(self.W_h) @ W_in[r:2 * r],
                            G=self._w(self.W_g) @ W_in[2 * r:], L=self._w(self.L), gate=self._w(self.mlp_gate),
                            up=self._w(self.mlp_up), down=self._w(self.mlp_down), W_r_T=self._w(self.W_r).T)


@struct.dataclass
class FoldedXPress:
    """Folded refiner weights; `block_constant` once per block, then `logits` per Jacobi iteration."""

    E: jax.Array  # [vocab, r]  W_e W_in_e
    H: jax.Array  # [hidden, r] W_h W_in_h
    G: jax.Array  # [hidden, r] W_g W_in_g
    L: jax.Array  # [n, n, r]
    gate: jax.Array
    up: jax.Array
    down: jax.Array
    # W_r transposed once at fold time, [vocab, r]: each vocabulary row's r weights are contiguous
    # (the Markov head's readout layout), so candidate mode gathers whole rows and the readout
    # streams the weights in order
    W_r_T: jax.Array

    def fold(self) -> "FoldedXPress":
        """Already folded (so a solver can take either form)."""
        return self

    def first(self, m: int) -> "FoldedXPress":
        """The refiner of the block's first m positions: L's leading m x m corner. Exact for those
        positions, since the mix is lower-triangular (with block_constant computed on the whole block)."""
        return self if m == self.L.shape[0] else self.replace(L=self.L[:m, :m])

    def block_constant(self, h: jax.Array) -> jax.Array:
        """The part of m_k that does not depend on tokens: mix(h H + g G) [batch, n, r]."""
        h = h.astype(self.H.dtype)
        g = jnp.mean(h, axis=1, keepdims=True)
        return causal_mix(self.L, h @ self.H + g @ self.G)

    def z(self, c: jax.Array, prev_tokens: jax.Array) -> jax.Array:
        m = c + causal_mix(self.L, jnp.take(self.E, prev_tokens, axis=0))
        return gated_mlp_residual(m, self.gate, self.up, self.down)  # [batch, n, r]

    def logits(self, s: jax.Array, c: jax.Array, prev_tokens: jax.Array) -> jax.Array:
        """Full-vocabulary l [batch, n, vocab]."""
        z = self.z(c, prev_tokens)
        return s.astype(jnp.float32) + jnp.einsum("bnr,vr->bnv", z, self.W_r_T, preferred_element_type=jnp.float32)

    def candidate_readout(self, candidates: jax.Array) -> jax.Array:
        """W_r columns of each position's candidates: candidates [batch, n, k] -> [batch, n, k, r]."""
        return jnp.take(self.W_r_T, candidates, axis=0)

    def candidate_logits(self, s_cand: jax.Array, W_r_cand: jax.Array, c: jax.Array, prev_tokens: jax.Array) -> jax.Array:
        """l restricted to the candidates: s_cand [batch, n, k] + z . W_r[:, cand] -> [batch, n, k]."""
        z = self.z(c, prev_tokens)
        return s_cand.astype(jnp.float32) + jnp.einsum("bnr,bnkr->bnk", z, W_r_cand,
                                                       preferred_element_type=jnp.float32)
