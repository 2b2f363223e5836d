"""Evaluation as a library: methods (label -> decoder + checkpoint), decoding every prompt of
each dataset, the metrics (tau over steps and per prompt, per-position acceptance, repetition,
tokens/s, speedup over target-only in the same run), results.json, results.md and plots.
`python -m xpress_jax.eval` and the reproduction pipeline both call `evaluate`."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from xpress_jax import files, plots
from xpress_jax.assemble import build_drafter, build_head, build_target, describe_checkpoint, target_config
from xpress_jax.data.questions import load_questions
from xpress_jax.decoding.profile import component_times
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import SpecModels, generate
from xpress_jax.errors import InputError
from xpress_jax.methods import DECODERS, SPEC_DECODERS
from xpress_jax.significance import paired_tau_ratio

log = logging.getLogger("xpress_jax.eval")


@dataclasses.dataclass(frozen=True)
class Method:
    """One evaluated row: a label (decoder[.variant]), the decoder it runs, and its checkpoint."""
    label: str
    decoder: str
    checkpoint: str
    branches: int = 1  # D-Loop's K (dloop decoders)


def with_branches(methods: list[Method], branches) -> list[Method]:
    """Each D-Loop method once per K in `branches`; K > 1 adds .K<k> to the label."""
    branches = [int(k) for k in branches]
    if not branches or min(branches) < 1:
        raise InputError(f"dloop_branches must be positive integers, got {branches}")
    out = []
    for m in methods:
        if not DECODERS[m.decoder].loop:
            out.append(m)
            continue
        out += [dataclasses.replace(m, label=m.label if k == 1 else f"{m.label}.K{k}", branches=k) for k in branches]
    labels = [m.label for m in out]
    if len(set(labels)) != len(labels):
        raise InputError(f"method labels repeat once D-Loop branches are added: {labels}")
    return out


def parse_methods(checkpoints: list[str] | None, heads: list[str], checkpoint: str, branches=(1,)) -> list[Method]:
    """--checkpoints=LABEL=DIR,... or, without it, every --heads from the one --checkpoint; D-Loop
    methods once per K in `branches`."""
    if not checkpoints:
        bad = [h for h in heads if h not in SPEC_DECODERS]
        if bad:
            raise InputError(f"unknown heads {bad}; choose from {', '.join(SPEC_DECODERS)}")
        return with_branches([Method(h, h, checkpoint) for h in heads], branches)
    methods = []
    for item in checkpoints:
        label, eq, path = item.partition("=")
        decoder = label.split(".", 1)[0]
        if not eq or not path:
            raise InputError(f"--checkpoints item {item!r}: expected LABEL=DIR")
        if decoder not in SPEC_DECODERS:
            raise InputError(f"--checkpoints label {label!r}: {decoder!r} is not a decoder; choose from "
                             f"{', '.join(SPEC_DECODERS)} (optionally with .variant)")
        if not os.path.isdir(path):
            raise InputError(f"--checkpoints {label}: directory {path!r} does not exist")
        methods.append(Method(label, decoder, path))
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise InputError(f"--checkpoints repeats a label: {labels}")
    return with_branches(methods, branches)


def encode_prompts(config, questions: list[str], max_prompt_tokens: int) -> tuple[list[list[int]], int, list[int]]:
    """Chat-formatted prompt ids; prompts over max_prompt_tokens are skipped (counted), never cut:
    a cut prompt loses the end of the question and the assistant header."""
    from xpress_jax.data.byte_tokenizer import ByteTokenizer, tokenizer_for
    from xpress_jax.data.chat import prompt_ids
    tok = tokenizer_for(config.target.hf_dir, target_config(config).vocab_size)
    if isinstance(tok, ByteTokenizer):
        log.warning("no tokenizer in target.hf_dir: byte-level prompts (a smoke run with random weights)")
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    encoded = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    kept = [p for p in encoded if len(p) <= max_prompt_tokens]
    return kept, len(encoded) - len(kept), stops


def run_decoder(models, prompts, decoder, e, pad, desc, branches: int = 1):
    """Decodes every prompt (in batches); returns tokens, per-prompt stats and seconds (compile excluded)."""
    kw = dict(decoder=decoder, max_new_tokens=e["max_new_tokens"], temperature=e["temperature"], seed=e["seed"],
              settings=DecodeSettings.from_eval(e, branches).for_decoder(decoder), pad_multiple=pad,
              stop_ids=e["stop_ids"])
    bs = e["batch_size"]
    generate(models, prompts[:bs], **kw)  # compile outside the timing
    tokens, rows, seconds = [], [], 0.0
    for i in tqdm(range(0, len(prompts), bs), desc=desc, leave=False, file=sys.stderr):
        t0 = time.perf_counter()
        out = generate(models, prompts[i:i + bs], **kw)
        seconds += time.perf_counter() - t0
        tokens += out.tokens
        rows.append(out.stats)
    stats = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}  # [n_prompts, ...]
    return tokens, stats, seconds


def loop_summary(stats, steps: int) -> dict:
    """D-Loop's prefixes: the mean pass-1 prefix length the verified branch kept, and the share of
    steps where it kept none (an empty prefix reruns pass 1's input, so pass 2 changes nothing)."""
    if not steps:
        return {}
    return {"mean_prefix_kept": round(float(stats["prefix_kept"].sum()) / steps, 3),
            "empty_prefix_share": round(float(stats["empty_prefix"].sum()) / steps, 4)}


def summarise(tokens, stats, seconds, baseline_tps, drafted: int | None = None, loop: bool = False) -> dict:
    """One method's row; `drafted` is the draft positions per step that were verified (and whose
    repetition is counted): B-1, or eval.verify_tokens."""
    new = sum(len(t) for t in tokens)
    steps = int(stats["steps"].sum())
    tps = new / seconds if seconds else float("nan")
    per_prompt = stats["committed"] / np.maximum(stats["steps"], 1)
    drafted_pairs = steps * (drafted - 1) if drafted and drafted > 1 else 0
    return {
        # mean over all verification steps of all prompts (tokens committed per target pass)
        "tau": float(stats["committed"].sum() / steps) if steps else float("nan"),
        # mean over prompts of each prompt's tau, as the official DFlash benchmark reports it
        "tau_per_prompt_mean": round(float(per_prompt.mean()), 4),
        "accept_per_position": (stats["accepted_at"].sum(0) / steps).round(4).tolist() if steps else [],
        "tokens_per_s": round(tps, 2), "speedup": round(tps / baseline_tps, 3) if baseline_tps else None,
        "n_prompts": len(tokens), "new_tokens": new, "steps": steps,
        "mean_iterations": round(float(stats["iterations"].sum()) / steps, 3) if steps else 0.0,
        # drafted positions whose token repeats the previous drafted token (D-Loop's repetition trap)
        "repetition_rate": round(float(stats["draft_repeats"].sum()) / drafted_pairs, 4) if drafted_pairs else None,
        # the same on the drafter's own one-pass argmax block at the same steps: what the head or
        # D-Loop's second pass started from (D-Loop's Table 2 compares these two)
        "drafter_repetition_rate": (round(float(stats["drafter_repeats"].sum()) / drafted_pairs, 4)
                                    if drafted_pairs else None),
        **(loop_summary(stats, steps) if loop else {}),
        # each prompt's committed tokens and target passes: what the paired comparisons resample
        "per_prompt": {"committed": stats["committed"].astype(int).tolist(),
                       "steps": stats["steps"].astype(int).tolist()},
    }


def tau_ratio(row: dict, ref_row: dict) -> dict:
    """tau(row) / tau(ref_row) with its 95% paired-bootstrap interval over the rows' prompts."""
    a, b = row["per_prompt"], ref_row["per_prompt"]
    return paired_tau_ratio(a["committed"], a["steps"], b["committed"], b["steps"])


def ratios_against(rows: dict, ref: str) -> dict:
    """{method: tau_ratio against rows[ref]} for every method of one dataset with per-prompt figures."""
    return {label: tau_ratio(r, rows[ref]) for label, r in rows.items()
            if label not in ("target", ref) and "per_prompt" in r}


def compare_to_reference(rows: dict) -> None:
    """Adds `tau_vs_reference` to every method of one dataset: its tau over the reference's (dflash
    where measured, else the first method) with a 95% paired-bootstrap interval over prompts."""
    methods = [label for label in rows if label != "target"]
    if len(methods) < 2:
        return
    ref = "dflash" if "dflash" in rows else methods[0]
    for label, ratio in ratios_against(rows, ref).items():
        rows[label]["tau_vs_reference"] = {"reference": ref, **ratio}


def repetition_cell(r: dict) -> str:
    """A method's repetition with its drafter's one-pass block's in brackets ("0.531 (0.692)"); "-"
    for target-only rows, and no bracket for reports made before it was measured."""
    if r.get("repetition_rate") is None:
        return "-"
    own = f"{r['repetition_rate']:.3f}"
    return own if r.get("drafter_repetition_rate") is None else f"{own} ({r['drafter_repetition_rate']:.3f})"


def markdown(results: dict) -> str:
    lines = ["| dataset | method | tau | tau (per-prompt mean) | repetition (drafter's block) | tokens/s | speedup "
             "| lossless |",
             "|---|---|---|---|---|---|---|---|"]
    for ds, rows in results.items():
        for label, r in rows.items():
            lossless = {True: "yes", False: "NO", None: "-"}[r.get("lossless")]
            lines.append(f"| {ds} | {label} | {r['tau']:.3f} | {r['tau_per_prompt_mean']:.3f} | {repetition_cell(r)} | "
                         f"{r['tokens_per_s']:.1f} | {r['speedup'] if r['speedup'] is not None else '-'} | {lossless} |")
    compared = [(ds, label, r["tau_vs_reference"]) for ds, rows in results.items() for label, r in rows.items()
                if "tau_vs_reference" in r]
    if compared:
        lines += ["", "tau against the reference method on the same prompts, with a 95% paired bootstrap over "
                  "prompts (an interval holding 1 is no evidence of an ordering):", "",
                  "| dataset | method | reference | tau ratio | 95% interval |", "|---|---|---|---|---|"]
        lines += [f"| {ds} | {label} | {c['reference']} | {c['ratio']:.3f} | {c['ci95'][0]:.3f}-{c['ci95'][1]:.3f} |"
                  for ds, label, c in compared]
    return "\n".join(lines) + "\n"


def build_methods(config, methods: list[Method]):
    """The target once, each distinct drafter checkpoint once, and each method's head."""
    target = build_target(config)
    drafters = {ckpt: build_drafter(config, target, ckpt) for ckpt in dict.fromkeys(m.checkpoint for m in methods)}
    models = {}
    for m in methods:
        drafter = drafters[m.checkpoint]
        models[m.label] = SpecModels(target, drafter, build_head(m.decoder, config, drafter.cfg, m.checkpoint))
    return target, models


def evaluate(config, methods: list[Method], e: dict, *, check_lossless: bool = False) -> tuple[dict, int]:
    """Runs target-only decoding once per dataset and every method against it; writes results.json,
    results.md and the plots to e['out_dir']. Returns (report, number of lossless failures)."""
    target, models = build_methods(config, methods)
    os.makedirs(e["out_dir"], exist_ok=True)
    questions = {ds: load_questions(ds, e["num_prompts"]) for ds in e["datasets"]}
    encoded = {ds: encode_prompts(config, q, e["max_prompt_tokens"]) for ds, q in questions.items()}
    for ds, (prompts, skipped, _) in encoded.items():
        if not prompts:
            raise InputError(f"{ds}: every prompt is longer than eval.max_prompt_tokens={e['max_prompt_tokens']}")
    # one padded prompt length for every dataset: one compiled program per decoder setting
    pad = -(-max(len(p) for prompts, _, _ in encoded.values() for p in prompts) // 64) * 64
    results, sweep, skipped_long, failures = {}, {}, {}, 0
    for ds in e["datasets"]:
        prompts, skipped_long[ds], e["stop_ids"] = encoded[ds]
        base_tokens, base_stats, base_s = run_decoder(SpecModels(target), prompts, "target", e, pad, f"{ds}/target")
        baseline = summarise(base_tokens, base_stats, base_s, None)
        results[ds] = {"target": {**baseline, "speedup": 1.0, "accept_per_position": []}}
        for m in methods:
            spec = models[m.label]
            tokens, stats, seconds = run_decoder(spec, prompts, m.decoder, e, pad, f"{ds}/{m.label}", m.branches)
            r = summarise(tokens, stats, seconds, baseline["tokens_per_s"],
                          DecodeSettings.from_eval(e).drafted(spec.drafter.cfg.block_size),
                          loop=DECODERS[m.decoder].loop)
            r.update(decoder=m.decoder, checkpoint=m.checkpoint or None, lossless=None)
            if DECODERS[m.decoder].loop:
                r["branches"] = m.branches
            if e["time_split"]:
                r["time_split"] = component_times(
                    spec, prompts[0], decoder=m.decoder, max_new_tokens=e["max_new_tokens"], pad_multiple=pad,
                    settings=DecodeSettings.from_eval(e, m.branches).for_decoder(m.decoder))
            if check_lossless and e["temperature"] == 0:
                mismatches = sum(a != b for a, b in zip(tokens, base_tokens))
                r["lossless"] = mismatches == 0
                failures += mismatches
            results[ds][m.label] = r
            log.info("%s / %s: tau %.3f, %.1f tokens/s, speedup %s", ds, m.label, r["tau"], r["tokens_per_s"],
                     r["speedup"])
            if m.decoder == "xpress" and e["candidate_k"] > 0 and e["temperature"] == 0 and e["top_k"] == 0:
                # candidate mode against the exact refiner at the same K, on these drafts
                cand = candidate_agreement(spec, list(zip(prompts, base_tokens)), DecodeSettings.from_eval(e),
                                           top_k=e["candidate_k"])
                _, st_c, _ = run_decoder(spec, prompts, "xpress", {**e, "top_k": e["candidate_k"]}, pad,
                                         f"{ds}/{m.label} top-{e['candidate_k']}")
                cand.update(tau=float(st_c["committed"].sum() / st_c["steps"].sum()), tau_exact=r["tau"])
                r["candidate"] = cand
            if m.decoder == "xpress" and e["jacobi_k"]:
                sweep.setdefault(ds, {})[m.label] = {}
                for k in e["jacobi_k"]:
                    _, st_k, _ = run_decoder(spec, prompts, "xpress", {**e, "max_iters": int(k)}, pad,
                                             f"{ds}/{m.label} K={k}")
                    sweep[ds][m.label][str(k)] = float(st_k["committed"].sum() / st_k["steps"].sum())
    for rows in results.values():
        compare_to_reference(rows)
    report = {"date": time.strftime("%Y-%m-%d"), "device": jax.devices()[0].device_kind,
              "settings": {k: v for k, v in e.items() if k != "stop_ids"},
              "methods": {m.label: {"decoder": m.decoder, "checkpoint": m.checkpoint or None,
                                    **({"branches": m.branches} if DECODERS[m.decoder].loop else {})}
                          for m in methods},
              **describe_checkpoint(methods[0].checkpoint if len({m.checkpoint for m in methods}) == 1 else ""),
              "skipped_long_prompts": skipped_long, "results": results, "jacobi_sweep": sweep}
    write_outputs(report, e["out_dir"])
    return report, failures


def write_outputs(report: dict, out_dir: str) -> None:
    results, sweep = report["results"], report["jacobi_sweep"]
    files.write_json(os.path.join(out_dir, "results.json"), report)
    files.write_text(os.path.join(out_dir, "results.md"), markdown(results))
    plots.acceptance_per_position({ds: {h: r for h, r in v.items() if h != "target"} for ds, v in results.items()},
                                  os.path.join(out_dir, "acceptance.png"))
    if sweep:
        reference = {ds: {h: r["tau"] for h, r in v.items() if h != "target" and r.get("decoder") != "xpress"}
                     for ds, v in results.items()}
        plots.tau_against_k(sweep, reference, os.path.join(out_dir, "tau_vs_k.png"))




def drafter_blocks(spec: SpecModels):
    """A jitted (ids [1, T], anchors [1, A]) -> (s [A, n, vocab], h [A, n, hidden], last [A]): the
    drafter's real blocks at the given anchors of a known sequence, in one pass (training mode).
    The weights are arguments of the compiled function, not constants baked into it."""
    from xpress_jax.models.drafter import block_inputs
    graphdef, state = nnx.split(spec)
    block, feat = spec.drafter.cfg.block_size, tuple(spec.drafter.cfg.target_layer_ids)

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
        pad = -(-len(ids) // 64) * 64  # a few compiled shapes, not one per sequence
        ids_p = np.zeros((1, pad), np.int32)
        ids_p[0, :len(ids)] = ids
        anchors = np.full((1, max_blocks), starts[-1], np.int32)
        anchors[0, :len(starts)] = starts
        yield jnp.asarray(ids_p), jnp.asarray(anchors), len(starts)


def candidate_agreement(spec: SpecModels, sequences: list[tuple[list[int], list[int]]], settings: DecodeSettings, *,
                        top_k: int, max_blocks: int = 64) -> dict:
    """How often candidate mode (top-k) drafts what the exact refiner drafts, on the drafter's real
    blocks: for each (prompt, target output) the drafter proposes a block at every position of the
    output (the training-mode anchored pass), and both refiners solve it with the same K."""
    from xpress_jax.decoding.refine import refine_block
    blocks_of = drafter_blocks(spec)
    graphdef, state = nnx.split(spec)
    n = spec.drafter.cfg.block_size - 1

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
