r"""Measure acceptance length and speedup of each head on benchmark questions.

    python -m xpress_jax.eval                                      # tiny random models, CPU
    python -m xpress_jax.eval --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B \
        --checkpoint=/ckpt/drafter --datasets=gsm8k,humaneval --decoders=dflash,markov,xpress \
        --num_prompts=80 --max_new_tokens=2048 --check_lossless --out=runs/eval
    python -m xpress_jax.eval --config=configs/tiny_repro.py --config.target.hf_dir=runs/repro/target \
        --checkpoints=dflash=runs/repro/dflash/export,xpress=runs/repro/xpress/export,dloop=runs/repro/dloop/export \
        --dloop_branches=1,4

Writes OUT/results.json (schema: docs/evaluation.md), OUT/results.md (benchmarks by methods, as the
papers tabulate them, then every figure), OUT/answers.jsonl (every answer of every method),
OUT/acceptance.png, OUT/tau_and_speedup.png and, with the xpress head, OUT/tau_vs_iterations.png.
tau and speedup are reported as the official DFlash harness defines them (mean over responses; decode
time per token, prefill excluded) beside the pooled figures. The questions are split over every
local device (eval.devices) and over the processes of a multi-process run (process 0 writes the
outputs; `launch/local_multiprocess.sh 2 eval ...` rehearses one on this machine).

The target: --config.target.hf_dir, else the one a checkpoint records (target.json, written by every
export); a checkpoint that records none needs it given, and a given target that differs from the
recorded one is refused (--config.target.accept_other=true uses it anyway). With neither a target
nor a checkpoint the models are random and prompts byte-level (`data/byte_tokenizer.py`): a smoke run.
`--config=configs/paper_eval.py` runs the papers' protocol (docs/evaluation.md).

Question files (--datasets=PATH; .jsonl, .jsonl.gz or a JSON array), one record per question, its
first user turn asked:
    {"turns": ["Write a haiku about rain.", "Now one about snow."]}
    {"question": "What is 7 * 6?"}    {"prompt": "..."}    {"instruction": "..."}
    {"conversations": [{"role": "user", "content": "Hi"}]}   ("messages"; ShareGPT's from/value too)
--datasets=NAME=PATH reads a published benchmark's own file or folder (gsm8k, math500, aime2025,
humaneval, mbpp, livecodebench, mt_bench, alpaca) and asks it as the DFlash harness does, every
turn of MT-Bench included (docs/evaluation.md, "Question files" and "The papers' benchmarks").
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
from absl import flags

from xpress_jax import cli
from xpress_jax.checkpoints.target_record import resolve_target
from xpress_jax.config_schema import check_fields
from xpress_jax.errors import InputError
from xpress_jax.eval.evaluate import checkpoint_decoders, evaluate, parse_methods
from xpress_jax.eval.report import report_markdown
from xpress_jax.eval.settings import EvalSettings
from xpress_jax.methods import spec_decoders
from xpress_jax.train.distributed import maybe_initialize_distributed

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_string("checkpoint", "", "Drafter directory (DFlash layout, heads/ beside it) for every --decoders; "
                    "empty: random.", flag_values=FLAGS)
flags.DEFINE_list("checkpoints", None, f"One checkpoint per method: LABEL=DIR,... where LABEL is a decoder "
                  f"({', '.join(spec_decoders())}) optionally with a .variant (xpress.frozen=DIR). Replaces "
                  "--decoders/--checkpoint.", flag_values=FLAGS)
flags.DEFINE_list("datasets", None, "Shipped sets (gsm8k, humaneval, mt_bench, alpaca: 80 questions each), paths to "
                  "question files (.jsonl, .jsonl.gz or a JSON array; each record's first user turn), or NAME=PATH: "
                  "a benchmark's test split, its file or its publisher's folder, asked as the DFlash harness asks "
                  "it (NAME: gsm8k, math500, aime2025, humaneval, mbpp, livecodebench, mt_bench, alpaca; "
                  "docs/evaluation.md).", flag_values=FLAGS)
flags.DEFINE_list("decoders", None, f"Any of {', '.join(spec_decoders())}, all from --checkpoint (default: DFlash and "
                  "every head the checkpoint holds; without --checkpoint, eval.decoders).", flag_values=FLAGS)
flags.DEFINE_list("dloop_branches", None, "D-Loop's branch counts (prefixes verified together), e.g. 1,4: each "
                  "dloop method is measured at each, labelled LABEL.b4 for 4 (default eval.dloop_branches).",
                  flag_values=FLAGS)
flags.DEFINE_integer("num_prompts", None, "Questions per dataset: the first N of a question file; of a published "
                     "benchmark, N chosen as the DFlash harness chooses them (0: its harness count; docs/evaluation.md).",
                     flag_values=FLAGS)
flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate per prompt.", flag_values=FLAGS)
flags.DEFINE_float("temperature", None, "0: greedy; > 0: speculative sampling.", flag_values=FLAGS)
flags.DEFINE_string("out", None, "Output directory.", flag_values=FLAGS)
flags.DEFINE_bool("check_lossless", False, "At temperature 0, exit 1 if any output differs from the target-only "
                  "reference: one token a step (float32 on a CPU), or the method's own verification pass with every "
                  "draft refused (elsewhere: exact in bf16 and TF32; eval.lossless_reference).", flag_values=FLAGS)

# flag -> EvalSettings field
OVERRIDES = {"datasets": "datasets", "decoders": "decoders", "num_prompts": "num_prompts",
             "max_new_tokens": "max_new_tokens", "temperature": "temperature", "out": "out_dir"}


def settings(config) -> EvalSettings:
    """config.eval with the command-line flags on top, checked by the config's rules."""
    changes = {field: getattr(FLAGS, name) for name, field in OVERRIDES.items() if getattr(FLAGS, name) is not None}
    if FLAGS.dloop_branches is not None:
        try:
            changes["dloop_branches"] = tuple(int(k) for k in FLAGS.dloop_branches)
        except ValueError:
            raise InputError(f"--dloop_branches: expected integers, got {FLAGS.dloop_branches}") from None
    s = EvalSettings.from_config(config.eval)
    s = dataclasses.replace(s, **{k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()})
    check_fields({f"eval.{k}": v for k, v in s.as_dict().items()})  # the flags get the config's rules
    return s


def main(config):
    s = settings(config)
    maybe_initialize_distributed(config)  # a multi-process run (XPRESS_COORDINATOR or train.distributed)
    cli.log_to_file(os.path.join(s.out_dir, "log.txt"))
    decoders = s.decoders
    overridden = cli.config_overrides(FLAGS)
    if FLAGS.checkpoint and FLAGS.decoders is None and "eval.decoders" not in overridden:
        decoders = checkpoint_decoders(FLAGS.checkpoint)  # unless asked otherwise, what the checkpoint holds
    methods = parse_methods(FLAGS.checkpoints, decoders, FLAGS.checkpoint, s.dloop_branches)
    resolve_target(config, [m.checkpoint for m in methods])  # the target the drafters were trained against
    report, failures = evaluate(config, methods, s, check_lossless=FLAGS.check_lossless, overridden=overridden)
    if jax.process_index() == 0:
        print(report_markdown(report))
        print(f"results: {os.path.join(s.out_dir, 'results.json')}, answers.jsonl; plots: acceptance.png, tau_and_speedup.png"
              f"{', tau_vs_iterations.png' if report['iteration_sweep'] else ''}")
    if failures:
        print(f"error: {failures} outputs differ from the target-only reference "
              f"({report['settings']['lossless_reference']}; not lossless)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    cli.run(main, FLAGS)
