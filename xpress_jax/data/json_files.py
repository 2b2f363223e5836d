"""The one reader of JSON record files: jsonl, gzipped or not, and JSON arrays (a file whose first
character is `[`, as alpaca_data.json is). Each record comes with "path:line" (an array element's
first line), and every error names them: training data, question files and published benchmarks
all read through here."""

from __future__ import annotations

import gzip
import json
from typing import Iterator

from xpress_jax.errors import DataError


def json_records(path: str) -> Iterator[tuple[object, str]]:
    """(record, "path:line") for each record of `path`, in file order. A jsonl file is read line by
    line; an array file is read whole."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if head[:1] == b"[":
            yield from _array(path, f.read())
            return
        for number, raw in enumerate(f, start=1):
            line = _text(raw, path, number)
            if line.strip():
                yield _parse(line, path, number), f"{path}:{number}"


def _text(data: bytes, path: str, first_line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        raise DataError(f"{path}:{line}: not UTF-8 ({e.reason} at byte {e.start})") from None


def _parse(line: str, path: str, number: int):
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{number}: not JSON ({e.msg}, column {e.colno})") from None


def _array(path: str, data: bytes) -> Iterator[tuple[object, str]]:
    text = _text(data, path, 1)
    decoder, pos = json.JSONDecoder(), text.index("[") + 1
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
