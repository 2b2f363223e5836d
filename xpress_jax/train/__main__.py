r"""Train a DFlash drafter and its causal heads against a frozen Qwen3 target.

    python -m xpress_jax.train                                      # tiny CPU run on GSM8K (minutes)
    python -m xpress_jax.train --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B \
        --config.data.train_files="('/data/regenerated.jsonl',)" --config.train.out_dir=/runs/q8b
    python -m xpress_jax.train --config=configs/qwen3_8b.py --dry_run --dry_run_devices=8 \
        --config.mesh.shape="(1,8,1)"   # memory and FLOPs per device on 8 simulated devices, no weights

An interrupted run resumes from its latest checkpoint in train.out_dir. SIGTERM saves and exits.
"""

import os
import sys

# --dry_run_devices=N compiles on N simulated CPU devices, which must exist before jax is imported;
# without it --dry_run compiles for the backend's own devices (GPUs, TPUs).
_simulated = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--dry_run_devices=")), None)
if "--dry_run" in sys.argv and _simulated and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_simulated}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

from absl import flags  # noqa: E402

from xpress_jax import cli  # noqa: E402

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_bool("dry_run", False, "Compile the train step on abstract arrays (no weights) and print per-device "
                  "memory and FLOPs, and the FLOPs ratio to the one-device step.", flag_values=FLAGS)
flags.DEFINE_integer("dry_run_devices", 0, "--dry_run on this many simulated CPU devices (0: the backend's own "
                     "devices); the config's mesh must fit.", flag_values=FLAGS)
flags.DEFINE_string("dry_run_out", "", "Also write the --dry_run report to this JSON file.", flag_values=FLAGS)


def main(config):
    from xpress_jax.train.run import train
    from xpress_jax.train.dry_run import dry_run
    if FLAGS.dry_run:
        from xpress_jax import atomic
        so_far = (lambda r: atomic.write_json(FLAGS.dry_run_out, {**r, "complete": False})) if FLAGS.dry_run_out \
            else (lambda r: None)  # a run cut short keeps each compile's figures
        report = dry_run(config, progress=so_far, overridden=cli.config_overrides(FLAGS))
        if FLAGS.dry_run_out:
            atomic.write_json(FLAGS.dry_run_out, {**report, "complete": True})
        cli.print_line(json.dumps(report))
        return
    if not (os.environ.get("XPRESS_COORDINATOR") or config.train.distributed):
        from xpress_jax.train.setup import refuse_uneven_mesh
        # a mesh these devices cannot hold, or one that cannot split the batch or the target's
        # heads, vocabulary or widths: refused before any file is written
        refuse_uneven_mesh(config)
    cli.log_to_file(os.path.join(config.train.out_dir, "log.txt"))  # library INFO lines, off the console
    result = train(config, overridden=cli.config_overrides(FLAGS))
    cli.print_line(json.dumps({"step": result["step"], **{k: v for k, v in result["metrics"].items()
                                                          if not isinstance(v, list)}}))


if __name__ == "__main__":
    cli.run(main, FLAGS)
