"""The `e2e` suite: the costs that only mean something on trained weights, on the tiny
reproduction's checkpoints (`python -m xpress_jax.reproduce --config=configs/tiny_repro.py`, in runs/repro).

1. Tokens/s of every trained method against target-only decoding, in one evaluation run.
2. The heads on the frozen DFlash drafter's real blocks (GSM8K test prompts, the target's own
   continuations): how many Jacobi iterations early stop uses, and the latency of each head's
   solve side by side (Markov and GRU serial, exact XPress at 4 iterations, early stop, candidate mode).
3. Candidate mode against the exact refiner at the same iteration count: token agreement and tau.
4. What one speculative step costs against one target-only step. In the decode loop: each method's
   break-even tau, its time per verification step over the target's time per token (the tau at
   which it would match target-only decoding here). Apart, as separately dispatched calls: a
   target pass over w tokens for w = 1 (target-only decoding's step) up to the block
   (verification), and one drafter pass.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax.decoding.jacobi import token_agreement
from xpress_jax.decoding.profile import jit_on_state
from xpress_jax.timing import median_seconds
from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodingModels, draft_block, prefill, verify_block
from xpress_jax.errors import InputError

# the heads compared on one drafter's blocks: all three were trained on the frozen dflash/ drafter
SAME_DRAFTER = {"markov": "markov", "gru": "gru", "xpress": "xpress.frozen"}


def _check_run(config, run: str) -> None:
    from xpress_jax.reproduce.stages import TRAIN_STAGES, available
    missing = [s for s in ("target", *TRAIN_STAGES) if not available(config, run, s)]
    if missing:
        raise InputError(f"{run}: stages {missing} are not done; run python -m xpress_jax.reproduce first "
                         f"(or point --run_dir at a finished reproduction)")


def suite(config, run: str, out_dir: str, *, num_prompts: int = 8, max_new_tokens: int = 128, top_k: int = 8,
          batches=(1, 8), reps: int = 5) -> dict:
    from xpress_jax.models.build import build_drafter, build_head, build_target
    from xpress_jax.decoding.speculative import generate_greedy
    from xpress_jax.eval.candidates import anchored_sequences, drafter_blocks
    from xpress_jax.eval.evaluate import encode_prompts, evaluate
    from xpress_jax.eval.settings import EvalSettings
    from xpress_jax.data.questions import load_questions
    from xpress_jax.reproduce.stages import export_dir, stage_config, trained_methods

    _check_run(config, run)
    c = stage_config(config, run, "eval")
    settings = dataclasses.replace(
        EvalSettings.from_config(c.eval), datasets=("gsm8k",), num_prompts=num_prompts, max_new_tokens=max_new_tokens,
        temperature=0.0, iteration_sweep=(), candidate_k=top_k, time_split=False, dloop_branches=(1,),
        out_dir=os.path.join(out_dir, "e2e-eval"))
    report, failures = evaluate(c, trained_methods(config, run, (1,)), settings, check_lossless=True)
    rows = report["results"]["gsm8k"]
    out = {"run_dir": run, "prompts": num_prompts, "max_new_tokens": max_new_tokens, "lossless_failures": failures,
           "decode": {label: {**{k: r[k] for k in ("tau", "tokens_per_s", "speedup", "mean_iterations")},
                              "break_even_tau": r["tau"] * rows["target"]["tokens_per_s"] / r["tokens_per_s"]}
                      for label, r in rows.items()},
           "candidate": {label: r["candidate"] for label, r in rows.items() if "candidate" in r}}

    # real blocks of the frozen dflash/ drafter, at every position of the target's own continuations
    target = build_target(c)
    drafter = build_drafter(c, target, export_dir(config, run, "dflash"))
    heads = {name: build_head(name, c, drafter.cfg, export_dir(config, run, stage))
             for name, stage in SAME_DRAFTER.items()}
    prompts, _, stops = encode_prompts(c, load_questions("gsm8k", num_prompts), c.eval.max_prompt_tokens)
    continuations = generate_greedy(target, prompts, max_new_tokens=max_new_tokens, stop_ids=stops).tokens
    blocks_of = drafter_blocks(DecodingModels(target, drafter))
    parts = [blocks_of(ids, anchors) for ids, anchors, _ in anchored_sequences(list(zip(prompts, continuations)), 32)]
    s, h, last = (np.concatenate([np.asarray(p[i]) for p in parts]) for i in range(3))  # [blocks, n, ...]
    table = target.embed_tokens.get_value()  # [vocab, hidden]: the GRU head embeds x_{k-1} with it

    def solver(name, **knobs):
        settings = DecodeSettings(**knobs)
        graph, weights = nnx.split(heads[name])
        return jax.jit(lambda w, tab, s, h, a: refine_block(
            name, nnx.merge(graph, w), s, h, a, lambda ids: jnp.take(tab, ids, axis=0), settings=settings)), weights

    variants = {"markov": solver("markov"), "gru": solver("gru"),
                "xpress_it4": solver("xpress", max_iters=4, early_stop=False),
                "xpress_it4_early_stop": solver("xpress", max_iters=4, early_stop=True),
                "xpress_it15_early_stop": solver("xpress", max_iters=15, early_stop=True),
                f"xpress_it4_top{top_k}": solver("xpress", max_iters=4, early_stop=False, top_k=top_k)}
    every = {name: fn(w, table, s, h, last) for name, (fn, w) in variants.items()}  # all blocks at once
    out["real_blocks"] = {
        "blocks": int(s.shape[0]),
        "early_stop_iterations": {name: float(np.mean(np.asarray(every[name].iterations)))
                                  for name in ("xpress_it4_early_stop", "xpress_it15_early_stop")},
        "candidate_agreement_it4": float(token_agreement(every["xpress_it4"].tokens, every[f"xpress_it4_top{top_k}"].tokens)),
        "by_batch": {}}
    for batch in batches:
        if batch > s.shape[0]:
            continue
        args = (table, s[:batch], h[:batch], last[:batch])
        seconds = {name: median_seconds(fn, w, *args, reps=reps) for name, (fn, w) in variants.items()}
        out["real_blocks"]["by_batch"][str(batch)] = {
            "seconds": seconds, "ratio_to_markov": {k: v / seconds["markov"] for k, v in seconds.items()}}
    out["step_costs"] = step_costs(DecodingModels(target, drafter), prompts[0], max_len=len(prompts[0]) + max_new_tokens
                                   + drafter.cfg.block_size, reps=reps)
    return out


def step_costs(models: DecodingModels, prompt: list[int], *, max_len: int, reps: int) -> dict:
    """Batch 1, on the cache of one real prompt: the target pass over w tokens (w = 1 is one step of
    target-only decoding, w = block one verification) and one drafter pass. Each is its own jitted
    call, so each also carries the per-call dispatch that the decode loop does not pay."""
    graphdef, state = nnx.split(models)
    merged = functools.partial(jit_on_state, graphdef)
    taps = models.drafter.cfg.target_layer_ids
    ids, lengths = jnp.asarray([prompt], jnp.int32), jnp.asarray([len(prompt)], jnp.int32)
    _, cache, ctx = merged(lambda m, ids, lengths: prefill(m.target, m.drafter, ids, lengths, max_len))(state, ids, lengths)
    last = ids[:, -1]
    verify_fn = merged(lambda m, cache, last, draft: verify_block(m.target, cache, last, draft, taps).logits)
    draft_fn = merged(lambda m, ctx, last: draft_block(m.target, m.drafter, ctx, last)[0])
    block = models.drafter.cfg.block_size
    widths = sorted({w for w in (1, 2, 4, 8, block) if w <= block})
    target_pass = {str(w): median_seconds(verify_fn, state, cache, last, jnp.zeros((1, w - 1), jnp.int32),
                                          reps=reps) for w in widths}
    draft = median_seconds(draft_fn, state, ctx, last, reps=reps)
    return {"prompt_tokens": len(prompt), "cache_slots": max_len, "target_pass_s": target_pass, "draft_s": draft,
            "verify_over_target_step": target_pass[str(block)] / target_pass["1"]}


def projected_early_stop(heads_result: dict, iterations: float) -> dict:
    """Exact XPress at the measured mean early-stop iteration count, read off the heads suite's
    latency-vs-iterations line at the config's shapes (linear between measured counts), against Markov."""
    out = {}
    for batch, r in heads_result["batches"].items():
        ks = sorted(int(k[len("xpress_K"):]) for k in r["seconds"] if k[len("xpress_K"):].isdigit())
        at_k = np.interp(iterations, ks, [r["seconds"][f"xpress_it{k}"] for k in ks])
        out[batch] = {"iterations": iterations, "seconds": float(at_k),
                      "ratio_to_markov": float(at_k / r["seconds"]["markov"])}
    return out
