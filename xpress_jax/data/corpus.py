"""The tiny target's training corpus: GSM8K question -> answer chats, plus Python code completion
(functions of the installed standard library: signature + docstring -> body), both rendered as
the project's chat records (`{"id", "conversations"}`).

The code prompts follow the HumanEval format of spec_bench80 ("Complete the code I provided.",
then the signature and docstring), so a target trained on them answers HumanEval-style prompts
with code. Held-out records (a stable hash of the id) give the validation set; the evaluation
questions (GSM8K test, HumanEval, MT-Bench, Alpaca) are never part of either.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sysconfig
import warnings

from xpress_jax import atomic
from xpress_jax.assets import data_root
from xpress_jax.errors import DataError

CODE_INSTRUCTION = "Complete the code I provided.\n\n"
# stdlib folders whose code is tests, vendored third-party code or generated tables
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "encodings", "__pycache__", "turtledemo",
              "pydoc_data", "ensurepip", "venv"}


def _chat(rid: str, question: str, answer: str) -> dict:
    return {"id": rid, "conversations": [{"role": "user", "content": question},
                                         {"role": "assistant", "content": answer}]}


def gsm8k_records(split: str = "train") -> list[dict]:
    path = os.path.join(data_root(), "gsm8k", f"{split}.jsonl")
    if not os.path.isfile(path):
        where = " (under $XPRESS_DATA)" if "XPRESS_DATA" in os.environ else ""
        raise DataError(f"GSM8K file {path!r} does not exist{where}")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [_chat(f"gsm8k-{split}-{i}", r["question"], r["answer"]) for i, r in enumerate(rows)]


def _function_example(source_lines: list[str], node: ast.FunctionDef, min_body: int, max_body: int):
    """(prompt code, body code) of a top-level function with a docstring, or None."""
    doc = ast.get_docstring(node, clean=False)
    if not doc or node.decorator_list or len(node.body) < 2:
        return None
    doc_end = node.body[0].end_lineno  # the docstring expression's last line
    body = source_lines[doc_end:node.end_lineno]
    head = source_lines[node.lineno - 1:doc_end]
    if not (min_body <= len(body) <= max_body) or any("\t" in line for line in head + body):
        return None
    return "".join(head), "".join(body).rstrip() + "\n"


def stdlib_code_records(max_functions: int = 4000, min_body: int = 3, max_body: int = 25) -> list[dict]:
    """Top-level documented functions of the installed Python standard library, in a stable order."""
    root = sysconfig.get_paths()["stdlib"]
    records = []
    if max_functions == 0:
        return records
    for folder, dirs, file_names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(file_names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # invalid escape sequences in old modules
                    tree = ast.parse(text)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            lines = text.splitlines(keepends=True)
            module = os.path.relpath(path, root)
            for node in tree.body:
                if isinstance(node, ast.FunctionDef):
                    example = _function_example(lines, node, min_body, max_body)
                    if example:
                        records.append(_chat(f"stdlib-{module}:{node.name}", CODE_INSTRUCTION + example[0],
                                             example[1]))
                        if len(records) == max_functions:  # the walk's order is stable: stop parsing here
                            return records
    return records


def is_validation(record_id: str, fraction: float) -> bool:
    """A stable split by id: the same records are held out on every machine and every run."""
    h = int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16)
    return h < fraction * 2**32


def build_corpus(*, code_functions: int, val_fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, validation) records: GSM8K train plus standard-library code."""
    records = gsm8k_records("train") + stdlib_code_records(code_functions)
    train = [r for r in records if not is_validation(r["id"], val_fraction)]
    val = [r for r in records if is_validation(r["id"], val_fraction)]
    if not train or not val:
        raise DataError(f"corpus split left train={len(train)} and validation={len(val)} records")
    return train, val


def write_jsonl(records: list[dict], path: str) -> None:
    with atomic.replacing(path) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
