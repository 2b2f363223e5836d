"""Continuous batching for greedy target-only decoding (regeneration): `rows` sequences of KV
cache serve a queue of prompts inside one jitted `lax.while_loop`. A row whose answer ends takes
the next prompt at once (prefilled into that row), so no row waits for the longest answer of its
batch as in a static batch, where a finished row decodes padding until every row is done.

Each prompt is prefilled alone, the same `prefill` the static loop runs, padded to its own
bucket (`padding.prompt_buckets`: a `lax.switch` over the buckets up to the queue's longest, one
compiled prefill each), not to the longest prompt's in the queue: an admission costs what its
prompt needs while every other row waits (`admit_at="queue"` pads every prompt to the queue's
bucket, for comparison). Every step decodes one token for every row through the same one-token
verification pass, so the tokens are those of static greedy decoding (tested). Rows without a prompt still compute (static
shapes); `Served.slots` counts them, so `useful / slots` is the share of decode work that made
answer tokens.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from xpress_jax.decoding.devices import AXIS, batch_mesh, replicate
from xpress_jax.decoding.padding import PROMPT_BUCKET, bucket_length, pad_prompts, prompt_buckets, round_up
from xpress_jax.decoding.speculative import PAD, _is_stop, prefill, verify_block
from xpress_jax.errors import InputError
from xpress_jax.models.qwen3 import KVCache, Qwen3


class Served(NamedTuple):
    tokens: list[list[int]]  # each prompt's answer, in queue order
    steps: int  # decode steps (every row decodes one token per step), summed over devices
    slots: int  # steps x rows: the decode work done
    useful: int  # answer tokens those steps made (each answer's first token comes from its prefill)


OWN_BUCKET, QUEUE_BUCKET = "own", "queue"  # what an admitted prompt is padded to


def _serve_loop(graphdef, state, queue, queue_lens, queue_buckets, count, stop_ids, max_new, *, rows: int,
                capacity: int, max_len: int, chunk: int, buckets: tuple[int, ...]):
    """queue [n, padded], queue_lens [n]: the first `count` prompts are served by `rows` rows, each
    prefilled at its bucket: buckets[queue_buckets[i]] tokens.
    -> (answers [n, capacity] padded with PAD, decode steps, useful decode tokens)."""
    target = nnx.merge(graphdef, state)
    n = queue.shape[0]
    answers = jnp.full((n, capacity), PAD, jnp.int32)  # an answer's length is its count of non-PAD tokens
    cache = KVCache.init(target.cfg, rows, max_len, target.dtype)
    serving = jnp.full((rows,), n, jnp.int32)  # the queue index a row serves (n: none; writes are dropped)
    n_out = jnp.zeros((rows,), jnp.int32)
    last = jnp.zeros((rows,), jnp.int32)
    active = jnp.zeros((rows,), bool)

    def admit(carry):
        """The first free row takes the next prompt: its prefill, its first token."""
        cache, serving, n_out, last, active, answers, nxt = carry
        r = jnp.argmin(active)  # a free row (False sorts first)

        def prefill_at(length):  # one compiled prefill per bucket: [1, length] tokens
            return lambda row, n: prefill(target, None, row[None, :length], n[None], max_len, chunk)[:2]
        logits, one = jax.lax.switch(queue_buckets[nxt], [prefill_at(b) for b in buckets], queue[nxt], queue_lens[nxt])
        first = jnp.argmax(logits[0, 0], -1).astype(jnp.int32)
        ends = _is_stop(first, stop_ids) | (max_new <= 1)
        return (cache.put_sequence(r, one), serving.at[r].set(nxt), n_out.at[r].set(1), last.at[r].set(first),
                active.at[r].set(~ends), answers.at[nxt, 0].set(first), nxt + 1)

    def can_admit(carry):
        active, nxt = carry[4], carry[6]
        return (nxt < count) & ~jnp.all(active)

    def step(carry):
        *inner, steps, useful = carry
        cache, serving, n_out, last, active, answers, nxt = jax.lax.while_loop(can_admit, admit, tuple(inner))
        out = verify_block(target, cache, last, jnp.zeros((rows, 0), jnp.int32), ())  # one token per row
        tok = jnp.argmax(out.logits[:, 0], -1).astype(jnp.int32)  # [rows]
        cache = out.cache.rollback(cache.lengths + active)  # an idle row's write is discarded
        where = jnp.where(active, serving, n)  # idle rows write out of bounds: dropped
        answers = answers.at[where, jnp.minimum(n_out, capacity - 1)].set(tok, mode="drop")
        n_out = n_out + active
        last = jnp.where(active, tok, last)
        useful = useful + jnp.sum(active)
        was_active = active  # a step after admissions that all ended at their first token decodes nothing
        active = active & ~_is_stop(tok, stop_ids) & (n_out < max_new)
        return cache, serving, n_out, last, active, answers, nxt, steps + jnp.any(was_active), useful

    def going(carry):
        return jnp.any(carry[4]) | (carry[6] < count)

    zero = jnp.int32(0)
    init = (cache, serving, n_out, last, active, answers, zero, zero, zero)
    *_, answers, _, steps, useful = jax.lax.while_loop(going, step, init)
    return answers, steps[None], useful[None]


_STATICS = ("graphdef", "rows", "capacity", "max_len", "chunk", "buckets")
_serve = jax.jit(_serve_loop, static_argnames=_STATICS)


@functools.partial(jax.jit, static_argnames=_STATICS + ("mesh",))
def _serve_split(graphdef, state, queue, queue_lens, queue_buckets, counts, stop_ids, max_new, *, mesh, **statics):
    """Each device of `mesh` serves its contiguous share of the queue (its first counts[d] prompts)
    with `rows` rows of its own."""
    def local(state, queue, queue_lens, queue_buckets, count, stop_ids, max_new):
        return _serve_loop(graphdef, state, queue, queue_lens, queue_buckets, count[0], stop_ids, max_new, **statics)
    split = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P(AXIS), P(AXIS), P(), P()),
                          out_specs=P(AXIS), check_vma=False)  # each device's loop ends when its own queue is served
    return split(state, queue, queue_lens, queue_buckets, counts, stop_ids, max_new)


def admission_buckets(lengths: Sequence[int], admit_at: str = OWN_BUCKET, chunk: int = 512) -> tuple[list[int], list[int]]:
    """The padded lengths an admission compiles (ascending) and each prompt's index among them: its
    own bucket, or (`admit_at="queue"`) the longest prompt's for every prompt."""
    if admit_at not in (OWN_BUCKET, QUEUE_BUCKET):
        raise InputError(f"admit_at must be {OWN_BUCKET!r} or {QUEUE_BUCKET!r}, got {admit_at!r}")
    longest = bucket_length(max(lengths), PROMPT_BUCKET, chunk)
    if admit_at == QUEUE_BUCKET:
        return [longest], [0] * len(lengths)
    buckets = [b for b in prompt_buckets(max(lengths), PROMPT_BUCKET, chunk) if b <= longest]
    return buckets, [buckets.index(bucket_length(n, PROMPT_BUCKET, chunk)) for n in lengths]


def serve_greedy(target: Qwen3, prompts: Sequence[Sequence[int]], *, rows: int, max_new_tokens: int,
                 stop_ids: Sequence[int] = (), devices: int = 1, prefill_chunk: int = 512,
                 queue_multiple: int = 64, admit_at: str = OWN_BUCKET) -> Served:
    """Greedy answers to `prompts` from `rows` rows per device, each row taking the next prompt
    as soon as its answer ends, prefilled at its own bucket (`admit_at`: `admission_buckets`).
    The queue is padded to a multiple of `queue_multiple` per device (never served), so a run
    compiles once per queue size and longest bucket."""
    if rows < 1 or max_new_tokens < 1:
        raise InputError(f"rows and max_new_tokens must be >= 1, got {rows} and {max_new_tokens}")
    mesh = batch_mesh(devices)
    ids, lens = pad_prompts(prompts, multiple=PROMPT_BUCKET, chunk=prefill_chunk)
    buckets, bucket_of = admission_buckets(lens.tolist(), admit_at, prefill_chunk)
    if ids.max() >= target.cfg.vocab_size or ids.min() < 0:
        raise InputError(f"prompt token ids must lie in [0, {target.cfg.vocab_size}), got {ids.min()}..{ids.max()}")
    count = len(prompts)
    # contiguous shares per device, dealt round-robin first so each gets a mix of the queue
    order = np.concatenate([np.arange(d, count, devices) for d in range(devices)])
    sizes = [len(range(d, count, devices)) for d in range(devices)]  # prompts per device
    share = round_up(max(sizes), queue_multiple)
    queue = np.zeros((devices * share, ids.shape[1]), np.int32)
    queue_lens = np.ones((devices * share,), np.int32)
    queue_buckets = np.zeros((devices * share,), np.int32)
    at = np.concatenate([np.arange(size) + d * share for d, size in enumerate(sizes)])
    queue[at], queue_lens[at], queue_buckets[at] = ids[order], lens[order], np.asarray(bucket_of)[order]
    max_len = ids.shape[1] + max_new_tokens + 1
    graphdef, state = nnx.split(target)
    statics = dict(rows=rows, capacity=max_new_tokens, max_len=max_len, chunk=prefill_chunk, buckets=tuple(buckets))
    args = (jnp.asarray(queue), jnp.asarray(queue_lens), jnp.asarray(queue_buckets))
    rest = (jnp.asarray(list(stop_ids), jnp.int32), jnp.int32(max_new_tokens))
    if mesh is None:
        answers, steps, useful = _serve(graphdef, state, *args, jnp.int32(count), *rest, **statics)
    else:
        answers, steps, useful = _serve_split(graphdef, replicate(state, mesh), *args, jnp.asarray(sizes, jnp.int32),
                                              *rest, mesh=mesh, **statics)
    answers = np.asarray(answers)
    tokens = [None] * count
    for i, slot in zip(order, at):
        tokens[i] = answers[slot][answers[slot] != PAD].tolist()
    return Served(tokens=tokens, steps=int(np.sum(steps)), slots=int(np.sum(steps)) * rows,
                  useful=int(np.sum(useful)))


DEFAULT_ROWS = 8  # per device, where the device does not report its memory (CPUs)
MAX_ROWS = 256


def rows_that_fit(target: Qwen3, max_len: int, device=None, fraction: float = 0.8) -> int:
    """Rows of `max_len` cache slots one device holds beside the target's weights, within `fraction`
    of the memory it reports (a multiple of 8 from 8 on, at most MAX_ROWS); DEFAULT_ROWS where it
    reports none. Per row: the keys and values of every layer, and the step's float32 logits."""
    device = device or jax.local_devices()[0]
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    if not limit:
        return DEFAULT_ROWS
    cfg = target.cfg
    weights = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(nnx.state(target)))
    per_row = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * max_len
               * jnp.dtype(target.dtype).itemsize + 4 * cfg.vocab_size)
    rows = int((fraction * limit - weights) // per_row)
    rows = rows // 8 * 8 if rows >= 8 else rows
    if rows < 1:
        raise InputError(f"the target ({weights / 2**30:.1f} GiB) and one row of {max_len} cache slots do not fit in "
                         f"{fraction:.0%} of the device's {limit / 2**30:.1f} GiB; split the target (--tensor_parallel)")
    return min(rows, MAX_ROWS)
