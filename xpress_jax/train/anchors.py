"""Anchored training blocks (reference §2, DFlash recipe).

Up to `num_anchors` anchors per sequence, drawn uniformly without replacement among positions p
where p and p + 1 are supervised (assistant) tokens. Block a is [token at p, MASK x (B-1)] at
positions p..p+B-1; slot k predicts token p + k, whose target distribution is the target's
output at position p + k - 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Blocks:
    anchors: jax.Array  # [batch, A] positions p
    valid: jax.Array  # [batch, A] bool: a real anchor (False: padding, when a sequence has fewer)
    labels: jax.Array  # [batch, A, n] tokens p+1 .. p+n  (n = B - 1)
    label_mask: jax.Array  # [batch, A, n] bool: supervised and inside the sequence
    anchor_tokens: jax.Array  # [batch, A] token at p (slot 0)


def eligible(loss_mask: jax.Array) -> jax.Array:
    """[batch, T] bool: p and p + 1 are both supervised."""
    nxt = jnp.pad(loss_mask[:, 1:], ((0, 0), (0, 1)))
    return loss_mask & nxt


def sample_anchors(key: jax.Array, loss_mask: jax.Array, num_anchors: int) -> tuple[jax.Array, jax.Array]:
    """Uniform without replacement among eligible positions (random top-k of uniform scores)."""
    ok = eligible(loss_mask)
    scores = jnp.where(ok, jax.random.uniform(key, ok.shape), -1.0)
    top, idx = jax.lax.top_k(scores, min(num_anchors, ok.shape[1]))
    return idx.astype(jnp.int32), top >= 0.0


def previous_anchor(anchors: jax.Array, valid: jax.Array) -> jax.Array:
    """For each anchor, the index (into the same row) of the nearest earlier valid anchor of its
    sequence; the earliest one wraps around to the latest (D-Loop eq. 13 over anchors sorted by
    position). anchors, valid: [batch, A] -> [batch, A] int32. Sampled anchors come in random
    order, so rolling the array would pick a random other anchor instead."""
    pos = anchors[:, None, :]  # [batch, 1, A]: the candidates j
    cand = valid[:, None, :]
    earlier = cand & (pos < anchors[:, :, None])  # [batch, A, A]
    low = jnp.iinfo(jnp.int32).min
    nearest = jnp.argmax(jnp.where(earlier, pos, low), axis=-1)  # largest earlier position
    latest = jnp.argmax(jnp.where(cand, pos, low), axis=-1)  # wrap-around: the sequence's last anchor
    return jnp.where(jnp.any(earlier, -1), nearest, latest).astype(jnp.int32)


def make_blocks(ids: jax.Array, loss_mask: jax.Array, anchors: jax.Array, valid: jax.Array, block: int) -> Blocks:
    seq = ids.shape[1]
    pos = anchors[:, :, None] + jnp.arange(1, block, dtype=jnp.int32)  # [batch, A, n]
    inside = pos < seq
    pos_c = jnp.minimum(pos, seq - 1)
    labels = jnp.take_along_axis(ids[:, None, :], pos_c, axis=2)
    supervised = jnp.take_along_axis(loss_mask[:, None, :], pos_c, axis=2)
    return Blocks(anchors=anchors, valid=valid, labels=labels,
                  label_mask=valid[:, :, None] & inside & supervised,
                  anchor_tokens=jnp.take_along_axis(ids, anchors, axis=1))


def target_positions(anchors: jax.Array, block: int, seq: int) -> jax.Array:
    """Where the target predicts slot k's token: p + k - 1 for k = 1..n -> [batch, A, n]."""
    return jnp.minimum(anchors[:, :, None] + jnp.arange(block - 1, dtype=jnp.int32), seq - 1)
