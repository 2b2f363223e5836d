"""Where a speculative step spends its time: prefill, draft, refine and verify, each compiled
separately and timed on the same inputs (no host sync is ever put inside the decode loop)."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax.decoding.dloop import loop_draft, verify_branches
from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import LOOP_DECODERS, DecodeSettings
from xpress_jax.decoding.speculative import SpecModels, pad_prompts
from xpress_jax.models.drafter import ContextCache, block_inputs
from xpress_jax.models.qwen3 import KVCache


def _median_seconds(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def component_times(models: SpecModels, prompt: list[int], *, decoder: str, max_new_tokens: int,
                    settings: DecodeSettings = DecodeSettings(), reps: int = 5,
                    pad_multiple: int = 1) -> dict[str, float]:
    """Seconds per call: prefill (the prompt), draft (one drafter block + base logits), refine (the
    head's solve) and verify (one target pass over the block). For the D-Loop decoders, draft is
    the engine's whole two-pass draft (with the refiner for dloop+xpress; refine is then 0) and
    verify the engine's joint pass over the K branches."""
    drafter = models.drafter
    block = 1 if decoder == "target" else drafter.cfg.block_size
    ids, lengths = pad_prompts([prompt], multiple=pad_multiple)
    max_len = ids.shape[1] + max_new_tokens + block * settings.branches
    taps = () if drafter is None else drafter.cfg.target_layer_ids
    graphdef, state = nnx.split(models)

    @functools.partial(jax.jit, static_argnums=0)
    def prefill(graphdef, state, ids, lengths):
        m = nnx.merge(graphdef, state)
        out = m.target(ids, cache=KVCache.init(m.target.cfg, 1, max_len, m.target.dtype), num_new=lengths,
                       tap_layers=taps)
        ctx = None
        if m.drafter is not None:
            ctx = m.drafter.extend_context(ContextCache.init(m.drafter.cfg, 1, max_len, m.target.dtype),
                                           out.taps, num_new=lengths)
        return out.cache, ctx

    @functools.partial(jax.jit, static_argnums=0)
    def draft(graphdef, state, last, ctx):
        m = nnx.merge(graphdef, state)
        hidden = m.drafter(m.target.embed(block_inputs(last, block, m.drafter.cfg.mask_token_id)), ctx)
        return hidden[:, 1:], m.target.logits(hidden[:, 1:])

    @functools.partial(jax.jit, static_argnums=0)
    def refine(graphdef, state, s, h, last):
        m = nnx.merge(graphdef, state)
        return refine_block(decoder, m.head, s, h, last, m.target.embed, settings=settings).tokens

    @functools.partial(jax.jit, static_argnums=0)
    def verify(graphdef, state, tokens, cache):
        m = nnx.merge(graphdef, state)
        out = m.target(tokens, cache=cache, tap_layers=taps)
        return out.logits, out.taps

    @functools.partial(jax.jit, static_argnums=0)
    def loop_draft_tokens(graphdef, state, last, ctx):
        m = nnx.merge(graphdef, state)
        return loop_draft(m.target, m.drafter, ctx, last, settings,
                          head=m.head if decoder == "dloop+xpress" else None).tokens

    @functools.partial(jax.jit, static_argnums=0)
    def loop_verify(graphdef, state, last, drafts, cache):
        m = nnx.merge(graphdef, state)
        _, acc, nxt, out = verify_branches(m.target, cache, last, drafts, key=jax.random.key(0), temperature=1.0,
                                           greedy=True, tap_layers=taps)
        return acc, nxt, out.cache, out.taps

    ids, lengths = jnp.asarray(ids), jnp.asarray(lengths)
    times = {"prefill_s": _median_seconds(prefill, graphdef, state, ids, lengths, reps=reps)}
    cache, ctx = prefill(graphdef, state, ids, lengths)
    last = ids[:, -1]
    if decoder in LOOP_DECODERS:
        times["draft_s"] = _median_seconds(loop_draft_tokens, graphdef, state, last, ctx, reps=reps)
        drafts = loop_draft_tokens(graphdef, state, last, ctx)
        times["refine_s"] = 0.0
        times["verify_s"] = _median_seconds(loop_verify, graphdef, state, last, drafts, cache, reps=reps)
        return times
    tokens = last[:, None]
    if block > 1:
        times["draft_s"] = _median_seconds(draft, graphdef, state, last, ctx, reps=reps)
        h, s = draft(graphdef, state, last, ctx)
        times["refine_s"] = _median_seconds(refine, graphdef, state, s, h, last, reps=reps)
        tokens = jnp.concatenate([tokens, refine(graphdef, state, s, h, last)], axis=1)
    else:
        times["draft_s"] = times["refine_s"] = 0.0
    times["verify_s"] = _median_seconds(verify, graphdef, state, tokens, cache, reps=reps)
    return times
