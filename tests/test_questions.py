"""Evaluation questions: the shipped sets, any jsonl, and the papers' eight benchmarks read from
their publishers' folder layouts (fixtures in tests/data/benchmarks) and asked as the DFlash
harness asks them."""

import json
import os

import numpy as np
import pytest

from xpress_jax.data.benchmarks import PUBLISHED, load_benchmark, selection
from xpress_jax.data.json_files import json_records
from xpress_jax.data.chat import prompt_text
from xpress_jax.data.questions import BENCHMARKS, dataset_label, load_dataset_entry, load_questions
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


HEADER, THINK_OFF = "<|im_start|>assistant\n", "<think>\n\n</think>\n\n"
BOX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def user(text):
    return f"<|im_start|>user\n{text}<|im_end|>\n"


# each benchmark's first question of its fixture, rendered through the chat template with thinking
# off, byte for byte as the DFlash harness (z-lab/dflash 5034c8b, model/utils.py) builds it
RENDERED = {
    "gsm8k": user("A baker fills 4 trays with 6 rolls each. How many rolls are there?" + BOX),
    "math500": user("What is $2^5 - 5^2$?" + BOX),
    "aime2025": user("Find the number of ordered pairs $(a,b)$ of positive integers with $a+b=20$." + BOX),
    "humaneval": user("Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
                      "def add(a: int, b: int) -> int:\n    \"\"\"Return the sum of a and b.\"\"\"\n\n```"),
    "mbpp": user("Write a python function to remove first and last occurrence of a given character from the "
                 "string."),
    "livecodebench": user(
        "You are an expert Python programmer. You will be given a question (problem specification) and will generate "
        "a correct Python program that matches the specification and passes all tests. You will NOT return anything "
        "except for the program\n\n### Question:\nGiven two integers A and B, print A+B.\n\n### Format: Write your "
        "code in the following format:\n```python\n# YOUR CODE HERE\n```\n\n### Answer: (use the provided format "
        "with backticks)"),
    "mt_bench": user("Write a short note inviting a neighbour to a picnic."),
    "alpaca": user("Give three tips for staying healthy."),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_each_benchmark_renders_as_the_harness_asks(name):
    """The publisher's folder resolves to its test split, and its first record renders exactly."""
    qs = load_benchmark(name, os.path.join(FIXTURES, name))
    first = qs.questions[0]
    assert prompt_text([{"role": "user", "content": first.turns[0]}], earlier_think_blocks=False) == \
        RENDERED[name] + HEADER + THINK_OFF
    assert first.source.startswith(os.path.join(FIXTURES, name))
    assert qs.protocol["count"] == len(qs.questions) == qs.protocol["split_size"]  # fixtures are below the counts
    assert qs.protocol["asked"] == PUBLISHED[name].count


def test_the_second_forms_of_livecodebench_and_alpaca():
    lcb = load_benchmark("livecodebench", os.path.join(FIXTURES, "livecodebench")).questions
    assert lcb[1].turns[0].endswith(
        "### Question:\nReturn the number of vowels in s.\n\n### Format: Use the following code structure:\n```python\n"
        "class Solution:\n    def countVowels(self, s: str) -> int:\n        \n```\n\n### Answer: (use the provided "
        "format with backticks)")
    assert [q.source.split(os.sep)[-1] for q in lcb] == [
        "test.jsonl:1 (question_id abc000_a)", "test2.jsonl:1 (question_id 9001)"] + \
        [f"test{i}.jsonl:1 (question_id abc10{i}_a)" for i in range(3, 7)]  # the release files in order
    alpaca = load_benchmark("alpaca", os.path.join(FIXTURES, "alpaca")).questions
    assert alpaca[1].turns == ("Translate the sentence into French.\n\nInput:\nThe cat sleeps.",)


def test_mt_bench_asks_both_turns_the_second_after_the_first_answer():
    q = load_benchmark("mt_bench", os.path.join(FIXTURES, "mt_bench")).questions[0]
    assert q.turns == ("Write a short note inviting a neighbour to a picnic.", "Rewrite it as a limerick.")
    messages = [{"role": "user", "content": q.turns[0]}, {"role": "assistant", "content": "Dear neighbour, ..."},
                {"role": "user", "content": q.turns[1]}]
    # Qwen3's template writes an earlier assistant turn without the think block
    assert prompt_text(messages, earlier_think_blocks=False) == (
        RENDERED["mt_bench"] + HEADER + "Dear neighbour, ...<|im_end|>\n" + user("Rewrite it as a limerick.") +
        HEADER + THINK_OFF)


def test_publisher_folders_read_the_test_split():
    gsm8k = load_benchmark("gsm8k", os.path.join(FIXTURES, "gsm8k"))  # train.jsonl and the examples beside it
    assert gsm8k.protocol["files"] == [os.path.join(FIXTURES, "gsm8k", "test.jsonl")] and len(gsm8k.questions) == 2
    mbpp = load_benchmark("mbpp", os.path.join(FIXTURES, "mbpp"))  # sanitized, task ids 11-510 only
    assert [q.source.rsplit(" ", 1)[-1] for q in mbpp.questions] == ["11)", "12)", "510)"]
    with pytest.raises(DataError, match=r"^mbpp=.*mbpp_full: no test split: google-research/mbpp's test split is "
                                        r"sanitized-mbpp.json \(missing sanitized-mbpp.json\); the folder holds "
                                        r"mbpp.jsonl; name the file"):
        load_benchmark("mbpp", os.path.join(FIXTURES, "mbpp_full"))


def test_the_harness_selection():
    """A count below the split's size takes datasets' shuffle(seed=0): numpy's default_rng(0)
    permutation, whose first indices for GSM8K's 1,319 test questions were read from datasets 5.2.0
    (Dataset.shuffle(seed=0).select(range(128))); a larger count takes the split whole, in order."""
    chosen, how = selection(1319, 128)
    assert chosen[:5].tolist() == [264, 725, 996, 586, 1010] and len(set(chosen.tolist())) == 128
    assert "seeded shuffle" in how
    assert selection(500, 128)[0][:5].tolist() == [221, 434, 109, 334, 375]
    assert selection(164, 164)[0].tolist() == list(range(164)) and selection(30, 0)[0].tolist() == list(range(30))


def test_a_count_below_the_split_shuffles_and_above_takes_it_whole(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}?", "answer": f"#\n#### {i}"}) + "\n" for i in range(10)))
    some = load_benchmark("gsm8k", str(path), count=4)
    order = np.random.default_rng(0).permutation(10)[:4]
    assert [q.turns[0].split("?")[0] for q in some.questions] == [f"q{i}" for i in order]
    assert [q.source for q in some.questions] == [f"{path}:{i + 1}" for i in order]
    whole = load_benchmark("gsm8k", str(path), count=50)
    assert len(whole.questions) == 10 and whole.protocol["asked"] == 50 and whole.protocol["count"] == 10


def test_a_bare_path_is_read_by_the_one_schema_it_matches(tmp_path):
    said = []
    math = load_dataset_entry(os.path.join(FIXTURES, "math500", "test.jsonl"), announce=said.append)
    assert math.questions[0].turns[0].endswith(BOX) and "read as math500" in said[0]
    assert load_dataset_entry(os.path.join(FIXTURES, "gsm8k", "test.jsonl"), announce=said.append).protocol[
        "benchmark"] == "gsm8k"
    plain = tmp_path / "mine.jsonl"
    plain.write_text(json.dumps({"question": "Why?", "answer": "Because."}) + "\n")
    assert load_dataset_entry(str(plain)).questions[0].turns == ("Why?",)  # no schema: a question file
    aime = tmp_path / "aime.jsonl"  # a question with an integer answer and no GSM8K solution: AIME's schema
    aime.write_text(json.dumps({"question": "x?", "answer": "12"}) + "\n")
    assert load_dataset_entry(str(aime), announce=said.append).protocol["benchmark"] == "aime2025"


def test_a_bare_path_two_schemas_match_is_refused(tmp_path, monkeypatch):
    from xpress_jax.data import benchmarks
    twin = benchmarks.Benchmark("math", "twin", ("t.jsonl",), {"problem": str, "answer": str, "unique_id": str},
                                lambda r: [r["problem"]], 5)
    monkeypatch.setitem(benchmarks.PUBLISHED, "twin", twin)
    with pytest.raises(DataError, match=r"test.jsonl: its records match the schemas of math500 and twin; name the "
                                        r"benchmark \(math500=.*test.jsonl\)$"):
        load_dataset_entry(os.path.join(FIXTURES, "math500", "test.jsonl"))


def test_dataset_labels():
    assert dataset_label("math500=/data/MATH-500/test.jsonl") == "math500" and dataset_label("gsm8k") == "gsm8k"


@pytest.mark.parametrize("name,record,line", [
    ("gsm8k", {"problem": "x?", "answer": "1"}, 2),  # MATH's field name in a GSM8K file
    ("math500", {"problem": "x?", "answer": 7, "unique_id": "a"}, 2),  # a number where the file has a string
    ("aime2025", {"problem": "x?"}, 2),
    ("humaneval", {"task_id": "H/9"}, 2),
    ("livecodebench", {"question_content": "x"}, 2),  # no starter_code
    ("mt_bench", {"question_id": 1, "category": "writing", "turns": "one turn"}, 2),
    ("mbpp", {"text": "Write a function.", "task_id": 11, "test_list": []}, 2),  # the full set's wording
])
def test_a_record_outside_the_schema_names_the_file_and_line(tmp_path, name, record, line):
    path = tmp_path / "file.jsonl"
    good = next(json_records(os.path.join(FIXTURES, name, PUBLISHED[name].test_split[0])))[0]
    path.write_text(json.dumps(good) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:{line}: not a record of .*expected fields"):
        load_benchmark(name, str(path))


def test_json_array_files_name_the_line_where_the_bad_record_starts(tmp_path):
    path = tmp_path / "alpaca_data.json"
    path.write_text('[\n  {"instruction": "a", "input": ""},\n  {"output": "no instruction"}\n]\n')
    with pytest.raises(DataError, match=rf"^{path}:3: not a record of tatsu-lab"):
        load_benchmark("alpaca", str(path))
    path.write_text('[\n  {"instruction": "a"},\n  {"instruction": \n]')
    with pytest.raises(DataError, match=rf"^{path}:3: not JSON"):
        load_benchmark("alpaca", str(path))


def test_missing_files_and_unknown_benchmarks_are_one_line(tmp_path):
    with pytest.raises(DataError, match=r"math500=/no/such: no such file or folder \(expected HuggingFaceH4/MATH-500"):
        load_dataset_entry("math500=/no/such")
    (tmp_path / "test.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match=r"no test split: .* is test.jsonl, test2.jsonl, .*test6.jsonl \(missing "
                                        r"test2.jsonl, .*\); the folder holds test.jsonl"):
        load_dataset_entry(f"livecodebench={tmp_path}")
    with pytest.raises(DataError, match=r"unknown benchmark 'mmlu'; the published readers are gsm8k, math500"):
        load_dataset_entry(f"mmlu={tmp_path}")
