"""The one reader of JSON record files (data/json_files.py): jsonl, gzipped jsonl and JSON arrays
give the same records with their lines, and every error names the file and line."""

import gzip
import json

import pytest

from xpress_jax.data.json_files import json_records
from xpress_jax.errors import DataError

RECORDS = [{"question": "q1"}, {"question": "q2", "answer": "a\nb"}, {"question": "q3"}]


def test_jsonl_gzip_and_arrays_give_the_same_records_and_their_lines(tmp_path):
    lines = "\n".join(json.dumps(r) for r in RECORDS[:2]) + "\n\n" + json.dumps(RECORDS[2]) + "\n"
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write(lines)
    (tmp_path / "a.json").write_text("  [\n" + ",\n".join(json.dumps(r, indent=1) for r in RECORDS) + "\n]\n")
    for name, at in (("a.jsonl", [1, 2, 4]), ("a.jsonl.gz", [1, 2, 4]), ("a.json", [2, 5, 9])):
        got = list(json_records(str(tmp_path / name)))
        assert [r for r, _ in got] == RECORDS, name
        assert [where for _, where in got] == [f"{tmp_path / name}:{n}" for n in at], name


@pytest.mark.parametrize("name, data, message", [
    ("b.jsonl", b'{"question": "q"}\n{"question": \n', ":2: not JSON"),
    ("b.jsonl", b'{"question": "q"}\n\n{"question": "\xff"}\n', ":3: not UTF-8"),
    ("b.json", b'[\n{"question": "q"},\n{"question": "\xff"}\n]', ":3: not UTF-8"),
    ("b.json", b'[\n{"question": "q"},\n{"question": \n]', ":3: not JSON"),
])
def test_bad_bytes_and_bad_json_name_the_file_and_line(tmp_path, name, data, message):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=f"^{tmp_path / name}{message}"):
        list(json_records(str(tmp_path / name)))
