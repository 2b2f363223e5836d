"""Train a Qwen3 target from scratch (next-token objective): the tiny reproduction's target.

    python -m xpress_jax.pretrain --config=configs/tiny_repro.py --out=runs/target

Builds the corpus (GSM8K train chats + standard-library code), trains a byte-level BPE, trains
`target.arch` for `pretrain.steps`, and writes OUT as an HF Qwen3 directory (weights, config,
tokenizer) that transformers loads, with OUT/pretrain.json (validation loss, greedy-answer
repetition, examples). An interrupted run resumes from OUT/checkpoints.
"""

import json

from absl import flags

from xpress_jax import cli

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_string("out", None, "Output directory (default: pretrain.out_dir of the config).", flag_values=FLAGS)


def main(config):
    import os
    from xpress_jax.pretrain.target import pretrain
    cli.log_to_file(os.path.join(FLAGS.out or config.pretrain.out_dir, "log.txt"))
    summary = pretrain(config, out_dir=FLAGS.out)
    summary.pop("greedy", None)
    print(json.dumps(summary))


if __name__ == "__main__":
    cli.run(main, FLAGS)
