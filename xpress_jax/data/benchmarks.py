"""The papers' eight benchmarks, read from the files their publishers ship and asked as the official
`dflash` package's benchmark harness asks them (z-lab/dflash at commit 5034c8b, `benchmark.py` and
`model/utils.py`, the last version with all eight; docs/evaluation.md lists every choice).

What is taken from the harness: each benchmark's question count and its seeded selection (a count
below the split's size takes `datasets.Dataset.shuffle(seed=0).select(range(count))`, which is
numpy's `default_rng(0).permutation(size)[:count]`; otherwise the whole split in file order), each
user turn byte for byte, and MT-Bench's two turns. Where the papers say otherwise they win: AIME is
opencompass's AIME 2025 (the D-Loop paper's source; the harness reads AIME 2024 and MathArena's
2025 copy), asked as the harness asks AIME.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Callable

import numpy as np

from xpress_jax.data.json_files import json_records
from xpress_jax.errors import DataError

HARNESS_COMMIT = "5034c8b"  # z-lab/dflash, 2026-02-06: benchmark.py + model/utils.py + run_benchmark.sh
SELECTION_SEED = 0  # dataset.shuffle(seed=0) in the harness

BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{}\n```"
LIVECODEBENCH_LEAD = ("You are an expert Python programmer. You will be given a question (problem specification) and "
                      "will generate a correct Python program that matches the specification and passes all tests. "
                      "You will NOT return anything except for the program")


def livecodebench_turn(r: dict) -> str:
    """LiveCodeBench's code-generation question: the lead sentence, the question, the format (the
    starter code when the record has one, else a stub) and the answer line."""
    if r["starter_code"]:
        how = f"### Format: Use the following code structure:\n```python\n{r['starter_code']}\n```"
    else:
        how = "### Format: Write your code in the following format:\n```python\n# YOUR CODE HERE\n```"
    return (f"{LIVECODEBENCH_LEAD}\n\n### Question:\n{r['question_content']}\n\n{how}\n\n"
            "### Answer: (use the provided format with backticks)")


def alpaca_turn(r: dict) -> str:
    return f"{r['instruction']}\n\nInput:\n{r['input']}" if r.get("input") else r["instruction"]


def _gsm8k_answer(r: dict) -> bool:  # a GSM8K solution ends "#### N"
    return "\n#### " in r["answer"]


def _integer_answer(r: dict) -> bool:  # AIME answers are integers 0..999
    return str(r["answer"]).strip().isdigit()


def _mbpp_test(r: dict) -> bool:  # google-research/mbpp README: task ids 11-510 are the test split
    return 11 <= r["task_id"] <= 510


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One of the papers' benchmarks as its publisher ships it."""

    domain: str  # math, code or chat
    source: str  # who publishes the files
    test_split: tuple[str, ...]  # the files of the test split, in the order they are read
    fields: dict[str, type]  # required fields and their types; the first is the question itself
    turns: Callable[[dict], list[str]]  # the record as the user turns the harness asks
    count: int  # the harness's question count (run_benchmark.sh)
    check: Callable[[dict], bool] | None = None  # a record of this benchmark (when the fields are shared)
    in_split: Callable[[dict], bool] | None = None  # a file holding several splits: this record is in the test split
    id_field: str | None = None  # the record's own id, reported beside its file and line

    def matches(self, record) -> bool:
        return (isinstance(record, dict) and all(isinstance(record.get(f), t) for f, t in self.fields.items())
                and bool(record[next(iter(self.fields))]) and (self.check is None or self.check(record)))

    def wanted(self) -> str:
        return ", ".join(f"{f}: {t.__name__}" for f, t in self.fields.items())


PUBLISHED: dict[str, Benchmark] = {
    "gsm8k": Benchmark("math", "openai/grade-school-math", ("test.jsonl",), {"question": str, "answer": str},
                       lambda r: [r["question"] + BOXED], 128, check=_gsm8k_answer),
    "math500": Benchmark("math", "HuggingFaceH4/MATH-500", ("test.jsonl",),
                         {"problem": str, "answer": str, "unique_id": str}, lambda r: [r["problem"] + BOXED], 128,
                         id_field="unique_id"),
    "aime2025": Benchmark("math", "opencompass/AIME2025", ("aime2025-I.jsonl", "aime2025-II.jsonl"),
                          {"question": str, "answer": str}, lambda r: [r["question"] + BOXED], 30,
                          check=_integer_answer),
    "humaneval": Benchmark("code", "openai/human-eval", ("HumanEval.jsonl.gz",), {"task_id": str, "prompt": str},
                           lambda r: [HUMANEVAL.format(r["prompt"])], 164, id_field="task_id"),
    "mbpp": Benchmark("code", "google-research/mbpp", ("sanitized-mbpp.json",),
                      {"prompt": str, "task_id": int, "test_list": list}, lambda r: [r["prompt"]], 128,
                      in_split=_mbpp_test, id_field="task_id"),
    "livecodebench": Benchmark("code", "livecodebench/code_generation_lite",
                               ("test.jsonl",) + tuple(f"test{i}.jsonl" for i in range(2, 7)),
                               {"question_content": str, "starter_code": str}, lambda r: [livecodebench_turn(r)],
                               128, id_field="question_id"),
    "mt_bench": Benchmark("chat", "lm-sys/FastChat mt_bench", ("question.jsonl",), {"turns": list, "category": str},
                          lambda r: list(r["turns"]), 80, id_field="question_id"),
    "alpaca": Benchmark("chat", "tatsu-lab/stanford_alpaca", ("alpaca_data.json",), {"instruction": str},
                        lambda r: [alpaca_turn(r)], 128),
}


@dataclasses.dataclass(frozen=True)
class Question:
    """One question as asked: its user turns (MT-Bench: two, each answered in its own response)
    and where it came from ("file:line", with the record's id where it has one)."""
    turns: tuple[str, ...]
    source: str


@dataclasses.dataclass(frozen=True)
class QuestionSet:
    questions: list[Question]
    protocol: dict  # what results.json records: benchmark, files, split size, count asked, selection


def test_split_files(name: str, path: str) -> list[str]:
    """The files of benchmark `name`'s test split under `path`: the file itself, or in a folder laid
    out as the publisher ships it, the split's files by name. A folder without them is refused
    naming the files it holds."""
    bench = PUBLISHED[name]
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise DataError(f"{name}={path}: no such file or folder (expected {bench.source}'s "
                        f"{', '.join(bench.test_split)})")
    present = [f for f in bench.test_split if os.path.isfile(os.path.join(path, f))]
    if len(present) == len(bench.test_split):
        return [os.path.join(path, f) for f in bench.test_split]
    held = sorted(os.path.basename(f) for f in glob.glob(os.path.join(path, "*.json*")))
    missing = [f for f in bench.test_split if f not in present]
    raise DataError(f"{name}={path}: no test split: {bench.source}'s test split is {', '.join(bench.test_split)} "
                    f"(missing {', '.join(missing)}); the folder holds {', '.join(held) or 'no JSON files'}; "
                    f"name the file to read it (NAME=FILE)")


def selection(size: int, count: int) -> tuple[np.ndarray, str]:
    """The harness's choice of `count` of `size` questions (count 0: all): the seeded shuffle when
    the split is larger, else every question in file order."""
    if count and size > count:
        return (np.random.default_rng(SELECTION_SEED).permutation(size)[:count],
                f"seeded shuffle (numpy default_rng({SELECTION_SEED}).permutation, as datasets' shuffle(seed=0))")
    return np.arange(size), "all, in file order"


def load_benchmark(name: str, path: str, count: int = 0) -> QuestionSet:
    """Benchmark `name`'s questions from its test split under `path`: `count` of them (0: the
    harness's count) chosen as the harness chooses them; a count above the split's size takes it whole."""
    if name not in PUBLISHED:
        raise DataError(f"{name}={path}: unknown benchmark {name!r}; the published readers are "
                        f"{', '.join(PUBLISHED)}")
    bench = PUBLISHED[name]
    files = test_split_files(name, path)
    found = []
    for file in files:
        for record, where in json_records(file):
            if not bench.matches(record):
                got = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise DataError(f"{where}: not a record of {bench.source}: expected fields ({bench.wanted()}), the "
                                f"first non-empty; got {got}")
            if bench.in_split is None or bench.in_split(record):
                turns = tuple(bench.turns(record))
                if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
                    raise DataError(f"{where}: not a record of {bench.source}: its turns must be non-empty strings")
                rid = record.get(bench.id_field) if bench.id_field else None
                found.append(Question(turns, where if rid is None else f"{where} ({bench.id_field} {rid})"))
    if not found:
        raise DataError(f"{name}={path}: no questions in its test split")
    asked = count or bench.count
    chosen, how = selection(len(found), asked)
    protocol = {"benchmark": name, "source": bench.source, "files": files, "split_size": len(found),
                "asked": asked, "count": int(len(chosen)), "selection": how,
                "turns": "every turn, each a response" if any(len(q.turns) > 1 for q in found) else "one"}
    return QuestionSet([found[i] for i in chosen], protocol)


def published_schemas(record) -> list[str]:
    """The benchmarks whose schema a record matches (several when their fields coincide)."""
    return [name for name, bench in PUBLISHED.items() if bench.matches(record)]
