"""Regenerating a conversation set with the target: every assistant turn replaced by the target's
greedy reply to the turns before it, appended to OUTPUT/data.jsonl and resumable by record id.

The replies decode with continuous batching (`decoding/continuous.py`): each device's rows take
the next prompt as soon as an answer ends. A target split over devices (`--tensor_parallel`)
decodes static batches instead."""

from __future__ import annotations

import json
import os
import sys

import jax
from flax import nnx
from tqdm import tqdm

from xpress_jax.data.byte_tokenizer import tokenizer_for
from xpress_jax.data.chat import normalise_messages, prompt_ids
from xpress_jax.data.dataset import read_records
from xpress_jax.decoding.continuous import rows_that_fit, serve_greedy
from xpress_jax.decoding.devices import batch_mesh, place_on_tensor_mesh, replicate, tensor_mesh
from xpress_jax.errors import InputError
from xpress_jax.decoding.padding import PROMPT_BUCKET
from xpress_jax.decoding.speculative import DecodingModels, generate
from xpress_jax.models.build import build_target, target_config


def done_ids(path: str) -> set[str]:
    if not os.path.isfile(path):
        return set()
    with open(path) as f:
        return {json.loads(line)["id"] for line in f if line.strip()}


def regenerate_batch(model, tokenizer, records: list[dict], stops, max_new: int, max_prompt: int,
                     devices: int = 1, rows: int = 8, continuous: bool = True) -> list:
    """Replaces the assistant turns of several records, turn by turn; each turn's prompts decode in
    one jitted call split over `devices`: `rows` rows per device serve them continuously, or (a
    target split over devices) static batches of `rows` rows. Prompts are padded to their bucket
    (`prompt_buckets`), so a run compiles once per bucket, whatever its turn counts and lengths."""
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
        if continuous:
            replies = serve_greedy(model, prompts, rows=rows, max_new_tokens=max_new, stop_ids=stops,
                                   devices=devices).tokens
        else:
            replies = generate(DecodingModels(model), prompts, decoder="target", max_new_tokens=max_new,
                               stop_ids=stops, pad_multiple=PROMPT_BUCKET, devices=devices, min_rows=rows).tokens
        for i, reply in zip(owners, replies):
            outs[i].append({"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)})
            cursor[i] += 1
    return [None if o is None else {"id": r["id"], "conversations": o} for r, o in zip(records, outs)]


def regenerate(config, input_path: str, output_dir: str, *, batch_size: int, max_new_tokens: int,
               max_prompt_tokens: int, limit: int | None = None, devices: int = 0, tensor_parallel: int = 1) -> dict:
    """Regenerates the records of input_path (the first `limit`) into OUTPUT/data.jsonl, resuming.
    The prompts are served by `batch_size` rows split over `devices` local devices (0: all of them;
    batch_size 0: as many rows per device as its memory holds, `rows_that_fit`), or, with
    tensor_parallel > 1, the target is split over that many devices and batches are static
    (decoding/devices.py). Records go in groups of 8 x batch_size, each written when done."""
    if tensor_parallel > 1 and devices > 1:
        raise InputError(f"--devices={devices} splits the batch and --tensor_parallel={tensor_parallel} the target; "
                         "choose one")
    split = tensor_mesh(tensor_parallel, target_config(config))  # bad counts are refused before anything is read
    devices = 1 if split is not None else devices or jax.local_device_count()
    mesh = batch_mesh(devices)
    records = read_records([input_path])[:limit]
    for i, r in enumerate(records):
        r["id"] = str(r["id"]) if r.get("id") is not None else str(i)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "data.jsonl")
    finished = done_ids(path)
    todo = [r for r in records if r["id"] not in finished]
    print(f"regenerate: {len(records)} records, {len(finished)} already regenerated, {len(todo)} to go",
          file=sys.stderr)
    model = build_target(config, mesh=split)  # a split target goes to its shards weight by weight
    if mesh is not None:  # the weights go to every device once, not with every batch
        nnx.update(model, replicate(nnx.state(model), mesh))
    if split is not None:
        place_on_tensor_mesh(DecodingModels(model), split)
    tokenizer = tokenizer_for(config.data.tokenizer_dir or config.target.hf_dir, target_config(config).vocab_size)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    if batch_size == 0:
        per_device = rows_that_fit(model, max_prompt_tokens + max_new_tokens + 1)
        batch_size = per_device * devices
        print(f"regenerate: {per_device} rows per device ({batch_size} in all), sized from its memory", file=sys.stderr)
    if batch_size % devices:
        raise InputError(f"--batch_size={batch_size} rows do not split over {devices} devices")
    group = 8 * batch_size  # written after each group: a killed run loses at most one
    skipped = 0
    with open(path, "a") as f:
        bar = tqdm(total=len(todo), desc="regenerate", dynamic_ncols=True)
        for start in range(0, len(todo), group):
            chunk = todo[start:start + group]
            for new in regenerate_batch(model, tokenizer, chunk, stops, max_new_tokens, max_prompt_tokens, devices,
                                        rows=batch_size // devices if split is None else batch_size,
                                        continuous=split is None):
                if new is None:
                    skipped += 1
                else:
                    f.write(json.dumps(new) + "\n")
            f.flush()  # a killed run loses at most the group in flight
            bar.update(len(chunk))
        bar.close()
    print(f"regenerate: done, {path} ({skipped} skipped as too long)", file=sys.stderr)
    return {"records": len(records), "skipped_long": skipped, "path": path}
