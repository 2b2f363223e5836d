"""Training data: conversation jsonl (or ArrayRecord) -> grain pipeline of padded token batches.

Records are `{"id", "conversations": [{"role", "content"}, ...]}`; GSM8K-style
`{"question", "answer"}` records are read as one user/assistant exchange. Each record becomes
ids [max_len] int32 and loss_mask [max_len] bool (assistant tokens), right-padded. Shuffling is
deterministic by seed, and the iterator's state (JSON) is saved with every checkpoint.
"""

from __future__ import annotations

import json
import os
from typing import Iterable

import grain
import numpy as np

from xpress_jax.data.byte_tokenizer import pad_id
from xpress_jax.data.chat import conversation_to_ids, normalise_messages
from xpress_jax.data.json_files import json_records
from xpress_jax.errors import DataError

def _as_conversation(record, where: str) -> dict:
    """A record as {"id", "conversations"}, its turns checked, or a DataError naming `where` (file:line)."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a record must be a JSON object, found {type(record).__name__}")
    if "choices" in record or ("custom_id" in record and "response" in record):
        raise DataError(f"{where}: a chat-completion response (vLLM / SGLang output) holds the reply but not its "
                        "prompt; write each as {\"conversations\": [the request's messages..., {\"role\": "
                        "\"assistant\", \"content\": choices[0].message.content}]}")
    if record.get("status", "success") != "success":  # SpecForge's regeneration marks its failures
        raise DataError(f"{where}: record {record.get('id', '?')!r} has status {record['status']!r} "
                        f"({record.get('error', 'no error given')}); train on SpecForge's successful records only")
    if not ("conversations" in record or "messages" in record):
        if not (isinstance(record.get("question"), str) and isinstance(record.get("answer"), str)):
            raise DataError(f"{where}: record {record.get('id', '?')!r} has neither conversations nor "
                            "question/answer")
        record = {"id": record.get("id"), "conversations": [{"role": "user", "content": record["question"]},
                                                             {"role": "assistant", "content": record["answer"]}]}
    try:
        normalise_messages(record)  # every record checked before training starts, not mid-run
    except DataError as e:
        raise DataError(f"{where}: {e}") from None
    return record


def read_records(paths: Iterable[str]) -> list[dict]:
    """All records of jsonl(.gz), JSON array or .array_record files (JSON per record), each validated."""
    records = []
    paths = list(paths)
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"data file {path!r} does not exist")
        if path.endswith(".array_record"):
            source = grain.sources.ArrayRecordDataSource([path])
            for i in range(len(source)):
                try:
                    row = json.loads(source[i])
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise DataError(f"{path}: record {i}: not JSON ({e})") from None
                records.append(_as_conversation(row, f"{path}: record {i}"))
        else:
            records.extend(_as_conversation(row, where) for row, where in json_records(path))
    if not records:
        raise DataError(f"no records in {paths}")
    return records


class Tokenize(grain.transforms.Map):
    def __init__(self, tokenizer, max_len: int):
        self.tokenizer = tokenizer
        self.max_len = max_len
        self.pad = pad_id(tokenizer)

    def map(self, record: dict) -> dict:
        ids, mask = conversation_to_ids(self.tokenizer, record, self.max_len)
        out_ids = np.full(self.max_len, self.pad, np.int32)
        out_mask = np.zeros(self.max_len, bool)
        out_ids[:len(ids)], out_mask[:len(mask)] = ids, mask
        return {"ids": out_ids, "loss_mask": out_mask}


def has_anchor(example: dict) -> bool:
    """At least one position p with p and p + 1 supervised."""
    m = example["loss_mask"]
    return bool(np.any(m[:-1] & m[1:]))


def make_dataset(records: list[dict], tokenizer, *, max_len: int, batch_size: int, seed: int,
                 num_epochs: int | None = None, process_index: int = 0, process_count: int = 1,
                 check: int = 64) -> grain.IterDataset:
    """Shuffled, repeated (None: forever), per-process sharded, tokenized, filtered and batched."""
    tok = Tokenize(tokenizer, max_len)
    probe = [tok.map(r) for r in records[:check]]
    if not any(has_anchor(e) for e in probe):
        cut = sum(has_anchor({"loss_mask": conversation_to_ids(tokenizer, r)[1]}) for r in records[:check])
        if cut:
            raise DataError(f"none of the first {len(probe)} records has assistant tokens within data.max_len="
                            f"{max_len}: in {cut} of them the assistant turn starts past it (raise data.max_len)")
        raise DataError(f"none of the first {len(probe)} records has assistant tokens to train on "
                        f"(check the roles: the loss covers 'assistant' turns)")
    ds = grain.MapDataset.source(records).seed(seed).shuffle()
    ds = ds.repeat(num_epochs)
    if process_count > 1:
        ds = ds[process_index::process_count]
    ds = ds.map(tok).filter(has_anchor)
    return ds.to_iter_dataset().batch(batch_size, drop_remainder=True)
