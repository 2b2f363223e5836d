"""Export any Orbax step of a run to PyTorch-loadable files.

    python -m xpress_jax.export --run=runs/repro/xpress --out=/tmp/xpress_hf            # latest step
    python -m xpress_jax.export --run=runs/repro/xpress --step=100 --out=DIR --dtype=float32
    python -m xpress_jax.export --run=runs/repro/dflash --out=DIR --target               # + the target

A drafter run (python -m xpress_jax.train) gives the drafter in the DFlash layout
(`config.json` + `model.safetensors`, what `dflash`, SGLang and vLLM load) and its heads in
`heads/NAME.safetensors` with `heads/NAME.config.json`; `--target` adds the run's target as an HF
Qwen3 directory with its tokenizer in OUT/target. A target run (python -m xpress_jax.pretrain)
gives the target itself as an HF Qwen3 directory in OUT. The end-of-run export of both commands
is this same code.
"""

from __future__ import annotations

import json

from absl import flags

from xpress_jax import cli
from xpress_jax.errors import InputError
from xpress_jax.export.runs import (check_has_checkpoints, export_drafter_run, export_target_run, prepare_output,
                                    read_run_config)

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_string("run", None, "Run directory (train.out_dir or pretrain's output).", flag_values=FLAGS)
flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).", flag_values=FLAGS)
flags.DEFINE_string("out", None, "Output directory (must not exist or be empty, unless --overwrite).",
                    flag_values=FLAGS)
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32", "float16"], "Weight dtype of the files.",
                  flag_values=FLAGS)
flags.DEFINE_bool("target", False, "Also write the run's target as an HF Qwen3 directory (OUT/target).",
                  flag_values=FLAGS)
flags.DEFINE_bool("overwrite", False, "Write into a non-empty output directory.", flag_values=FLAGS)


def main(config_unused):
    del config_unused  # the run's own config is what counts
    if not FLAGS.run or not FLAGS.out:
        raise InputError("--run and --out are required")
    kind, config = read_run_config(FLAGS.run)
    check_has_checkpoints(FLAGS.run)
    if FLAGS.target and kind == "drafter" and not config.target.hf_dir:
        raise InputError("--target: this run's target was random (no target.hf_dir); there is nothing to export")
    prepare_output(FLAGS.out, FLAGS.overwrite)
    if kind == "target":
        summary = export_target_run(FLAGS.run, config, FLAGS.out, step=FLAGS.step, dtype_name=FLAGS.dtype)
    else:
        summary = export_drafter_run(FLAGS.run, config, FLAGS.out, step=FLAGS.step, dtype_name=FLAGS.dtype,
                                     with_target=FLAGS.target)
    print(json.dumps(summary))


if __name__ == "__main__":
    cli.run(main, FLAGS)
