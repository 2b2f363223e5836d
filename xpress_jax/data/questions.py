"""Evaluation questions, from three kinds of `--datasets` entry:

- a shipped set's name (`gsm8k`, `humaneval`, `mt_bench`, `alpaca`: the 80-question Spec-Bench
  files in `xpress_jax/assets/data`);
- a path to any jsonl of questions (the first user turn of each record);
- `NAME=PATH`: one of the papers' eight benchmarks (`PUBLISHED`) read from the file, or the folder
  of files, that benchmark publishes, in its own schema, and asked as the DFlash harness asks it.
  A record not in that schema is refused naming the file and line. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
from typing import Callable

from xpress_jax.assets import data_root
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


# how the official dflash benchmark asks maths and HumanEval questions
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{}\n```"


def _livecodebench(r: dict) -> str:
    """LiveCodeBench's code-generation question: complete the starter code, or read stdin."""
    if r["starter_code"].strip():
        how = ("You will use the following starter code to write the solution to the problem and enclose your code "
               f"within delimiters.\n```python\n{r['starter_code']}\n```")
    else:
        how = ("Read the inputs from stdin, solve the problem and write the answer to stdout. Enclose your code "
               "within delimiters as follows.\n```python\n# YOUR CODE HERE\n```")
    return f"### Question\n{r['question_content']}\n\n### Format\n{how}\n\n### Answer (use the provided format with backticks)\n"


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One of the papers' benchmarks as its publisher ships it."""

    domain: str  # math, code or chat
    files: str  # what PATH is: the published file(s), and a folder's glob for them
    pattern: str  # inside a folder PATH, the files read (sorted)
    schema: tuple[dict[str, type], ...]  # alternative sets of required fields and their types
    prompt: Callable[[dict], str]  # the record as one user turn

    def question(self, record, where: str) -> str:
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for fields in self.schema:  # the first field is the question itself, so it may not be empty
            if all(isinstance(record.get(f), kind) for f, kind in fields.items()) and record[next(iter(fields))]:
                text = self.prompt(record)
                if isinstance(text, str) and text.strip():
                    return text
        wanted = " or ".join("(" + ", ".join(f"{f}: {kind.__name__}" for f, kind in fields.items()) + ")"
                             for fields in self.schema)
        raise DataError(f"{where}: not a record of {self.files}: expected fields {wanted}, the first non-empty; "
                        f"got fields {sorted(record)}")


PUBLISHED: dict[str, Benchmark] = {
    "gsm8k": Benchmark("math", "openai/grade-school-math test.jsonl", "*.jsonl", ({"question": str, "answer": str},),
                       lambda r: r["question"] + BOXED),
    "math500": Benchmark("math", "HuggingFaceH4/MATH-500 test.jsonl", "*.jsonl", ({"problem": str, "answer": str, "unique_id": str},),
                         lambda r: r["problem"] + BOXED),
    "aime2025": Benchmark("math", "opencompass/AIME2025 aime2025-I.jsonl and aime2025-II.jsonl", "*.jsonl",
                          ({"question": str},), lambda r: r["question"] + BOXED),
    "humaneval": Benchmark("code", "openai/human-eval HumanEval.jsonl.gz", "*.jsonl*", ({"task_id": str, "prompt": str},),
                           lambda r: HUMANEVAL.format(r["prompt"])),
    # sanitized-mbpp.json (a JSON array, `prompt`), as the DFlash harness reads; mbpp.jsonl (`text`) too
    "mbpp": Benchmark("code", "google-research/mbpp sanitized-mbpp.json or mbpp.jsonl", "*mbpp*.json*",
                      ({"prompt": str}, {"text": str}), lambda r: r.get("prompt", r.get("text"))),
    "livecodebench": Benchmark("code", "livecodebench/code_generation_lite test*.jsonl", "test*.jsonl",
                               ({"question_content": str, "starter_code": str},), _livecodebench),
    "mt_bench": Benchmark("chat", "lm-sys/FastChat mt_bench question.jsonl (first turns)", "*.jsonl",
                          ({"turns": list, "category": str},), lambda r: r["turns"][0]),
    "alpaca": Benchmark("chat", "tatsu-lab/stanford_alpaca alpaca_data.json", "*.json",
                        ({"instruction": str},),
                        lambda r: r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else "")),
}


def published_records(path: str):
    """(record, "path:line") of a jsonl(.gz) file, or of a JSON array file (each element's line)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    start = len(text) - len(text.lstrip())
    if text[start:start + 1] == "[":
        decoder, pos = json.JSONDecoder(), start + 1
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text) or text[pos] == "]":
                return
            line = text.count("\n", 0, pos) + 1
            try:
                record, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{line}: not JSON ({e.msg})") from None
            yield record, f"{path}:{line}"
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                yield json.loads(line), f"{path}:{i + 1}"
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{i + 1}: not JSON ({e.msg})") from None


def dataset_label(entry: str) -> str:
    """What results call a `--datasets` entry: NAME of NAME=PATH, else the entry itself."""
    return entry.split("=", 1)[0] if "=" in entry else entry


def load_published(name: str, path: str, limit: int | None = None) -> list[str]:
    """Questions of benchmark `name` (a key of PUBLISHED) from its published file, or from every
    matching file of a folder, in file order."""
    if name not in PUBLISHED:
        raise DataError(f"{name}={path}: unknown benchmark {name!r}; the published readers are "
                        f"{', '.join(PUBLISHED)}")
    bench = PUBLISHED[name]
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, bench.pattern)))
        if not files:
            raise DataError(f"{name}={path}: no {bench.pattern} files in the folder (expected {bench.files})")
    elif os.path.isfile(path):
        files = [path]
    else:
        raise DataError(f"{name}={path}: no such file or folder (expected {bench.files})")
    questions = []
    for file in files:
        for record, where in published_records(file):
            questions.append(bench.question(record, where))
            if limit and len(questions) >= limit:
                return questions
    if not questions:
        raise DataError(f"{name}={path}: no questions")
    return questions


def load_dataset_entry(entry: str, limit: int | None = None) -> list[str]:
    """Questions of one `--datasets` entry (see the module's docstring)."""
    if "=" in entry:
        name, path = entry.split("=", 1)
        return load_published(name, path, limit)
    return load_questions(entry, limit)
