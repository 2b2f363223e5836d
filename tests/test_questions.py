"""Evaluation questions: the shipped sets, any jsonl, and the papers' eight benchmarks read from
their published files (fixtures in tests/data/benchmarks, one per schema)."""

import json
import os

import pytest

from xpress_jax.data.questions import (BENCHMARKS, BOXED, PUBLISHED, dataset_label, load_dataset_entry,
                                       load_published, load_questions, published_records)
from xpress_jax.errors import DataError

FIXTURES = os.path.join(os.path.dirname(__file__), "data", "benchmarks")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_questions_load(name):
    questions = load_questions(name, 5)
    assert len(questions) == 5 and all(isinstance(q, str) and q for q in questions)


def test_question_files_and_errors(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "a?"}\n\n{"conversations": [{"role": "user", "content": "b?"}]}\n')
    assert load_questions(str(path)) == ["a?", "b?"]
    with pytest.raises(DataError, match="does not exist"):
        load_questions("nonexistent_benchmark")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no questions"):
        load_questions(str(tmp_path / "empty.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"answer": 1}\n')
    with pytest.raises(DataError, match="bad.jsonl:1: no question"):
        load_questions(str(tmp_path / "bad.jsonl"))


EXPECTED = {  # entry -> (number of questions, the first as asked)
    "gsm8k": (2, "A baker fills 4 trays with 6 rolls each. How many rolls are there?" + BOXED),
    "math500": (2, "What is $2^5 - 5^2$?" + BOXED),
    "aime2025": (2, "Find the number of ordered pairs $(a,b)$ of positive integers with $a+b=20$." + BOXED),
    "humaneval": (2, "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
                     "def add(a: int, b: int) -> int:\n    \"\"\"Return the sum of a and b.\"\"\"\n\n```"),
    "mbpp": (2, "Write a function to find the shared elements from the given two lists."),
    "livecodebench": (2, None),
    "mt_bench": (2, "Write a short note inviting a neighbour to a picnic."),
    "alpaca": (2, "Give three tips for staying healthy."),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_each_benchmark_reads_its_published_files(name):
    """Every reader, on a folder in its publisher's layout (two files for AIME 2025 and LiveCodeBench,
    gzip for HumanEval, an indented JSON array for sanitized MBPP and Alpaca)."""
    count, first = EXPECTED[name]
    questions = load_dataset_entry(f"{name}={os.path.join(FIXTURES, name)}")
    assert len(questions) == count and all(isinstance(q, str) and q.strip() for q in questions)
    if first is not None:
        assert questions[0] == first
    assert load_dataset_entry(f"{name}={os.path.join(FIXTURES, name)}", limit=1) == questions[:1]


def test_the_readers_ask_as_their_benchmarks_do():
    lcb = load_published("livecodebench", os.path.join(FIXTURES, "livecodebench"))
    assert "Given two integers A and B" in lcb[0] and "Read the inputs from stdin" in lcb[0]  # no starter code
    assert "class Solution:" in lcb[1] and "starter code" in lcb[1]
    alpaca = load_published("alpaca", os.path.join(FIXTURES, "alpaca"))
    assert alpaca[1] == "Translate the sentence into French.\n\nThe cat sleeps."
    mbpp = load_published("mbpp", os.path.join(FIXTURES, "mbpp_full", "mbpp.jsonl"))
    assert mbpp == ["Write a function to reverse a string."]
    assert dataset_label("math500=/data/MATH-500/test.jsonl") == "math500" and dataset_label("gsm8k") == "gsm8k"


@pytest.mark.parametrize("name,record,line", [
    ("gsm8k", {"problem": "x?", "answer": "1"}, 2),  # MATH's field name in a GSM8K file
    ("math500", {"problem": "x?", "answer": 7, "unique_id": "a"}, 2),  # a number where the file has a string
    ("aime2025", {"problem": "x?"}, 2),
    ("humaneval", {"task_id": "H/9"}, 2),
    ("livecodebench", {"question_content": "x"}, 2),  # no starter_code
    ("mt_bench", {"question_id": 1, "category": "writing", "turns": "one turn"}, 2),
])
def test_a_record_outside_the_schema_names_the_file_and_line(tmp_path, name, record, line):
    path = tmp_path / "file.jsonl"
    good = next(published_records(_first_file(name)))[0]  # a record of the fixture, then the bad one
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:{line}: not a record of .*expected fields"):
        load_published(name, str(path))


def test_json_array_files_name_the_line_where_the_bad_record_starts(tmp_path):
    path = tmp_path / "alpaca_data.json"
    path.write_text('[\n  {"instruction": "a", "input": ""},\n  {"output": "no instruction"}\n]\n')
    with pytest.raises(DataError, match=rf"^{path}:3: not a record of tatsu-lab"):
        load_published("alpaca", str(path))
    path.write_text('[\n  {"instruction": "a"},\n  {"instruction": \n]')
    with pytest.raises(DataError, match=rf"^{path}:3: not JSON"):
        load_published("alpaca", str(path))


def test_missing_files_and_unknown_benchmarks_are_one_line(tmp_path):
    with pytest.raises(DataError, match=r"math500=/no/such: no such file or folder \(expected HuggingFaceH4/MATH-500"):
        load_dataset_entry("math500=/no/such")
    with pytest.raises(DataError, match=r"no test\*.jsonl files in the folder"):
        load_dataset_entry(f"livecodebench={tmp_path}")
    with pytest.raises(DataError, match=r"unknown benchmark 'mmlu'; the published readers are gsm8k, math500"):
        load_dataset_entry(f"mmlu={tmp_path}")


def _first_file(name):
    import glob
    return sorted(glob.glob(os.path.join(FIXTURES, name, "*")))[0]
