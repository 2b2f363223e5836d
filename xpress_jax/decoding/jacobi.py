"""Solving a causal head's block: parallel Jacobi iterations, and the sequential reference.

Sequential greedy: y_k = argmax l_k(y_<k), one position after another. Jacobi solves the same
equations from a seed Y(0) = argmax s by updating every position at once,
Y(t+1)_k = argmax l_k(Y(t)_<k). Position k is final once its prefix is, so B-1 iterations
reproduce the sequential decode exactly; usually far fewer suffice. The loop runs under `jit`
as a `lax.while_loop` with the fixed-point check inside it (no host round trip).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct

# step(prev_tokens [batch, n]) -> scores [batch, n, C]   (C = vocab, or k candidates)
StepFn = Callable[[jax.Array], jax.Array]


@struct.dataclass
class DraftBlock:
    """A block of draft tokens as any head (or the drafter alone) produced it."""
    tokens: jax.Array  # [batch, n] int32
    logits: jax.Array  # [batch, n, C]: the scores the tokens were chosen from
    # [batch] int32: Jacobi iterations run until the block stopped changing (at most max_iters);
    # n for a serial head, 0 for the drafter alone
    iterations: jax.Array


def previous_tokens(anchor: jax.Array, tokens: jax.Array) -> jax.Array:
    """x_{k-1} for each position k: [anchor, y_1, ..., y_{n-1}] -> [batch, n]."""
    return jnp.concatenate([anchor[:, None].astype(jnp.int32), tokens[:, :-1]], axis=1)


def _argmax(scores):
    return jnp.argmax(scores, axis=-1).astype(jnp.int32)


def jacobi_solve(step: StepFn, seed_scores: jax.Array, anchor: jax.Array, *, max_iters: int,
                 early_stop: bool = True, pick: Callable[[jax.Array], jax.Array] = _argmax) -> DraftBlock:
    """Up to `max_iters` parallel updates from Y(0) = pick(seed_scores).

    With early_stop the loop ends as soon as an iteration changes no token in any sequence;
    a sequence that converged earlier sits at its fixed point, so further iterations leave it unchanged.
    """
    batch = seed_scores.shape[0]

    def cond(carry):
        it, _, _, active, _ = carry
        go = it < max_iters
        return go & jnp.any(active) if early_stop else go

    def body(carry):
        it, tokens, _, active, iters = carry
        scores = step(previous_tokens(anchor, tokens))
        new = pick(scores)
        changed = jnp.any(new != tokens, axis=1)
        iters = iters + active.astype(jnp.int32)
        return it + 1, new, scores, active & changed, iters

    init = (jnp.int32(0), pick(seed_scores), seed_scores.astype(jnp.float32),
            jnp.ones((batch,), bool), jnp.zeros((batch,), jnp.int32))
    _, tokens, scores, _, iters = jax.lax.while_loop(cond, body, init)
    return DraftBlock(tokens=tokens, logits=scores, iterations=iters)


def sequential_solve(step: StepFn, anchor: jax.Array, num_positions: int,
                     pick: Callable[[jax.Array], jax.Array] = _argmax) -> DraftBlock:
    """The reference: a scan over positions; position k is chosen from the final prefix y_<k."""
    batch = anchor.shape[0]

    def body(carry, k):
        tokens, logits = carry
        scores = step(previous_tokens(anchor, tokens))  # only position k's row is read
        row = jax.lax.dynamic_index_in_dim(scores, k, axis=1, keepdims=False)  # [batch, C]
        tokens = tokens.at[:, k].set(pick(row))
        logits = logits.at[:, k].set(row)
        return (tokens, logits), None

    probe = jax.eval_shape(step, jnp.zeros((batch, num_positions), jnp.int32))
    init = (jnp.zeros((batch, num_positions), jnp.int32), jnp.zeros(probe.shape, jnp.float32))
    (tokens, logits), _ = jax.lax.scan(body, init, jnp.arange(num_positions))
    return DraftBlock(tokens=tokens, logits=logits, iterations=jnp.full((batch,), num_positions, jnp.int32))


def top_k_candidates(s: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The drafter's top-k per position: scores [batch, n, k] and ids [batch, n, k] (best first)."""
    scores, ids = jax.lax.top_k(s.astype(jnp.float32), k)
    return scores, ids.astype(jnp.int32)


def pick_from(candidates: jax.Array) -> Callable[[jax.Array], jax.Array]:
    """Maps argmax over candidate scores [batch, n, k] back to token ids."""
    def pick(scores):
        idx = jnp.argmax(scores, axis=-1)
        return jnp.take_along_axis(candidates, idx[..., None], axis=-1)[..., 0]
    return pick


def token_agreement(full_tokens: jax.Array, candidate_tokens: jax.Array) -> jax.Array:
    """Fraction of positions where candidate mode chose what the full vocabulary chose."""
    return jnp.mean((full_tokens == candidate_tokens).astype(jnp.float32))
