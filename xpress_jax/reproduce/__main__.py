"""The project's main job: drafters trained and evaluated on a tiny Qwen3 target, the papers'
table in miniature. Each stage is cached and resumable; run it again to continue.

    python -m xpress_jax.reproduce                         # configs/tiny_heads.py -> runs/heads (minutes)
    python -m xpress_jax.reproduce --config=configs/tiny_repro.py   # every stage from scratch (hours)
    python -m xpress_jax.reproduce --config=configs/tiny_repro_smoke.py --out=/tmp/smoke

The default config starts from the target and DFlash drafter that ship in xpress_jax/assets/tiny
and trains heads on the frozen drafter; configs/tiny_repro.py makes those two as well.

Stages (one subdirectory of OUT each, done when it holds DONE.json; a config may ship the first
ones or leave training stages out):
  target/         pretrain the Qwen3 target (HF directory with its BPE tokenizer)
  regen/          the target's greedy answers to training questions (the drafters' data)
  dflash/         the DFlash drafter alone
  dflash.more/    the dflash/ drafter trained head_steps more with its own objective: the
                  same-budget reference for every stage below (the table's "tau / dflash.more")
  xpress/         drafter (from dflash/) + XPress refiner trained together: the co-adapted drafter
  xpress.frozen/  the XPress refiner on the frozen dflash/ drafter
  markov/, gru/   the serial baselines on the frozen dflash/ drafter, same budget
  dloop/          the drafter (from dflash/) fine-tuned with D-Loop's prefix-suffix objective
  dloop+xpress/   an XPress refiner on the frozen dloop/ drafter (D-Loop's branches, then Jacobi)
  eval/           every method against target-only decoding at each temperature
Then OUT/results.json and OUT/table.md gather the figures and each stage's wall time.
"""

from __future__ import annotations

import os

from absl import flags

from xpress_jax import cli
from xpress_jax.reproduce.results import examples_text, publish, table
from xpress_jax.reproduce.stages import reproduce

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
DEFAULT_CONFIG = cli.config_path("tiny_heads.py")
flags.DEFINE_string("out", None, "Run directory (default: reproduce.out_dir of the config).", flag_values=FLAGS)
flags.DEFINE_list("stages", None, "Run only these stages (default: all, in order; earlier ones must be done).",
                  flag_values=FLAGS)
flags.DEFINE_string("publish", "", "Also copy the results, table and plots to this directory (e.g. benchmarks/tiny).",
                    flag_values=FLAGS)


def main(config):
    run = FLAGS.out or config.reproduce.out_dir
    results = reproduce(config, run, FLAGS.stages)
    print(table(results))
    examples = examples_text(results)
    if examples:
        print(examples + "\n")
    plots = [os.path.join(run, "eval", t, p) for t in results["eval"] for p in ("acceptance.png", "tau_vs_iterations.png")
             if os.path.isfile(os.path.join(run, "eval", t, p))]
    print(f"results: {os.path.join(run, 'results.json')}, {os.path.join(run, 'table.md')}")
    if plots:
        print("plots: " + ", ".join(plots))
    if FLAGS.publish:
        publish(run, FLAGS.publish)
        print(f"published to {FLAGS.publish}")


if __name__ == "__main__":
    cli.run(main, FLAGS, DEFAULT_CONFIG)
