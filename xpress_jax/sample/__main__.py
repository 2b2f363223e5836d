r"""Answer a prompt with any decoder and see how it went: the text, tau, tokens/s and the tokens
each target pass committed.

    python -m xpress_jax.sample                                     # tiny random target, CPU, seconds
    python -m xpress_jax.sample --checkpoint=xpress_jax/assets/tiny/dflash --prompt="What is 7 * 6?"
    python -m xpress_jax.sample --checkpoint=runs/heads/xpress.frozen/export --decoder=xpress \
        --prompts=questions.jsonl --json
    python -m xpress_jax.sample --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B \
        --checkpoint=/ckpt/Qwen3-8B-DFlash-b16 --prompt="Explain speculative decoding."

The target is --config.target.hf_dir or the one the checkpoint records (docs/evaluation.md, "The
target"). Without a target and a checkpoint the models are random (a smoke run). The prompt goes
through the Qwen3 chat template, thinking off. Decoding settings other than the flags below come
from the config's eval section (--config.eval.max_iters=...). Each answer prints as

    > the prompt
    DECODER: N tokens in S target passes (tau N/S), tokens/s
    the answer
    trace (the tokens of each pass): [the first pass's text] [the second's] ...
"""

from __future__ import annotations

import json

from absl import flags

from xpress_jax import cli
from xpress_jax.checkpoints.hf_drafter import check_drafter_dir
from xpress_jax.checkpoints.target_record import resolve_target
from xpress_jax.data.questions import load_dataset_entry
from xpress_jax.errors import InputError
from xpress_jax.methods import spec_decoders
from xpress_jax.sample.traced import TARGET_ONLY, answer_prompts, render

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_string("prompt", None, "The user turn to answer (default: config.sample.prompt).", flag_values=FLAGS)
flags.DEFINE_string("prompts", None, "A question file instead (any file --datasets of eval reads, or NAME=PATH; "
                    "the first user turn of each record; docs/evaluation.md, \"Question files\").",
                    flag_values=FLAGS)
flags.DEFINE_integer("num_prompts", 0, "With --prompts: the first N questions (0: all).", flag_values=FLAGS)
flags.DEFINE_string("checkpoint", "", "Drafter directory (DFlash layout, heads/ beside it), e.g. a run's export/.",
                    flag_values=FLAGS)
flags.DEFINE_string("decoder", None, f"{TARGET_ONLY} (the target alone) or one of {', '.join(spec_decoders())} "
                    f"(default: dflash with --checkpoint, else {TARGET_ONLY}).", flag_values=FLAGS)
flags.DEFINE_float("temperature", 0.0, "0: greedy; > 0: speculative sampling (config.eval.acceptance).",
                   flag_values=FLAGS)
flags.DEFINE_integer("max_new_tokens", None, "Longest answer (default: config.sample.max_new_tokens).",
                     flag_values=FLAGS)
flags.DEFINE_bool("json", False, "One JSON line per answer (text, tokens, per_step, pieces, tau, tokens_per_s) "
                  "instead of the text.", flag_values=FLAGS)


def main(config):
    if FLAGS.prompt is not None and FLAGS.prompts:
        raise InputError("--prompt and --prompts: choose one")
    if FLAGS.prompts:
        texts = [q.turns[0] for q in load_dataset_entry(FLAGS.prompts, FLAGS.num_prompts).questions]
    else:
        texts = [FLAGS.prompt if FLAGS.prompt is not None else config.sample.prompt]
    if not all(t.strip() for t in texts):
        raise InputError("--prompt: empty")
    decoder = FLAGS.decoder or ("dflash" if FLAGS.checkpoint else TARGET_ONLY)
    if decoder != TARGET_ONLY and decoder not in spec_decoders():
        raise InputError(f"--decoder={decoder}: choose {TARGET_ONLY} or one of {', '.join(spec_decoders())}")
    if FLAGS.temperature < 0:
        raise InputError(f"--temperature={FLAGS.temperature}: expected >= 0")
    max_new_tokens = FLAGS.max_new_tokens or config.sample.max_new_tokens
    if FLAGS.checkpoint:
        check_drafter_dir(FLAGS.checkpoint, "--checkpoint")
    resolve_target(config, [FLAGS.checkpoint])
    answers = answer_prompts(config, texts, checkpoint=FLAGS.checkpoint, decoder=decoder,
                             temperature=FLAGS.temperature, max_new_tokens=max_new_tokens)
    for answer in answers:
        print(json.dumps(answer.as_dict()) if FLAGS.json else render(answer), flush=True)


if __name__ == "__main__":
    cli.run(main, FLAGS)
