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


def branch_accept(key: jax.Array, drafts: jax.Array, target_logits: jax.Array, temperature: float,
                  greedy: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Verification of K deterministic branches (D-Loop): the branches form a token tree whose
    children at a node are the distinct next tokens of the branches still on the accepted path.

    drafts: [batch, K, n] point-mass proposals; target_logits: [batch, K, n+1, vocab] (row j of a
    branch predicts its draft j, as for one block). Returns (branch [batch], acc [batch],
    next_token [batch]): the kept branch, its accepted drafts and the target's token after them.

    Greedy: the longest branch that matches the target's argmax (the first of equals).
    Sampling: recursive rejection at each node (SpecInfer's multi-draft rule with point-mass
    proposals): try the children in branch order; a child t is accepted with probability
    p'(t), where p' is the target's distribution with the children already rejected at this node
    removed and renormalised; if all are rejected the token is drawn from the last p'. Each emitted
    token is then distributed exactly as p (try t_1: p(t_1); t_2: (1 - p(t_1)) p(t_2) / (1 - p(t_1));
    ...; none: p(t) for every other t), so the output is the target's distribution. A duplicate of a
    rejected child has p'(t) = 0 and changes nothing. Picking the longest accepted branch after
    independent per-branch tests would not be lossless.
    """
    batch, branches, n = drafts.shape
    if greedy:
        posterior = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)  # [batch, K, n+1]
        acc_per_branch = jnp.sum(jnp.cumprod((drafts == posterior[:, :, :-1]).astype(jnp.int32), axis=2), axis=2)
        branch = jnp.argmax(acc_per_branch, axis=1).astype(jnp.int32)  # first of the longest
        acc = jnp.max(acc_per_branch, axis=1)
        rows = jnp.take_along_axis(posterior, branch[:, None, None], axis=1)[:, 0]  # [batch, n+1]
        return branch, acc, jnp.take_along_axis(rows, acc[:, None], axis=1)[:, 0]

    rows = jnp.arange(batch)

    def node_probs(alive, depth):
        first = jnp.argmax(alive, axis=1)  # any branch on the path reads the same target row
        logits = target_logits[rows, first, depth]  # [batch, vocab]
        return first, jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)

    def at_depth(depth, carry):
        alive, running, acc, branch, nxt, key = carry
        key, k_try, k_draw = jax.random.split(key, 3)
        u = jax.random.uniform(k_try, (branches, batch))
        first, residual = node_probs(alive, depth)
        chosen = jnp.full((batch,), -1, jnp.int32)
        for j in range(branches):  # K is small and static
            child = drafts[:, j, depth]  # [batch]
            trying = running & alive[:, j] & (chosen < 0)
            p_child = residual[rows, child]
            ok = trying & (u[j] < p_child)
            chosen = jnp.where(ok, child, chosen)
            rejected = trying & ~ok
            removed = residual.at[rows, child].set(0.0)
            removed = removed / jnp.maximum(1.0 - p_child, 1e-30)[:, None]
            residual = jnp.where(rejected[:, None], removed, residual)
        accepted = running & (chosen >= 0)
        stops = running & ~accepted
        drawn = jax.random.categorical(k_draw, jnp.log(residual), axis=-1).astype(jnp.int32)
        nxt = jnp.where(stops, drawn, nxt)
        branch = jnp.where(stops, first, branch)
        alive = alive & (~accepted[:, None] | (drafts[:, :, depth] == chosen[:, None]))
        return alive, running & accepted, acc + accepted, branch, nxt, key

    init = (jnp.ones((batch, branches), bool), jnp.ones((batch,), bool), jnp.zeros((batch,), jnp.int32),
            jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32), key)
    alive, running, acc, branch, nxt, key = jax.lax.fori_loop(0, n, at_depth, init)
    # every draft of a branch accepted: the bonus token from p at row n of that branch
    first, p_bonus = node_probs(alive, n)
    bonus = jax.random.categorical(key, jnp.log(p_bonus), axis=-1).astype(jnp.int32)
    return (jnp.where(running, first, branch).astype(jnp.int32), acc.astype(jnp.int32),
            jnp.where(running, bonus, nxt))
