"""atomic.py: a write either lands whole or leaves the old file untouched."""

import json
import os

import pytest

from xpress_jax import atomic


def test_write_json_round_trips_and_leaves_no_temporary(tmp_path):
    path = str(tmp_path / "r.json")
    atomic.write_json(path, {"tau": [1.5, 2.0]})
    assert json.load(open(path)) == {"tau": [1.5, 2.0]}
    assert os.listdir(tmp_path) == ["r.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = str(tmp_path / "DONE.json")
    atomic.write_text(path, "old")
    with pytest.raises(TypeError):
        atomic.write_json(path, {"not serialisable": object()})  # json.dump fails half way through
    assert open(path).read() == "old"
    assert os.listdir(tmp_path) == ["DONE.json"]


def test_binary_mode_replaces_the_file(tmp_path):
    path = str(tmp_path / "w.safetensors")
    atomic.write_text(path, "old")
    with atomic.replacing(path, "wb") as f:
        f.write(b"\x00\x01")
        assert open(path).read() == "old"  # not visible until the block ends
    assert open(path, "rb").read() == b"\x00\x01"
