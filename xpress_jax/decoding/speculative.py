"""Speculative decoding, all under one `jit`: prefill, then a `lax.while_loop` of
draft (drafter + head) -> verify (one target pass over the block) -> accept -> commit.
D-Loop decoders draft with two drafter passes over K branches and verify the K branches in one
target pass side by side (`decoding/dloop.py`); the rest of the step is shared.

Each sequence of the batch advances by its own acceptance; caches roll back by moving lengths.
Target-only decoding (the baseline) is the same loop with a block of one token and no drafter.

Invariants at the top of every step, per sequence: the target cache and the drafter context
hold positions 0..L-1 (L = cache length); `last` is the newest token, at position L, emitted
but not yet run through the target (it is slot 0 of the next block).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from xpress_jax.config import ACCEPTANCE_RULES
from xpress_jax.decoding.devices import (batch_mesh, decode_batch_split, decode_tensor_split, replicate,
                                         target_mesh)
from xpress_jax.decoding.dloop import loop_draft, verify_branches
from xpress_jax.decoding.padding import pad_prompts, round_up
from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.verify import greedy_accept, gumbel_noise, speculative_accept
from xpress_jax.errors import InputError
from xpress_jax.methods import DECODERS, HEADS, JACOBI, head_of
from xpress_jax.models.drafter import ContextCache, DFlashDrafter, block_inputs
from xpress_jax.models.kernels import EINSUM, choose_kernel
from xpress_jax.models.qwen3 import KVCache, Qwen3, write_at

PAD = -1  # fills the output after a sequence stops


class DecodingModels(nnx.Module):
    """Target, drafter and head in one graph, so one split/merge carries them into `jit`."""

    def __init__(self, target: Qwen3, drafter: DFlashDrafter | None = None, head: nnx.Module | None = None):
        self.target = target
        self.drafter = drafter
        self.head = head


TRACED = 0  # DecodeOptions.settings.max_iters: the bound is passed to the loop as an argument


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """Static settings: each distinct value compiles once."""

    decoder: str = "dflash"  # one of methods.DECODERS
    greedy: bool = True
    # cache slots, and the bound of the output buffer: the token budget is a traced argument, so
    # runs that differ only in max_new_tokens share one program (the decode benchmark's 1-token run)
    max_len: int = 0
    # early stop, candidates, D-Loop branches; the Jacobi iteration bound is a traced argument
    # (max_iters here is TRACED), so an iteration sweep runs one program
    settings: DecodeSettings = DecodeSettings()
    # every draft refused: each step commits the target's token from row 0 of the decoder's own
    # verification pass, so this is target-only decoding with the verify pass's shapes (greedy)
    reject_drafts: bool = False
    # temperature > 0: "rejection" (drafts sampled from the drafter, Leviathan et al.'s rule) or
    # "match" (argmax drafts accepted while they equal the target's sampled tokens: the DFlash
    # harness's rule); both are lossless in distribution
    acceptance: str = "rejection"


@struct.dataclass
class DecodeStats:
    steps: jax.Array  # [batch] verification steps
    committed: jax.Array  # [batch] tokens committed by those steps (sum of acc + 1, cut at stops)
    accepted_at: jax.Array  # [batch, B-1] steps whose acceptance reached position k (1-based k = index + 1)
    iterations: jax.Array  # [batch] Jacobi iterations (or serial steps) summed over steps
    # [batch] drafted positions 2..drafted whose token equals the previous drafted token (drafted: the verified
    # drafts, settings.verify_tokens; B-1 by default)
    draft_repeats: jax.Array
    # the same count on the drafter's own one-pass block (argmax s, before any head or second pass),
    # on the same contexts: what the head or D-Loop's second pass started from
    drafter_repeats: jax.Array  # [batch]
    prefix_kept: jax.Array  # [batch] D-Loop: pass-1 tokens kept by the verified branch, summed over steps
    empty_prefix: jax.Array  # [batch] D-Loop: steps whose verified branch kept no prefix (pass 2 = pass 1)
    # [batch, max_len] tokens committed by each verification step (0 after the last); generate
    # returns the first max_new_tokens columns
    per_step: jax.Array


@dataclasses.dataclass
class Generation:
    tokens: list[list[int]]  # generated ids per sequence (stop token included)
    stopped: list[bool]  # ended on a stop token
    stats: dict[str, np.ndarray]  # DecodeStats as numpy arrays

    @property
    def tau(self) -> float:
        """Mean tokens per verification step (acc + 1, bonus included), over the whole batch."""
        steps = self.stats["steps"].sum()
        return float(self.stats["committed"].sum() / steps) if steps else float("nan")


def _is_stop(tokens, stop_ids):
    return jnp.any(tokens[..., None] == stop_ids, axis=-1)


def adjacent_repeats(block):
    """block: [batch, n] -> [batch]: positions 2..n whose token equals the previous one."""
    return jnp.sum(block[:, 1:] == block[:, :-1], axis=1)


def _row(x, index):
    """x: [batch, t, ...], index: [batch] -> x[b, index[b]]."""
    return jnp.take_along_axis(x, index.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]


# ---- the phases of one speculative step; `decoding/profile.py` times these same functions ----

def prefill(target: Qwen3, drafter: DFlashDrafter | None, prompt, prompt_lens, max_len: int, chunk: int = 0):
    """The prompt through the target (cache of max_len slots) and the drafter's context from its taps.
    prompt: [batch, padded] -> (logits of each prompt's last token [batch, 1, vocab], the target's
    KVCache, the drafter's ContextCache or None).

    `chunk` > 0 (dividing `padded`): the prompt goes through in chunks of that many tokens in a
    `lax.scan`, so attention scores and activations are those of one chunk, not of the whole
    prompt. Chunk i is written at slots i*chunk.. for every sequence, where the unchunked pass
    writes it too (prompts are right-padded), and the lengths become the prompts' at the end.
    Where the platform has a fused causal kernel for the whole prompt (`models/kernels.py`), the
    prompt goes through whole: that kernel never holds the scores that chunks bound."""
    batch, padded = prompt.shape
    taps = () if drafter is None else drafter.cfg.target_layer_ids
    cache = KVCache.init(target.cfg, batch, max_len, target.dtype)
    ctx = None if drafter is None else ContextCache.init(drafter.cfg, batch, max_len, target.dtype)
    fused = choose_kernel(padded, padded, target.cfg.head_dim, target.dtype,
                          kv_heads=target.cfg.num_key_value_heads) != EINSUM
    if not chunk or chunk >= padded or fused:
        out = target(prompt, cache=cache, num_new=prompt_lens, tap_layers=taps, logits_at=prompt_lens - 1)
        if drafter is not None:
            ctx = drafter.extend_context(ctx, out.taps, num_new=prompt_lens)
        return out.logits, out.cache, ctx

    def one_chunk(carry, tokens_and_start):
        cache, ctx, logits = carry
        tokens, start = tokens_and_start  # [batch, chunk], the chunk's first slot
        at = jnp.full((batch,), start, jnp.int32)
        last = prompt_lens - 1 - start  # each prompt's last token, relative to this chunk
        out = target(tokens, cache=cache.rollback(at), tap_layers=taps, logits_at=jnp.clip(last, 0, chunk - 1))
        logits = jnp.where(((last >= 0) & (last < chunk))[:, None, None], out.logits, logits)  # [batch, 1, vocab]
        if drafter is not None:
            ctx = drafter.extend_context(ctx.rollback(at), out.taps)
        return (out.cache, ctx, logits), None

    chunks = prompt.reshape(batch, padded // chunk, chunk).swapaxes(0, 1)  # [n_chunks, batch, chunk]
    starts = jnp.arange(0, padded, chunk, dtype=jnp.int32)
    logits = jnp.zeros((batch, 1, target.cfg.vocab_size), jnp.float32)
    (cache, ctx, logits), _ = jax.lax.scan(one_chunk, (cache, ctx, logits), (chunks, starts))
    return logits, cache.rollback(prompt_lens), None if ctx is None else ctx.rollback(prompt_lens)


def draft_block(target: Qwen3, drafter: DFlashDrafter, ctx, last, drafted: int | None = None):
    """One drafter pass over [last, MASK...] (the whole block of B, as trained): base logits s
    [batch, drafted, vocab] of the first `drafted` draft positions (default all n = B-1) and hidden
    states h [batch, n, hidden] of all n (XPress's g averages them all)."""
    block = drafter.cfg.block_size
    hidden = drafter(target.embed(block_inputs(last, block, drafter.cfg.mask_token_id)), ctx)  # [b, B, H]
    drafted = block - 1 if drafted is None else drafted
    return target.logits(hidden[:, 1:1 + drafted]), hidden[:, 1:]


def fold_head(head_name: str | None, head):
    """The per-checkpoint part of a Jacobi head's solve (XPress: W_in folded into W_e, W_h, W_g),
    done once before the decode loop instead of once per block; serial heads pass through, and a
    decoder without a head (head_name None) gets None."""
    if head_name is None:
        return None
    return head.fold() if HEADS[head_name].decode == JACOBI else head


def verify_block(target: Qwen3, tcache, last, draft, taps):
    """One target pass over [last, draft] [batch, B] on top of the committed cache."""
    return target(jnp.concatenate([last[:, None], draft], axis=1), cache=tcache, tap_layers=taps)


def _decode_loop(graphdef, state, prompt, prompt_lens, stop_ids, key, temperature, max_new, max_iters,
                 opts: DecodeOptions):
    models = nnx.merge(graphdef, state)
    settings = dataclasses.replace(opts.settings, max_iters=max_iters)  # [] int32, traced
    target, drafter, head = models.target, models.drafter, models.head
    batch = prompt.shape[0]
    block = drafter.cfg.block_size if DECODERS[opts.decoder].drafter else 1
    n = block - 1
    # the block's first `drafted` positions are drafted (after the drafter's pass over all B), refined and
    # verified: causal heads decide position k from positions < k only, so the first `drafted` of a whole
    # block's draft are exactly these
    drafted = settings.drafted(block)
    taps = () if drafter is None else drafter.cfg.target_layer_ids
    capacity = opts.max_len  # no run commits more tokens than its cache holds; max_new [] int32 is traced

    # prefill: the prompt through the target; its first token; the drafter's context
    last_logits, tcache, ctx = prefill(target, drafter, prompt, prompt_lens, opts.max_len,
                                       settings.prefill_chunk)
    key, k_first = jax.random.split(key)
    last_logits = last_logits[:, 0]  # [batch, vocab]
    if opts.greedy:
        first = jnp.argmax(last_logits, -1).astype(jnp.int32)
    else:
        first = jax.random.categorical(k_first, last_logits / temperature).astype(jnp.int32)
    buf = jnp.full((batch, capacity + block), PAD, jnp.int32).at[:, 0].set(first)
    done = _is_stop(first, stop_ids) | (max_new <= 1)
    stats = DecodeStats(steps=jnp.zeros((batch,), jnp.int32), committed=jnp.zeros((batch,), jnp.int32),
                        accepted_at=jnp.zeros((batch, n), jnp.int32), iterations=jnp.zeros((batch,), jnp.int32),
                        draft_repeats=jnp.zeros((batch,), jnp.int32), drafter_repeats=jnp.zeros((batch,), jnp.int32),
                        prefix_kept=jnp.zeros((batch,), jnp.int32), empty_prefix=jnp.zeros((batch,), jnp.int32),
                        per_step=jnp.zeros((batch, capacity), jnp.int32))
    slots = jnp.arange(drafted + 1, dtype=jnp.int32)  # the verified block: last + drafted tokens

    loop = DECODERS[opts.decoder].loop
    match = opts.acceptance == "match"
    head_name = head_of(opts.decoder)
    head = fold_head(head_name, head)  # hoisted out of the loop: the weights do not change between blocks

    def draft_and_verify(tcache, ctx, last, k_noise, k_accept):
        """-> the verified draft [batch, drafted], acc, the target's next token, the target's output over the
        kept block (cache and taps as if only that block had been run), Jacobi iterations, the
        drafter's one-pass block [batch, drafted] and the verified branch's kept prefix length [batch]."""
        if loop:  # D-Loop drafts its whole two-pass block (its prefix rule reads all of it); `drafted` are verified
            d = loop_draft(target, drafter, ctx, last, settings, head=head)
            branch, acc, nxt, verify = verify_branches(target, tcache, last, d.tokens[:, :, :drafted], key=k_accept,
                                                       temperature=temperature, greedy=opts.greedy, tap_layers=taps,
                                                       reject_drafts=opts.reject_drafts, match=match)
            return (_row(d.tokens, branch)[:, :drafted], acc, nxt, verify, d.iterations, d.one_pass[:, :drafted],
                    _row(d.prefix_len, branch))
        iterations = jnp.zeros((batch,), jnp.int32)
        no_prefix = jnp.zeros((batch,), jnp.int32)
        if n > 0:  # draft: one drafter pass over [last, MASK...], then the head
            s, h = draft_block(target, drafter, ctx, last, drafted)  # [batch, drafted, vocab], [batch, n, hidden]
            noise = None if opts.greedy or match else gumbel_noise(k_noise, s.shape)
            res = refine_block(head_name, head, s, h, last, target.embed, settings=settings,
                               noise=noise, temperature=temperature)
            draft, draft_logits, iterations = res.tokens, res.logits, res.iterations
            one_pass = jnp.argmax(s, axis=-1).astype(jnp.int32)
        else:
            draft = one_pass = jnp.zeros((batch, 0), jnp.int32)
            draft_logits = jnp.zeros((batch, 0, target.cfg.vocab_size), jnp.float32)
        verify = verify_block(target, tcache, last, draft, taps)
        if opts.reject_drafts:  # no draft offered to the acceptance rule: row 0's argmax
            acc, nxt = greedy_accept(draft[:, :0], verify.logits[:, :1])
        elif opts.greedy:
            acc, nxt = greedy_accept(draft, verify.logits)
        elif match:  # the target's sampled token at every row, drafts kept while they equal it
            sampled = verify.logits.astype(jnp.float32) / temperature + gumbel_noise(k_accept, verify.logits.shape)
            acc, nxt = greedy_accept(draft, sampled)
        else:
            acc, nxt = speculative_accept(k_accept, draft, draft_logits, verify.logits, temperature)
        return draft, acc, nxt, verify, iterations, one_pass, no_prefix

    def step(carry):
        tcache, ctx, last, buf, n_out, done, key, stats = carry
        key, k_noise, k_accept = jax.random.split(key, 3)
        draft, acc, nxt, verify, iterations, one_pass, prefix = draft_and_verify(tcache, ctx, last, k_noise, k_accept)

        # the step's new tokens: accepted drafts, then the target's token (slots past acc unused)
        new = jnp.where(slots[None, :] < acc[:, None], jnp.pad(draft, ((0, 0), (0, 1))), nxt[:, None])
        stop_hit = _is_stop(new, stop_ids) & (slots[None, :] <= acc[:, None])
        first_stop = jnp.where(jnp.any(stop_hit, 1), jnp.argmax(stop_hit, 1), block)
        produced = jnp.minimum(jnp.minimum(acc + 1, first_stop + 1), max_new - n_out)
        produced = jnp.where(done, 0, produced)

        buf = write_at(buf, new, n_out)  # writes past n_out + produced are overwritten later
        active = ~done
        done = done | (first_stop < produced) | (n_out + produced >= max_new)
        n_out = n_out + produced
        # commit: keep last + the accepted drafts in both caches; roll back the rest
        new_len = tcache.lengths + produced
        tcache = verify.cache.rollback(new_len)
        if drafter is not None:
            ctx = drafter.extend_context(ctx, verify.taps, num_new=produced)
        last = jnp.where(produced > 0, _row(new, jnp.maximum(produced - 1, 0)), last)
        counted = active.astype(jnp.int32)
        rows, trace_at = jnp.arange(batch), jnp.minimum(stats.steps, capacity - 1)
        stats = DecodeStats(
            steps=stats.steps + counted, committed=stats.committed + produced,
            accepted_at=stats.accepted_at + counted[:, None] * (acc[:, None] > jnp.arange(n)[None, :]),
            iterations=stats.iterations + counted * iterations,
            draft_repeats=stats.draft_repeats + counted * adjacent_repeats(draft),
            drafter_repeats=stats.drafter_repeats + counted * adjacent_repeats(one_pass),
            prefix_kept=stats.prefix_kept + counted * prefix,
            empty_prefix=stats.empty_prefix + (counted * (prefix == 0) if loop else 0),
            per_step=stats.per_step.at[rows, trace_at].set(
                jnp.where(active, produced, stats.per_step[rows, trace_at])))  # one slot, not the row
        return tcache, ctx, last, buf, n_out, done, key, stats

    init = (tcache, ctx, first, buf, jnp.ones((batch,), jnp.int32), done, key, stats)
    _, _, _, buf, n_out, done, _, stats = jax.lax.while_loop(lambda c: ~jnp.all(c[5]), step, init)
    stopped = jnp.any(_is_stop(jnp.where(jnp.arange(buf.shape[1]) < n_out[:, None], buf, PAD), stop_ids), 1)
    return buf, n_out, stopped, stats


_decode = jax.jit(_decode_loop, static_argnames=("graphdef", "opts"))


def check_compatible(models: DecodingModels, decoder: str) -> None:
    if decoder not in DECODERS:
        raise InputError(f"unknown decoder {decoder!r}; choose one of {', '.join(DECODERS)}")
    if not DECODERS[decoder].drafter:
        return
    if models.drafter is None:
        raise InputError(f"head {decoder!r} needs a drafter")
    models.drafter.cfg.check_target(models.target.cfg)
    head = head_of(decoder)
    if head and models.head is None:
        raise InputError(f"decoder {decoder!r} was chosen but no {head} head was given")


def generate(models: DecodingModels, prompts: Sequence[Sequence[int]], *, decoder: str = "dflash",
             max_new_tokens: int = 256, temperature: float = 0.0, seed: int = 0, stop_ids: Sequence[int] = (),
             settings: DecodeSettings | None = None, max_len: int | None = None, pad_multiple: int = 1,
             reject_drafts: bool = False, acceptance: str = "rejection", devices: int = 1, min_rows: int = 0,
             warm_up: bool = False, **knobs) -> Generation:
    """Decodes a batch of prompts (token id lists). temperature 0 is greedy and lossless token for token;
    temperature > 0 is speculative sampling, lossless in distribution. `settings` (or its fields as
    keyword arguments: max_iters, early_stop, top_k, branches) are the decoder's knobs.
    reject_drafts (greedy): the decoder's loop with every draft refused, i.e. target-only decoding
    through this decoder's verification pass (the exact lossless reference, docs/evaluation.md).
    acceptance (temperature > 0): "rejection" or "match" (`DecodeOptions.acceptance`).
    devices > 1 splits the batch over this process's first `devices` devices (decoding/devices.py):
    greedy output is the same; sampling draws from a key per device. Prompts are padded to their
    bucket (`bucket_length`, with `pad_multiple`), and the batch to at least `min_rows` rows with
    copies of prompt 0, so a run's batches share a few compiled programs; calls with one max_len
    share a program whatever their max_new_tokens and max_iters (both are traced). warm_up: compiles
    the program of this call and runs it with a one-token budget (the prefill's token, no
    verification step), so a timed call after it runs compiled without the batch decoded twice."""
    check_compatible(models, decoder)
    mesh, split = batch_mesh(devices), target_mesh(models)
    if mesh is not None and split is not None:
        raise InputError(f"devices={devices} splits the batch, but the target is split over {split.size} devices; "
                         "use one or the other")
    if reject_drafts and temperature > 0:
        raise InputError("reject_drafts is a greedy reference; it needs temperature 0")
    try:
        settings = dataclasses.replace(settings or DecodeSettings(), **knobs)
    except TypeError:
        raise InputError(f"unknown decoding options {sorted(knobs)}; choose from "
                         f"{[f.name for f in dataclasses.fields(DecodeSettings)]}") from None
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise InputError(f"temperature must be >= 0, got {temperature}")
    if acceptance not in ACCEPTANCE_RULES:
        raise InputError(f"acceptance must be one of {', '.join(ACCEPTANCE_RULES)}, got {acceptance!r}")
    ids, lengths = pad_prompts(prompts, multiple=pad_multiple, chunk=settings.prefill_chunk)
    vocab = models.target.cfg.vocab_size
    if ids.max() >= vocab or ids.min() < 0:
        raise InputError(f"prompt token ids must lie in [0, {vocab}), got {ids.min()}..{ids.max()}")
    block = models.drafter.cfg.block_size if DECODERS[decoder].drafter else 1
    settings.check(decoder, block)
    branches = settings.branches
    width = block * branches  # the tokens one verification writes past the committed ones
    need = int(lengths.max()) + max_new_tokens + width
    max_len = max_len or ids.shape[1] + max_new_tokens + width
    if need > max_len:
        raise InputError(f"the longest prompt has {int(lengths.max())} tokens; with max_new_tokens={max_new_tokens} "
                         f"and {branches} block(s) of {block} it needs {need} cache slots but the cache holds {max_len}")
    max_len = max(max_len, ids.shape[1])  # the padded prefill must fit too
    opts = DecodeOptions(decoder=decoder, greedy=temperature == 0, max_len=max_len,
                         settings=dataclasses.replace(settings, max_iters=TRACED), reject_drafts=reject_drafts,
                         acceptance=acceptance if temperature > 0 else "rejection")
    graphdef, state = nnx.split(models)
    args = (jnp.asarray(list(stop_ids), jnp.int32), jax.random.key(seed),
            jnp.float32(temperature if temperature > 0 else 1.0), jnp.int32(1 if warm_up else max_new_tokens),
            jnp.int32(settings.max_iters))
    rows = len(prompts)
    extra = [0] * (round_up(max(rows, min_rows), mesh.size if mesh is not None else 1) - rows)
    ids, lengths = np.concatenate([ids, ids[extra]]), np.concatenate([lengths, lengths[extra]])
    if split is not None:
        buf, n_out, stopped, stats = decode_tensor_split(_decode_loop, graphdef, state, jnp.asarray(ids),
                                                         jnp.asarray(lengths), *args, opts, split)
    elif mesh is None:
        buf, n_out, stopped, stats = _decode(graphdef, state, jnp.asarray(ids), jnp.asarray(lengths), *args, opts)
    else:  # every device gets as many rows
        buf, n_out, stopped, stats = decode_batch_split(_decode_loop, graphdef, replicate(state, mesh),
                                                        jnp.asarray(ids), jnp.asarray(lengths), *args, opts, mesh)
    buf, n_out = np.asarray(buf), np.asarray(n_out)
    return Generation(tokens=[buf[i, :n_out[i]].tolist() for i in range(rows)],
                      stopped=[bool(s) for s in np.asarray(stopped)[:rows]],
                      stats={k: np.asarray(v)[:rows, :max_new_tokens] if k == "per_step" else np.asarray(v)[:rows]
                             for k, v in dataclasses.asdict(stats).items()})


def generate_greedy(target: Qwen3, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                    stop_ids: Sequence[int] = (), max_len: int | None = None) -> Generation:
    """Target-only greedy decoding (the baseline), through the same loop."""
    return generate(DecodingModels(target), prompts, decoder="target", max_new_tokens=max_new_tokens,
                    stop_ids=stop_ids, max_len=max_len)
