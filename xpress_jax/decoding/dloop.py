"""D-Loop drafting (reference §5, D-Loop §3.1): the same drafter run twice.

Pass 1 drafts the block from [x_0, MASK...]: x~_1..x~_m with confidences c_k = q_k(x~_k).
Each prefix length l = 0..m-1 is scored r_l = (prod_{k<=l} c_k)(1 - c_{l+1}): a confident prefix
followed by a doubtful token. The top-K lengths become K branches; pass 2 keeps a branch's
prefix, re-masks its suffix and regenerates it from [x_0, x~_1..x~_l, MASK...], all K branches in
one drafter call over the shared context. Drafts are argmax at every temperature (the paper's
App. A.4): verification treats them as point-mass proposals, which keeps sampling lossless.

`dloop+xpress` (neither paper has it) runs the XPress refiner on pass 1 (its refined
distribution gives the confidences) and on every branch after pass 2, with the branch's prefix
rows from pass 1 and its suffix rows from pass 2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.verify import branch_accept, gumbel_noise
from xpress_jax.models.drafter import block_inputs


@struct.dataclass
class LoopDraft:
    tokens: jax.Array  # [batch, K, n] each branch's proposal y = (x~_1..x~_l, y_{l+1}..y_n)
    prefix_len: jax.Array  # [batch, K] the l kept from pass 1, best score first
    one_pass: jax.Array  # [batch, n] argmax of pass 1's base logits s: DFlash's block from this drafter
    iterations: jax.Array  # [batch] Jacobi iterations (dloop+xpress; 0 for dloop)


def prefix_scores(confidence: jax.Array) -> jax.Array:
    """c [batch, m] (c[:, k-1] = c_k) -> r [batch, m] with r[:, l] = (prod_{k<=l} c_k)(1 - c_{l+1})."""
    kept = jnp.cumprod(confidence, axis=-1)  # prod_{k<=l+1} c_k
    prefix_prob = jnp.concatenate([jnp.ones_like(kept[:, :1]), kept[:, :-1]], axis=-1)  # prod_{k<=l} c_k
    return prefix_prob * (1.0 - confidence)


def select_prefixes(confidence: jax.Array, branches: int) -> jax.Array:
    """The top-K prefix lengths by r_l, best first (ties: the shorter length): [batch, K] int32."""
    _, lengths = jax.lax.top_k(prefix_scores(confidence), branches)
    return lengths.astype(jnp.int32)


def branch_inputs(last: jax.Array, first_pass: jax.Array, prefix_len: jax.Array, mask_id: int) -> jax.Array:
    """[x_0, x~_1..x~_l, MASK...] per branch: last [batch], first_pass [batch, n], prefix_len [batch, K]
    -> [batch, K, n + 1]."""
    n = first_pass.shape[-1]
    k = jnp.arange(1, n + 1, dtype=jnp.int32)  # draft position
    visible = k[None, None, :] <= prefix_len[:, :, None]  # [batch, K, n]
    suffix = jnp.where(visible, first_pass[:, None, :], mask_id)
    anchor = jnp.broadcast_to(last[:, None, None], prefix_len.shape + (1,)).astype(jnp.int32)
    return jnp.concatenate([anchor, suffix], axis=-1)


def loop_draft(target, drafter, ctx, last: jax.Array, settings: DecodeSettings, head=None) -> LoopDraft:
    """Two drafter passes (the second over K = settings.branches branches at once); with `head` (an
    XPress refiner) both passes are refined. last: [batch] the anchor x_0; ctx: the drafter's context."""
    block = drafter.cfg.block_size
    batch = last.shape[0]
    branches = settings.branches
    mask_id = drafter.cfg.mask_token_id
    refine_opts = dict(settings=settings)

    h1 = drafter(target.embed(block_inputs(last, block, mask_id)), ctx)[:, 1:]  # [batch, n, hidden]
    s1 = target.logits(h1)  # [batch, n, vocab]
    one_pass = jnp.argmax(s1, axis=-1).astype(jnp.int32)
    iterations = jnp.zeros((batch,), jnp.int32)
    if head is None:
        logits1 = s1
    else:
        refined = refine_block("xpress", head, s1, h1, last, target.embed, **refine_opts)
        logits1, iterations = refined.logits, refined.iterations
    x1 = jnp.argmax(logits1, axis=-1).astype(jnp.int32)  # x~ [batch, n]
    confidence = jnp.max(jax.nn.softmax(logits1.astype(jnp.float32), axis=-1), axis=-1)  # c_k = q_k(x~_k)
    prefix_len = select_prefixes(confidence, branches)  # [batch, K]

    inputs = branch_inputs(last, x1, prefix_len, mask_id)  # [batch, K, B]
    h2 = drafter(target.embed(inputs.reshape(batch, branches * block)), ctx, num_blocks=branches)
    h2 = h2.reshape(batch, branches, block, -1)[:, :, 1:]  # [batch, K, n, hidden]
    s2 = target.logits(h2.reshape(batch, branches * (block - 1), -1)).reshape(batch, branches, block - 1, -1)
    in_prefix = (jnp.arange(1, block)[None, None, :] <= prefix_len[:, :, None])  # [batch, K, n]
    if head is None:
        tokens = jnp.where(in_prefix, x1[:, None, :], jnp.argmax(s2, axis=-1).astype(jnp.int32))
        return LoopDraft(tokens=tokens, prefix_len=prefix_len, one_pass=one_pass, iterations=iterations)

    # each branch refined as its own block: prefix rows from pass 1, suffix rows from pass 2
    s_branch = jnp.where(in_prefix[..., None], s1[:, None], s2)  # [batch, K, n, vocab]
    h_branch = jnp.where(in_prefix[..., None], h1[:, None], h2)  # [batch, K, n, hidden]
    flat = lambda x: x.reshape((batch * branches,) + x.shape[2:])  # noqa: E731
    refined = refine_block("xpress", head, flat(s_branch), flat(h_branch), jnp.repeat(last, branches),
                           target.embed, **refine_opts)
    y = refined.tokens.reshape(batch, branches, block - 1)
    # the kept prefix is pass 1's (equal to the refined one once Jacobi has converged)
    tokens = jnp.where(in_prefix, x1[:, None, :], y)
    iterations = iterations + jnp.max(refined.iterations.reshape(batch, branches), axis=1)
    return LoopDraft(tokens=tokens, prefix_len=prefix_len, one_pass=one_pass, iterations=iterations)


def branch_layout(branches: int, block: int) -> tuple[jax.Array, jax.Array]:
    """Positions and mask of K verification branches laid side by side, [last, y_1..y_n] each:
    offsets [K*B] (slot within its branch) and mask [K*B, K*B] (query, key): a token sees its own
    branch's earlier tokens and itself, never another branch."""
    slot = jnp.arange(branches * block, dtype=jnp.int32)
    offsets = slot % block
    same = (slot[:, None] // block) == (slot[None, :] // block)
    return offsets, same & (offsets[None, :] <= offsets[:, None])


def _pick(x: jax.Array, branch: jax.Array) -> jax.Array:
    """x: [batch, K, ...], branch: [batch] -> [batch, ...]."""
    return jnp.take_along_axis(x, branch.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]


def verify_branches(target, cache, last: jax.Array, drafts: jax.Array, *, key: jax.Array, temperature,
                    greedy: bool, tap_layers=(), reject_drafts: bool = False, match: bool = False):
    """One target pass over K branches [last, y_1..y_n] side by side over the shared cache, each
    attending to the committed context and its own earlier tokens at the right positions.

    drafts: [batch, K, n]. Returns (branch, acc, next_token, out) where `out` holds the target
    cache with the kept branch moved to where a single-block pass writes it (lengths still to be
    committed by the caller) and that branch's taps [batch, B, n_taps, hidden]: the state of having
    verified that branch alone. reject_drafts: the same pass, no draft offered to the (greedy)
    acceptance rule; the first branch's row 0 gives the token. match (temperature > 0): the DFlash
    harness's rule, the longest branch equal to the target's sampled tokens, one Gumbel draw per
    depth shared by the branches (branches on one path read the same row, so they see one sample).
    """
    batch, branches, n = drafts.shape
    block = n + 1
    tokens = jnp.concatenate([jnp.broadcast_to(last[:, None, None], (batch, branches, 1)), drafts], axis=2)
    tree = {}
    if branches > 1:
        offsets, mask = branch_layout(branches, block)
        tree = dict(block_offsets=offsets, block_mask=mask)
    out = target(tokens.reshape(batch, branches * block), cache=cache, tap_layers=tap_layers, **tree)
    per_branch = lambda x: x.reshape((batch, branches, block) + x.shape[2:])  # noqa: E731
    offered, logits = (drafts[:, :, :0], per_branch(out.logits)[:, :, :1]) if reject_drafts else (
        drafts, per_branch(out.logits))
    if match and not greedy:
        logits = logits.astype(jnp.float32) / temperature + gumbel_noise(key, (batch, 1) + logits.shape[2:])
    branch, acc, nxt = branch_accept(key, offered, logits, temperature, greedy or match)
    kept = out.cache if branches == 1 else out.cache.keep_branch(cache.lengths, branch, block)
    taps = None if out.taps is None else _pick(per_branch(out.taps), branch)
    return branch, acc, nxt, out.replace(cache=kept, taps=taps, logits=None)
