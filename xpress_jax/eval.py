"""Measure acceptance length and speedup of each head on benchmark questions.

    python -m xpress_jax.eval                                      # tiny random models, CPU
    python -m xpress_jax.eval --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B \
        --checkpoint=/ckpt/drafter --datasets=gsm8k,humaneval --heads=dflash,markov,xpress \
        --num_prompts=80 --max_new_tokens=2048 --check_lossless --out=runs/eval

Writes OUT/results.json (schema in the README), OUT/results.md, OUT/acceptance.png and, with the
xpress head, OUT/tau_vs_k.png. Speedup is tokens/s over target-only decoding of the same prompts
in the same run. Without a tokenizer in the target directory, prompts are byte-level
(`data/byte_tokenizer.py`; smoke runs with random weights only).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import jax
import numpy as np
from absl import flags
from tqdm import tqdm

from xpress_jax import cli, plots
from xpress_jax.assemble import build_models, describe_checkpoint, spec_models
from xpress_jax.config import target_config
from xpress_jax.data.questions import load_questions
from xpress_jax.decoding.profile import component_times
from xpress_jax.decoding.speculative import DECODERS, generate
from xpress_jax.errors import InputError

log = logging.getLogger("xpress_jax.eval")

flags.DEFINE_string("checkpoint", "", "Drafter directory (DFlash layout, heads/ beside it); empty: random.")
flags.DEFINE_list("datasets", None, "gsm8k, humaneval, mt_bench, alpaca, or paths to jsonl files.")
flags.DEFINE_list("heads", None, "Any of dflash, markov, gru, xpress.")
flags.DEFINE_integer("num_prompts", None, "Questions per dataset.")
flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate per prompt.")
flags.DEFINE_float("temperature", None, "0: greedy; > 0: speculative sampling.")
flags.DEFINE_string("out", None, "Output directory.")
flags.DEFINE_bool("check_lossless", False, "At temperature 0, exit 1 if any output differs from target-only decoding.")
FLAGS = flags.FLAGS


def settings(config) -> dict:
    """config.eval with the command-line flags on top."""
    e = config.eval.to_dict()
    for name, key in (("datasets", "datasets"), ("heads", "heads"), ("num_prompts", "num_prompts"),
                      ("max_new_tokens", "max_new_tokens"), ("temperature", "temperature"), ("out", "out_dir")):
        value = getattr(FLAGS, name)
        if value is not None:
            e[key] = value
    e["heads"] = list(e["heads"])
    bad = [h for h in e["heads"] if h not in DECODERS or h == "target"]
    if bad:
        raise InputError(f"unknown heads {bad}; choose from dflash, markov, gru, xpress")
    return e


def encode_prompts(config, questions: list[str]) -> tuple[list[list[int]], list[int], object]:
    from xpress_jax.data.byte_tokenizer import ByteTokenizer, tokenizer_for
    from xpress_jax.data.chat import prompt_ids
    tok = tokenizer_for(config.target.hf_dir, target_config(config).vocab_size)
    if isinstance(tok, ByteTokenizer):
        log.warning("no tokenizer in target.hf_dir: byte-level prompts (a smoke run with random weights)")
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return [prompt_ids(tok, [{"role": "user", "content": q}])[:512] for q in questions], stops, tok


def run_decoder(models, prompts, name, e, pad, desc):
    """Decodes every prompt (in batches) and returns tokens, summed stats, seconds (compile excluded)."""
    kw = dict(decoder=name, max_new_tokens=e["max_new_tokens"], temperature=e["temperature"], seed=e["seed"],
              max_iters=e["max_iters"], early_stop=e["early_stop"], top_k=e["top_k"], pad_multiple=pad,
              stop_ids=e["stop_ids"])
    bs = e["batch_size"]
    generate(models, prompts[:bs], **kw)  # compile outside the timing
    tokens, stats, seconds = [], None, 0.0
    for i in tqdm(range(0, len(prompts), bs), desc=desc, leave=False, file=sys.stderr):
        t0 = time.perf_counter()
        out = generate(models, prompts[i:i + bs], **kw)
        seconds += time.perf_counter() - t0
        tokens += out.tokens
        batch_stats = {k: v.sum(0) for k, v in out.stats.items()}
        stats = batch_stats if stats is None else {k: stats[k] + batch_stats[k] for k in stats}
    return tokens, stats, seconds


def summarise(tokens, stats, seconds, baseline_tps, n_prompts) -> dict:
    new = sum(len(t) for t in tokens)
    steps = int(stats["steps"])
    tps = new / seconds if seconds else float("nan")
    return {
        "tau": float(stats["committed"] / steps) if steps else float("nan"),
        "accept_per_position": (stats["accepted_at"] / steps).round(4).tolist() if steps else [],
        "tokens_per_s": round(tps, 2), "speedup": round(tps / baseline_tps, 3) if baseline_tps else None,
        "n_prompts": n_prompts, "new_tokens": new, "steps": steps,
        "mean_iterations": round(float(stats["iterations"]) / steps, 3) if steps else 0.0,
    }


def markdown(results: dict) -> str:
    lines = ["| dataset | head | tau | tokens/s | speedup | lossless |", "|---|---|---|---|---|---|"]
    for ds, heads in results.items():
        for head, r in heads.items():
            lossless = {True: "yes", False: "NO", None: "-"}[r.get("lossless")]
            lines.append(f"| {ds} | {head} | {r['tau']:.3f} | {r['tokens_per_s']:.1f} | "
                         f"{r['speedup'] if r['speedup'] is not None else '-'} | {lossless} |")
    return "\n".join(lines) + "\n"


def main(config):
    e = settings(config)
    target, drafter, heads = build_models(config, FLAGS.checkpoint, e["heads"])
    os.makedirs(e["out_dir"], exist_ok=True)
    results, sweep, failures = {}, {}, 0
    for ds in e["datasets"]:
        questions = load_questions(ds, e["num_prompts"])
        prompts, stops, _ = encode_prompts(config, questions)
        e["stop_ids"] = stops
        pad = -(-max(len(p) for p in prompts) // 64) * 64  # one compiled program for the whole set
        base_tokens, base_stats, base_s = run_decoder(spec_models(target, drafter, heads, "target"), prompts,
                                                      "target", e, pad, f"{ds}/target")
        baseline = summarise(base_tokens, base_stats, base_s, None, len(prompts))
        results[ds] = {"target": {**baseline, "speedup": 1.0, "accept_per_position": []}}
        for name in e["heads"]:
            models = spec_models(target, drafter, heads, name)
            tokens, stats, seconds = run_decoder(models, prompts, name, e, pad, f"{ds}/{name}")
            r = summarise(tokens, stats, seconds, baseline["tokens_per_s"], len(prompts))
            r["time_split"] = component_times(models, prompts[0], decoder=name, max_new_tokens=e["max_new_tokens"],
                                              max_iters=e["max_iters"], early_stop=e["early_stop"],
                                              top_k=e["top_k"], pad_multiple=pad)
            r["lossless"] = None
            if FLAGS.check_lossless and e["temperature"] == 0:
                mismatches = sum(a != b for a, b in zip(tokens, base_tokens))
                r["lossless"] = mismatches == 0
                failures += mismatches
            results[ds][name] = r
            log.info("%s / %s: tau %.3f, %.1f tokens/s, speedup %s", ds, name, r["tau"], r["tokens_per_s"],
                     r["speedup"])
        if "xpress" in e["heads"]:
            sweep[ds] = {}
            for k in e["jacobi_k"]:
                _, stats, _ = run_decoder(spec_models(target, drafter, heads, "xpress"), prompts, "xpress",
                                          {**e, "max_iters": int(k)}, pad, f"{ds}/xpress K={k}")
                sweep[ds][str(k)] = float(stats["committed"] / stats["steps"])
    report = {"date": time.strftime("%Y-%m-%d"), "device": jax.devices()[0].device_kind,
              "settings": {k: v for k, v in e.items() if k != "stop_ids"}, **describe_checkpoint(FLAGS.checkpoint),
              "results": results, "jacobi_sweep": sweep}
    with open(os.path.join(e["out_dir"], "results.json"), "w") as f:
        json.dump(report, f, indent=2)
    table = markdown(results)
    with open(os.path.join(e["out_dir"], "results.md"), "w") as f:
        f.write(table)
    plots.acceptance_per_position({ds: {h: r for h, r in v.items() if h != "target"} for ds, v in results.items()},
                                  os.path.join(e["out_dir"], "acceptance.png"))
    if sweep:
        reference = {ds: {h: r["tau"] for h, r in v.items() if h not in ("target", "xpress")} for ds, v in results.items()}
        plots.tau_against_k(sweep, reference, os.path.join(e["out_dir"], "tau_vs_k.png"))
    print(table)
    if failures:
        sys.stderr.write(f"error: {failures} outputs differ from target-only decoding (not lossless)\n")
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
