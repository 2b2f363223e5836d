"""Acceptance: greedy matching and speculative (rejection) sampling (Leviathan et al. 2023).

Both take the n draft tokens and the target's logits over the n+1 block positions (slot 0 is the
last committed token, so target row j predicts draft j) and return acc (accepted drafts) and the
token the target contributes after them (the correction or the bonus).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def greedy_accept(draft: jax.Array, target_logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """draft: [batch, n]; target_logits: [batch, n+1, vocab] -> acc [batch], next_token [batch].

    acc = cumprod(draft == argmax p[:-1]).sum(); the next token is the target's argmax at acc.
    """
    posterior = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [batch, n+1]
    match = (draft == posterior[:, :-1]).astype(jnp.int32)
    acc = jnp.sum(jnp.cumprod(match, axis=1), axis=1)
    return acc, jnp.take_along_axis(posterior, acc[:, None], axis=1)[:, 0]


def speculative_accept(key: jax.Array, draft: jax.Array, draft_logits: jax.Array, target_logits: jax.Array,
                       temperature: float) -> tuple[jax.Array, jax.Array]:
    """Accept draft x_k ~ q_k with probability min(1, p_k(x)/q_k(x)); at the first rejection draw
    from norm(max(0, p - q)); after n acceptances draw the bonus from p_{n+1}. Lossless for any q.

    draft_logits: [batch, n, vocab] (the logits the drafts were sampled from at this temperature;
    -inf outside a candidate set is fine); target_logits: [batch, n+1, vocab].
    """
    batch, n = draft.shape
    p = jax.nn.softmax(target_logits.astype(jnp.float32) / temperature, axis=-1)  # [batch, n+1, vocab]
    q = jax.nn.softmax(draft_logits.astype(jnp.float32) / temperature, axis=-1)  # [batch, n, vocab]
    p_x = jnp.take_along_axis(p[:, :n], draft[..., None], axis=-1)[..., 0]
    q_x = jnp.take_along_axis(q, draft[..., None], axis=-1)[..., 0]
    key_accept, key_resample = jax.random.split(key)
    u = jax.random.uniform(key_accept, (batch, n))
    accepted = (u * q_x < p_x).astype(jnp.int32)  # u < p/q without dividing by a zero q
    acc = jnp.sum(jnp.cumprod(accepted, axis=1), axis=1)  # [batch]
    p_at = jnp.take_along_axis(p, acc[:, None, None], axis=1)[:, 0]  # [batch, vocab]
    q_padded = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # q_{n+1} = 0: the bonus comes from p
    q_at = jnp.take_along_axis(q_padded, acc[:, None, None], axis=1)[:, 0]
    residual = jnp.maximum(p_at - q_at, 0.0)
    total = jnp.sum(residual, axis=-1, keepdims=True)
    residual = jnp.where(total > 0, residual / jnp.maximum(total, 1e-30), p_at)  # p == q: any draw from p
    next_token = jax.random.categorical(key_resample, jnp.log(residual), axis=-1).astype(jnp.int32)
    return acc, next_token


def gumbel_noise(key: jax.Array, shape) -> jax.Array:
    """Gumbel(0, 1) noise: argmax(l / T + G) is a sample from softmax(l / T)."""
    return jax.random.gumbel(key, shape, jnp.float32)
