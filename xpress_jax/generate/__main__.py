r"""Regenerate the assistant turns of a conversation set with the target (greedy, thinking off),
as the DFlash recipe trains on target-generated text.

    python -m xpress_jax.generate --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B \
        --input=/data/prompts.jsonl --output=/data/regenerated

Reads `{"id", "conversations": [...]}` (or question/answer) records, keeps every turn up to each
assistant turn, and replaces that turn with the target's greedy reply. Writes
OUTPUT/data.jsonl, appending, and skips ids already there, so an interrupted run resumes.
"""

from __future__ import annotations

import os

from absl import flags

from xpress_jax import cli
from xpress_jax.errors import DataError
from xpress_jax.generate.regenerate import regenerate

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_string("input", None, "Conversation jsonl (or question/answer jsonl) to regenerate.", flag_values=FLAGS)
flags.DEFINE_string("output", None, "Output directory (data.jsonl inside; appended, resumable).", flag_values=FLAGS)
flags.DEFINE_integer("batch_size", 0, "Rows decoding at once, split over --devices; each row takes the next prompt as "
                     "soon as its answer ends (continuous batching). 0: as many per device as its memory holds "
                     "beside the target (8 where a device reports no memory, as CPUs).", flag_values=FLAGS)
flags.DEFINE_integer("devices", 0, "Local devices the batch is split over (0: all of them); each decodes its "
                     "share of the prompts with its own copy of the weights.", flag_values=FLAGS)
flags.DEFINE_integer("tensor_parallel", 1, "Local devices the target's heads, MLP width and vocabulary are split "
                     "over, for a target too large for one device (the batch is then not split).", flag_values=FLAGS)
flags.DEFINE_integer("max_new_tokens", 1024, "Longest reply.", flag_values=FLAGS)
flags.DEFINE_integer("max_prompt_tokens", 2048, "Longer prompts are skipped (with a count in the log).",
                     flag_values=FLAGS)


def main(config):
    if not FLAGS.input or not FLAGS.output:
        raise DataError("--input and --output are required")
    cli.log_to_file(os.path.join(FLAGS.output, "log.txt"))
    regenerate(config, FLAGS.input, FLAGS.output, batch_size=FLAGS.batch_size, max_new_tokens=FLAGS.max_new_tokens,
               max_prompt_tokens=FLAGS.max_prompt_tokens, devices=FLAGS.devices,
               tensor_parallel=FLAGS.tensor_parallel)


if __name__ == "__main__":
    cli.run(main, FLAGS)
