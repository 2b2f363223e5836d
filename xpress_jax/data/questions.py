"""Evaluation questions, from three kinds of `--datasets` entry:

- a shipped set's name (`gsm8k`, `humaneval`, `mt_bench`, `alpaca`: the 80-question Spec-Bench
  files in `xpress_jax/assets/data`), the first user turn of the first N records;
- a path to any jsonl of questions (the first user turn of each record); a file whose records are
  one published benchmark's is read as that benchmark, and one that several benchmarks' schemas
  match is refused naming them and the NAME=PATH form;
- `NAME=PATH`: one of the papers' eight benchmarks (`data/benchmarks.py`) read from the file, or the
  folder's test split, that benchmark publishes, and asked as the DFlash harness asks it. Nothing
  is downloaded.
"""

from __future__ import annotations

import os

from xpress_jax.assets import data_root
from xpress_jax.data.benchmarks import PUBLISHED, Question, QuestionSet, load_benchmark, published_schemas
from xpress_jax.data.json_files import json_records
from xpress_jax.errors import DataError

BENCHMARKS = ("gsm8k", "humaneval", "mt_bench", "alpaca")  # shipped


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


def _shipped_or_file(name_or_path: str) -> str:
    path = os.path.join(data_root(), "spec_bench80", f"{name_or_path}.jsonl") if name_or_path in BENCHMARKS \
        else name_or_path
    if not os.path.isfile(path):
        hint = f" (shipped sets: {', '.join(BENCHMARKS)}; data root {data_root()})" if "/" not in name_or_path else ""
        raise DataError(f"question file {path!r} does not exist{hint}")
    return path


def load_questions(name_or_path: str, limit: int | None = None) -> list[str]:
    """First-turn questions of a shipped set's name or a question file (.jsonl, .jsonl.gz, a JSON
    array), the first `limit` in file order."""
    return [q.turns[0] for q in _question_file(_shipped_or_file(name_or_path), limit or 0).questions]


def dataset_label(entry: str) -> str:
    """What results call a `--datasets` entry: NAME of NAME=PATH, else the entry itself."""
    return entry.split("=", 1)[0] if "=" in entry else entry


def _question_file(path: str, count: int) -> QuestionSet:
    """A plain question file's first `count` questions (0: all), first turns, in file order."""
    questions = []
    for record, where in json_records(path):
        questions.append(Question((_first_question(record, where),), where))
        if count and len(questions) >= count:
            break
    if not questions:
        raise DataError(f"{path}: no questions")
    return QuestionSet(questions, {"benchmark": None, "files": [path], "asked": count or None,
                                   "count": len(questions), "selection": "the first, in file order",
                                   "turns": "the first"})


def load_dataset_entry(entry: str, count: int = 0, announce=print) -> QuestionSet:
    """The questions of one `--datasets` entry (see the module's docstring); `count` 0 takes a
    published benchmark's harness count and every question of any other file."""
    if "=" in entry:
        name, path = entry.split("=", 1)
        return load_benchmark(name, path, count)
    path = _shipped_or_file(entry)
    if entry in BENCHMARKS:
        return _question_file(path, count)
    first = next(json_records(entry), (None, ""))[0]
    names = published_schemas(first)
    if len(names) > 1:
        raise DataError(f"{entry}: its records match the schemas of {' and '.join(names)}; name the benchmark "
                        f"({names[0]}={entry})")
    if names:
        announce(f"{entry}: read as {names[0]} (its records are {PUBLISHED[names[0]].source}'s; "
                 f"{names[0]}={entry} says so)")
        return load_benchmark(names[0], entry, count)
    return _question_file(entry, count)
