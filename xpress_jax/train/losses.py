"""Training losses: DFlash's weighted CE, XPress's CE + TV on three distributions, D-Loop's
complementary prefix-suffix objective. Each returns (weighted sum, weight sum) so chunks of
anchors can be accumulated and normalised once.

    w_k = exp(-(k - 1) / gamma)                        k = 1..n (slot k predicts token p + k)
    L(p) = sum_k w_k [CE(p_k, x*_k) + TV(p_k, p^t_k)] / sum_k w_k,    TV = 0.5 ||p - p^t||_1
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp


def position_weights(n: int, gamma: float) -> jax.Array:
    """w_k for k = 1..n: [n]."""
    return jnp.exp(-jnp.arange(n, dtype=jnp.float32) / gamma)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """-log softmax(logits)[label]: logits [..., vocab], labels [...] -> [...] float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]


def total_variation(logits: jax.Array, target_probs: jax.Array) -> jax.Array:
    """0.5 * ||softmax(logits) - p^t||_1 over the vocabulary -> [...]."""
    p = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    return 0.5 * jnp.sum(jnp.abs(p - target_probs), axis=-1)


def weighted(values: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sum w * v, sum w) over everything."""
    return jnp.sum(values * weights), jnp.sum(weights)


def ce_tv_terms(logits, labels, target_probs, weights, tv_weight: float):
    """L(p)'s numerator and denominator: sum_k w_k [CE + tv_weight * TV], sum_k w_k."""
    value = cross_entropy(logits, labels)
    if tv_weight:
        value = value + tv_weight * total_variation(logits, target_probs)
    return weighted(value, weights)


def prefix_length_logits(m: int, beta: float) -> jax.Array:
    """log pi_beta(l) for l = 0..m-1, pi_beta(l) = (1 - beta) beta^l / (1 - beta^m) (D-Loop eq. 6)."""
    ell = jnp.arange(m, dtype=jnp.float32)
    return jnp.log(1 - beta) + ell * jnp.log(beta) - jnp.log(1 - beta**m)


def sample_prefix_lengths(key: jax.Array, shape, m: int, beta: float) -> jax.Array:
    return jax.random.categorical(key, prefix_length_logits(m, beta), shape=shape).astype(jnp.int32)


def dloop_weights(prefix_len: jax.Array, label_mask_suffix: jax.Array, label_mask_prefix: jax.Array,
                  gamma: float, tau_s: float) -> tuple[jax.Array, jax.Array]:
    """Suffix-view and prefix-view weights [batch, A, m] (D-Loop eq. 7 and 13).

    Suffix view (anchor a, prefix of length l revealed): w^S_k = v 1{k > l} exp(-(k - l - 1) / tau_s).
    Prefix view: anchor only; w^P_k = v 1{k <= l} exp(-(k - 1) / gamma) when l >= 2, otherwise a full
    anchor-only block at the nearest earlier anchor of the sequence, w^P_k = v exp(-(k - 1) / gamma).
    """
    m = label_mask_suffix.shape[-1]
    k = jnp.arange(1, m + 1, dtype=jnp.int32)[None, None, :]
    ell = prefix_len[:, :, None]
    w_s = jnp.where(k > ell, jnp.exp(-(k - ell - 1).astype(jnp.float32) / tau_s), 0.0) * label_mask_suffix
    decay = jnp.exp(-(k - 1).astype(jnp.float32) / gamma)
    w_p = jnp.where(ell >= 2, jnp.where(k <= ell, decay, 0.0), decay) * label_mask_prefix
    return w_s, w_p


def simulated_acceptance(correct: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced acceptance: per block the run of correct predictions from k = 1 (an invalid
    position ends the run). correct, mask: [batch, A, n]. Returns (sum of acc + 1 over valid
    blocks, number of valid blocks)."""
    run = jnp.cumprod((correct & mask).astype(jnp.int32), axis=-1).sum(-1)
    blocks = mask[..., 0]
    return jnp.sum((run + 1) * blocks), jnp.sum(blocks)


@dataclasses.dataclass(frozen=True)
class HeadBatch:
    """What a causal head's loss sees: the anchor blocks flattened to rows (batch x blocks)."""

    s: jax.Array  # [rows, n, vocab] the drafter's logits s_k
    h: jax.Array  # [rows, n, hidden] its hidden states h_k
    labels: jax.Array  # [rows, n] x*_k
    prev: jax.Array  # [rows, n] x_{k-1}: the anchor, then the labels
    target_probs: jax.Array | None  # [rows, n, vocab] p^t_k (None when no TV term is asked for)
    weights: jax.Array  # [rows, n] w_k times the label mask
    label_mask: jax.Array  # [rows, n]
    embed: Callable  # the target's token embedding
    tv: float  # weight of TV next to CE

    def ce_tv(self, logits):
        """L(p) for these rows: (sum_k w_k [CE + tv TV], sum_k w_k)."""
        return ce_tv_terms(logits, self.labels, self.target_probs, self.weights, self.tv)


def teacher_forced(term: str):
    """A head's loss as one term: CE + TV of its teacher-forced logits l_k = head(s, h, x*_{<k})."""
    def loss(head, b: HeadBatch) -> dict:
        return {term: b.ce_tv(head(b.s, b.h, b.prev, b.embed))}
    return loss


def xpress_terms(head, b: HeadBatch) -> dict:
    """XPress's objective, L applied to three distributions: the refiner teacher-forced, the drafter's own
    logits s (the anchor term that trains p^b), and the refiner fed the drafter's argmax guesses
    (the consistency term: what Jacobi's first iteration sees); plus its teacher-forced acceptance
    under guesses as a metric."""
    guess = jax.lax.stop_gradient(jnp.argmax(b.s, -1).astype(jnp.int32))  # [rows, n]
    prev_hat = jnp.concatenate([b.prev[:, :1], guess[:, :-1]], axis=1)
    l_c = head(b.s, b.h, prev_hat, b.embed)  # [rows, n, vocab]
    return {"xpress_teacher_forced": b.ce_tv(head(b.s, b.h, b.prev, b.embed)),
            "xpress_anchor": b.ce_tv(b.s),
            "xpress_consistency": b.ce_tv(l_c),
            "sim_tau_xpress": simulated_acceptance((jnp.argmax(l_c, -1) == b.labels)[None], b.label_mask[None])}
