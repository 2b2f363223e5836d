"""Evaluation questions: the benchmark sets that ship in `xpress_jax/assets/data`, or any jsonl of questions."""

from __future__ import annotations

import gzip
import json
import os

from xpress_jax.assets import data_root
from xpress_jax.errors import DataError

BENCHMARKS = ("gsm8k", "humaneval", "mt_bench", "alpaca")


def _first_question(record, where: str) -> str:
    """The first user turn: `turns[0]`, `question`, `prompt`, `instruction` or the first user
    message of `conversations` / `messages`; anything else is refused naming the file and line."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "turns" in record:
        turns = record["turns"]
        if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
            raise DataError(f"{where}: 'turns' must be a non-empty list of strings")
        return turns[0]
    for key in ("question", "prompt", "instruction"):
        if key in record:
            if not isinstance(record[key], str):
                raise DataError(f"{where}: {key!r} must be a string, got {type(record[key]).__name__}")
            return record[key]
    turns = record.get("conversations", record.get("messages"))
    if turns is not None:
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise DataError(f"{where}: 'conversations' / 'messages' must be a list of objects")
        for turn in turns:
            if turn.get("role", turn.get("from")) in ("user", "human"):
                content = turn.get("content", turn.get("value"))
                if not isinstance(content, str):
                    raise DataError(f"{where}: the first user turn has no string 'content' / 'value'")
                return content
    raise DataError(f"{where}: no question found (expected turns, question, prompt, instruction or conversations)")


def load_questions(name_or_path: str, limit: int | None = None) -> list[str]:
    """First-turn questions of a benchmark name (spec_bench80 sets) or a .jsonl(.gz) path."""
    if name_or_path in BENCHMARKS:
        path = os.path.join(data_root(), "spec_bench80", f"{name_or_path}.jsonl")
    else:
        path = name_or_path
    if not os.path.isfile(path):
        hint = f" (benchmarks: {', '.join(BENCHMARKS)}; data root {data_root()})" if "/" not in name_or_path else ""
        raise DataError(f"question file {path!r} does not exist{hint}")
    opener = gzip.open if path.endswith(".gz") else open
    questions = []
    with opener(path, "rt") as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{i + 1}: not JSON ({e})") from None
                questions.append(_first_question(record, f"{path}:{i + 1}"))
            if limit and len(questions) >= limit:
                break
    if not questions:
        raise DataError(f"{path}: no questions")
    return questions
