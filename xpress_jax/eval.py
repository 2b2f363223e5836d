"""Measure acceptance length and speedup of each head on benchmark questions.

    python -m xpress_jax.eval                                      # tiny random models, CPU
    python -m xpress_jax.eval --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B \
        --checkpoint=/ckpt/drafter --datasets=gsm8k,humaneval --heads=dflash,markov,xpress \
        --num_prompts=80 --max_new_tokens=2048 --check_lossless --out=runs/eval
    python -m xpress_jax.eval --config=configs/tiny_repro.py --config.target.hf_dir=runs/repro/target \
        --checkpoints=dflash=runs/repro/dflash/export,xpress=runs/repro/xpress/export,dloop=runs/repro/dloop/export \
        --dloop_branches=1,4

Writes OUT/results.json (schema in the README), OUT/results.md, OUT/acceptance.png and, with the
xpress head, OUT/tau_vs_k.png. Speedup is tokens/s over target-only decoding of the same prompts
in the same run. Without a tokenizer in the target directory, prompts are byte-level
(`data/byte_tokenizer.py`; smoke runs with random weights only).
"""

from __future__ import annotations

import os
import sys

from absl import flags

from xpress_jax import cli
from xpress_jax.config_schema import check_fields
from xpress_jax.errors import InputError
from xpress_jax.evaluation import evaluate, markdown, parse_methods

flags.DEFINE_string("checkpoint", "", "Drafter directory (DFlash layout, heads/ beside it) for every --heads; "
                    "empty: random.")
flags.DEFINE_list("checkpoints", None, "One checkpoint per method: LABEL=DIR,... where LABEL is a decoder name "
                  "(dflash, markov, gru, xpress, dloop, dloop+xpress) optionally with a .variant (xpress.frozen=DIR). "
                  "Replaces "
                  "--heads/--checkpoint.")
flags.DEFINE_list("datasets", None, "gsm8k, humaneval, mt_bench, alpaca, or paths to jsonl files.")
flags.DEFINE_list("heads", None, "Any of dflash, markov, gru, xpress, dloop, dloop+xpress (all from --checkpoint).")
flags.DEFINE_list("dloop_branches", None, "D-Loop's K (prefixes verified together), e.g. 1,4: each dloop method "
                  "is measured at each K, labelled LABEL.K4 for K = 4 (default eval.dloop_branches).")
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
    if FLAGS.dloop_branches is not None:
        try:
            e["dloop_branches"] = tuple(int(k) for k in FLAGS.dloop_branches)
        except ValueError:
            raise InputError(f"--dloop_branches: expected integers, got {FLAGS.dloop_branches}") from None
    check_fields({f"eval.{k}": v for k, v in e.items()})  # the flags get the config's rules
    return e


def main(config):
    e = settings(config)
    cli.log_to_file(os.path.join(e["out_dir"], "log.txt"))
    methods = parse_methods(FLAGS.checkpoints, e["heads"], FLAGS.checkpoint, e["dloop_branches"])
    report, failures = evaluate(config, methods, e, check_lossless=FLAGS.check_lossless)
    print(markdown(report["results"]))
    print(f"results: {os.path.join(e['out_dir'], 'results.json')}; plots: acceptance.png"
          f"{', tau_vs_k.png' if report['jacobi_sweep'] else ''}")
    if failures:
        sys.stderr.write(f"error: {failures} outputs differ from target-only decoding (not lossless)\n")
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
