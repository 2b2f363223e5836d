"""Where a speculative step spends its time: the engine's own phases (`speculative.prefill`,
`draft_block`, `fold_head`, `refine_block`, `verify_block`; `dloop.loop_draft` and
`verify_branches`), each compiled separately and timed on the same inputs (no host sync is ever
put inside the decode loop)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from xpress_jax.decoding.dloop import loop_draft, verify_branches
from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.padding import pad_prompts
from xpress_jax.decoding.speculative import DecodingModels, draft_block, fold_head, prefill, verify_block
from xpress_jax.methods import DECODERS, head_of
from xpress_jax.timing import median_seconds


def jit_on_state(graphdef, fn):
    """fn(models, *args) as a jitted function of the models' state: jit_on_state(g, fn)(state, *args)."""
    return jax.jit(lambda state, *args: fn(nnx.merge(graphdef, state), *args))


def component_times(models: DecodingModels, prompt: list[int], *, decoder: str, max_new_tokens: int,
                    settings: DecodeSettings = DecodeSettings(), reps: int = 5,
                    pad_multiple: int = 1) -> dict[str, float]:
    """Seconds per call: prefill (the prompt), draft (one drafter block + the base logits of the
    drafted positions), fold (the head's once-per-checkpoint weight fold, which the decode loop
    does before its first block), refine (the head's per-block solve on folded weights) and verify
    (one target pass over the drafted positions: the block's first settings.verify_tokens, all by
    default). For the D-Loop decoders, draft is the engine's whole two-pass draft (with the refiner
    for dloop+xpress; refine is then 0) and verify the engine's joint pass over the K branches."""
    drafter = models.drafter
    spec = DECODERS[decoder]
    head_name = head_of(decoder)
    block = drafter.cfg.block_size if spec.drafter else 1
    verified = settings.drafted(block)  # the draft tokens the target's pass reads
    ids, lengths = pad_prompts([prompt], multiple=pad_multiple)
    max_len = ids.shape[1] + max_new_tokens + block * settings.branches
    taps = () if drafter is None else drafter.cfg.target_layer_ids
    graphdef, state = nnx.split(models)
    merged = functools.partial(jit_on_state, graphdef)

    prefill_fn = merged(lambda m, ids, lengths: prefill(m.target, m.drafter, ids, lengths, max_len))
    draft_fn = merged(lambda m, last, ctx: draft_block(m.target, m.drafter, ctx, last, verified))
    fold_fn = merged(lambda m: fold_head(head_name, m.head))
    refine_fn = jax.jit(lambda folded, embed_state, s, h, last: refine_block(
        head_name, folded, s, h, last, nnx.merge(graphdef, embed_state).target.embed, settings=settings).tokens)
    verify_fn = merged(lambda m, cache, last, draft: verify_block(m.target, cache, last, draft, taps))
    loop_draft_fn = merged(lambda m, last, ctx: loop_draft(m.target, m.drafter, ctx, last, settings,
                                                           head=fold_head(head_name, m.head)).tokens)
    loop_verify_fn = merged(lambda m, cache, last, drafts: verify_branches(
        m.target, cache, last, drafts, key=jax.random.key(0), temperature=1.0, greedy=True, tap_layers=taps)[1:])

    ids, lengths = jnp.asarray(ids), jnp.asarray(lengths)
    times = {"prefill_s": median_seconds(prefill_fn, state, ids, lengths, reps=reps), "fold_s": 0.0}
    _, cache, ctx = prefill_fn(state, ids, lengths)
    last = ids[:, -1]
    if spec.loop:
        times["draft_s"] = median_seconds(loop_draft_fn, state, last, ctx, reps=reps)
        drafts = loop_draft_fn(state, last, ctx)[:, :, :verified]
        times["refine_s"] = 0.0
        times["verify_s"] = median_seconds(loop_verify_fn, state, cache, last, drafts, reps=reps)
        return times
    draft = jnp.zeros((1, 0), jnp.int32)
    if spec.drafter:
        times["draft_s"] = median_seconds(draft_fn, state, last, ctx, reps=reps)
        s, h = draft_fn(state, last, ctx)
        if head_name is not None:
            times["fold_s"] = median_seconds(fold_fn, state, reps=reps)
        folded = fold_fn(state)
        times["refine_s"] = median_seconds(refine_fn, folded, state, s, h, last, reps=reps)
        draft = refine_fn(folded, state, s, h, last)
    else:
        times["draft_s"] = times["refine_s"] = 0.0
    times["verify_s"] = median_seconds(verify_fn, state, cache, last, draft, reps=reps)
    return times
