"""Regenerate the assistant turns of a conversation set with the target (greedy, thinking off),
as the DFlash recipe trains on target-generated text.

    python -m xpress_jax.generate --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B \
        --input=/data/prompts.jsonl --output=/data/regenerated

Reads `{"id", "conversations": [...]}` (or question/answer) records, keeps every turn up to each
assistant turn, and replaces that turn with the target's greedy reply. Writes
OUTPUT/data.jsonl, appending, and skips ids already there, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from absl import flags
from tqdm import tqdm

from xpress_jax import cli
from xpress_jax.assemble import build_target, target_config
from xpress_jax.data.byte_tokenizer import tokenizer_for
from xpress_jax.data.chat import normalise_messages, prompt_ids
from xpress_jax.data.dataset import read_records
from xpress_jax.decoding.speculative import SpecModels, generate
from xpress_jax.errors import DataError

log = logging.getLogger("xpress_jax.generate")

flags.DEFINE_string("input", None, "Conversation jsonl (or question/answer jsonl) to regenerate.")
flags.DEFINE_string("output", None, "Output directory (data.jsonl inside; appended, resumable).")
flags.DEFINE_integer("batch_size", 8, "Prompts decoded together.")
flags.DEFINE_integer("max_new_tokens", 1024, "Longest reply.")
flags.DEFINE_integer("max_prompt_tokens", 2048, "Longer prompts are skipped (with a count in the log).")
FLAGS = flags.FLAGS


def done_ids(path: str) -> set[str]:
    if not os.path.isfile(path):
        return set()
    with open(path) as f:
        return {json.loads(line)["id"] for line in f if line.strip()}


def regenerate_batch(model, tokenizer, records: list[dict], stops, max_new: int, max_prompt: int) -> list:
    """Replaces the assistant turns of several records, turn by turn; each turn's prompts decode
    together (one jitted call, prompt lengths bucketed to 64 so compiles are reused)."""
    turns = [normalise_messages(r) for r in records]
    outs: list[list | None] = [[] for _ in records]
    cursor = [0] * len(records)
    while True:
        prompts, owners = [], []
        for i, messages in enumerate(turns):
            if outs[i] is None:
                continue
            while cursor[i] < len(messages) and messages[cursor[i]]["role"] != "assistant":
                outs[i].append(messages[cursor[i]])
                cursor[i] += 1
            if cursor[i] == len(messages):
                continue
            ids = prompt_ids(tokenizer, outs[i])
            if len(ids) > max_prompt:
                outs[i] = None
                continue
            prompts.append(ids)
            owners.append(i)
        if not prompts:
            break
        replies = generate(SpecModels(model), prompts, decoder="target", max_new_tokens=max_new,
                           stop_ids=stops, pad_multiple=64).tokens
        for i, reply in zip(owners, replies):
            outs[i].append({"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)})
            cursor[i] += 1
    return [None if o is None else {"id": r["id"], "conversations": o} for r, o in zip(records, outs)]


def regenerate(config, input_path: str, output_dir: str, *, batch_size: int = 8, max_new_tokens: int = 1024,
               max_prompt_tokens: int = 2048, limit: int | None = None) -> dict:
    """Regenerates the records of input_path (the first `limit`) into OUTPUT/data.jsonl, resuming."""
    records = read_records([input_path])[:limit]
    for i, r in enumerate(records):
        r["id"] = str(r["id"]) if r.get("id") is not None else str(i)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "data.jsonl")
    finished = done_ids(path)
    todo = [r for r in records if r["id"] not in finished]
    print(f"regenerate: {len(records)} records, {len(finished)} already regenerated, {len(todo)} to go",
          file=sys.stderr)
    model = build_target(config)
    tokenizer = tokenizer_for(config.target.hf_dir, target_config(config).vocab_size)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    skipped = 0
    with open(path, "a") as f:
        bar = tqdm(total=len(todo), desc="regenerate", dynamic_ncols=True)
        for start in range(0, len(todo), batch_size):
            chunk = todo[start:start + batch_size]
            for new in regenerate_batch(model, tokenizer, chunk, stops, max_new_tokens, max_prompt_tokens):
                if new is None:
                    skipped += 1
                else:
                    f.write(json.dumps(new) + "\n")
            f.flush()  # a killed run loses at most the batch in flight
            bar.update(len(chunk))
        bar.close()
    print(f"regenerate: done, {path} ({skipped} skipped as too long)", file=sys.stderr)
    return {"records": len(records), "skipped_long": skipped, "path": path}


def main(config):
    if not FLAGS.input or not FLAGS.output:
        raise DataError("--input and --output are required")
    cli.log_to_file(os.path.join(FLAGS.output, "log.txt"))
    regenerate(config, FLAGS.input, FLAGS.output, batch_size=FLAGS.batch_size, max_new_tokens=FLAGS.max_new_tokens,
               max_prompt_tokens=FLAGS.max_prompt_tokens)


if __name__ == "__main__":
    cli.run(main)
