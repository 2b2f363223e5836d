"""One entry point from the drafter's outputs to a block of draft tokens, for every head, by
how the head decodes (`methods.HEADS[name].decode`):

    no head  argmax s (the drafter alone: dflash, dloop)
    serial   B-1 dependent steps (markov, gru)
    jacobi   the folded refiner solved by Jacobi: max_iters iterations, early stop, optional top-k
             candidates (xpress)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from xpress_jax.decoding.jacobi import DraftBlock, jacobi_solve, pick_from, top_k_candidates
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.errors import InputError
from xpress_jax.methods import HEADS, JACOBI, SERIAL
from xpress_jax.models.heads.baselines import choose


def refine_block(name: str | None, head, s: jax.Array, h: jax.Array, anchor: jax.Array, embed=None, *,
                 settings: DecodeSettings = DecodeSettings(), noise: jax.Array | None = None,
                 temperature: float = 1.0) -> DraftBlock:
    """name: a key of methods.HEADS, or None for the drafter alone.
    s: [batch, drafted, vocab] base logits of the block's first `drafted` positions; h: [batch, n, hidden] of all
    n >= drafted (XPress's g is their mean); anchor: [batch] -> tokens, logits of those positions. The
    heads are causal, so these are exactly the first `drafted` positions of the whole block's solve.
    A Jacobi head (XPress) reads settings.max_iters (Jacobi iterations), early_stop and top_k (candidate mode).

    Greedy without `noise`; with Gumbel noise [batch, drafted, vocab] each token is argmax(l/T + G),
    a sample from softmax(l/T) of the logits returned. The noise stays fixed across Jacobi
    iterations, so the fixed point is the sequential sampled decode with the same noise.
    In candidate mode (xpress, top_k > 0) the returned logits are full-vocabulary rows that are
    -inf outside the candidates, so sampling and verification need not know about the mode.
    """
    batch = s.shape[0]
    if name is None:
        return DraftBlock(tokens=choose(s.astype(jnp.float32), noise, temperature), logits=s.astype(jnp.float32),
                            iterations=jnp.zeros((batch,), jnp.int32))
    if name not in HEADS:
        raise InputError(f"unknown head {name!r}; choose one of {', '.join(HEADS)} (or None: the drafter alone)")
    drafted = s.shape[1]
    if HEADS[name].decode == SERIAL:
        tokens, logits = head.decode_serial(s, h[:, :drafted], anchor, embed, noise=noise, temperature=temperature)
        return DraftBlock(tokens=tokens, logits=logits, iterations=jnp.full((batch,), drafted, jnp.int32))
    assert HEADS[name].decode == JACOBI, name
    max_iters, early_stop, top_k = settings.max_iters, settings.early_stop, settings.top_k
    folded = head.fold()
    c = folded.block_constant(h)[:, :drafted]  # per-block constant over all n positions, outside the loop
    folded = folded.first(drafted)
    if top_k <= 0:
        pick = lambda scores: choose(scores, noise, temperature)  # noqa: E731
        return jacobi_solve(lambda prev: folded.logits(s, c, prev), s, anchor, max_iters=max_iters,
                            early_stop=early_stop, pick=pick)
    s_cand, ids = top_k_candidates(s, top_k)
    w_cand = folded.candidate_readout(ids)  # gathered once: k columns of W_r per position
    noise_cand = None if noise is None else jnp.take_along_axis(noise, ids, axis=-1)
    to_id = pick_from(ids)
    pick = lambda scores: to_id(scores if noise is None else scores / temperature + noise_cand)  # noqa: E731
    out = jacobi_solve(lambda prev: folded.candidate_logits(s_cand, w_cand, c, prev), s_cand, anchor,
                       max_iters=max_iters, early_stop=early_stop, pick=pick)
    full = jnp.full(s.shape, -jnp.inf, jnp.float32)
    full = jax.vmap(jax.vmap(lambda row, i, v: row.at[i].set(v)))(full, ids, out.logits)
    return out.replace(logits=full)
