"""XPress candidate mode (each position restricted to the drafter's top-k) against the exact
refiner, on the drafter's real blocks: how often the two draft the same tokens."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.padding import PROMPT_BUCKET, round_up
from xpress_jax.decoding.speculative import DecodingModels
from xpress_jax.models.drafter import block_inputs


def drafter_blocks(models: DecodingModels):
    """A jitted (ids [1, T], anchors [1, A]) -> (s [A, n, vocab], h [A, n, hidden], last [A]): the
    drafter's real blocks at the given anchors of a known sequence, in one pass (training mode).
    The weights are arguments of the compiled function, not constants baked into it."""
    graphdef, state = nnx.split(models)
    block, feat = models.drafter.cfg.block_size, tuple(models.drafter.cfg.target_layer_ids)

    @jax.jit
    def blocks(state, ids, anchors):
        m = nnx.merge(graphdef, state)
        taps = m.target(ids, tap_layers=feat, return_logits=False).taps  # [1, T, n_feat, hidden]
        last = jnp.take_along_axis(ids, anchors, 1)  # [1, A]
        h = m.drafter.train_blocks(taps, m.target.embed(block_inputs(last, block, m.drafter.cfg.mask_token_id)),
                                   anchors)[0, :, 1:]  # [A, n, hidden]
        return m.target.logits(h), h, last[0]
    return lambda ids, anchors: blocks(state, ids, anchors)


def anchored_sequences(sequences: list[tuple[list[int], list[int]]], max_blocks: int):
    """For each (prompt, output): padded ids [1, T], anchors [1, max_blocks] (every position the
    decoder would draft from, then repeats of the last) and how many anchors are real."""
    for prompt, output in sequences:
        ids = np.asarray(prompt + output, np.int32)
        starts = np.arange(len(prompt) - 1, len(ids) - 1)[:max_blocks]
        if not len(starts):
            continue
        pad = round_up(len(ids), PROMPT_BUCKET)
        ids_p = np.zeros((1, pad), np.int32)
        ids_p[0, :len(ids)] = ids
        anchors = np.full((1, max_blocks), starts[-1], np.int32)
        anchors[0, :len(starts)] = starts
        yield jnp.asarray(ids_p), jnp.asarray(anchors), len(starts)


def candidate_mode_agreement(models: DecodingModels, sequences: list[tuple[list[int], list[int]]],
                             settings: DecodeSettings, *, top_k: int, max_blocks: int = 64) -> dict:
    """How often candidate mode (top-k) drafts what the exact refiner drafts, on the drafter's real
    blocks: for each (prompt, target output) the drafter proposes a block at every position of the
    output (the training-mode anchored pass), and both refiners solve it with the same iteration count."""
    blocks_of = drafter_blocks(models)
    graphdef, state = nnx.split(models)
    n = models.drafter.cfg.block_size - 1

    @jax.jit
    def agreement(state, s, h, last):
        m = nnx.merge(graphdef, state)
        exact, cand = (refine_block("xpress", m.head, s, h, last, m.target.embed,
                                    settings=dataclasses.replace(settings, top_k=k)) for k in (0, top_k))
        same = exact.tokens == cand.tokens  # [A, n]
        return jnp.sum(same, -1), jnp.all(same, -1)  # per anchor

    agree = blocks = positions = whole = 0
    for ids, anchors, real in anchored_sequences(sequences, max_blocks):
        a, w = agreement(state, *blocks_of(ids, anchors))
        agree += int(np.asarray(a)[:real].sum())  # padded anchors (repeats of the last) not counted
        whole += int(np.asarray(w)[:real].sum())
        positions += real * n
        blocks += real
    return {"top_k": top_k, "max_iters": settings.max_iters, "blocks": blocks,
            "token_agreement": round(agree / positions, 5) if positions else None,
            "block_agreement": round(whole / blocks, 5) if blocks else None}
