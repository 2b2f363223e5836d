"""What ships with the project: the data sets and tiny checkpoints are inside the package, match
their checksums, and every default path of every shipped config stays inside the repository."""

import glob
import os

import pytest

from cli_helpers import ROOT
from xpress_jax import assets, cli
from xpress_jax.config_schema import leaves


def test_every_shipped_file_matches_its_checksum_and_none_is_unlisted():
    with open(assets.CHECKSUMS) as f:
        listed = f.read()
    assert assets.checksum_list() == listed
    assert {"tiny/target/model.safetensors", "tiny/dflash/model.safetensors", "data/gsm8k/train.jsonl",
            "data/spec_bench80/gsm8k.jsonl"} <= {line.split("  ", 1)[1] for line in listed.splitlines()}


def test_every_data_set_names_its_licence():
    readme = open(os.path.join(assets.ASSETS, "data", "README.md")).read()
    for licence in glob.glob(os.path.join(assets.ASSETS, "data", "licenses", "*.txt")):
        assert f"licenses/{os.path.basename(licence)}" in readme
    for folder in ("gsm8k", "spec_bench80"):
        assert f"`{folder}/" in readme


def _paths(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _paths(v)


@pytest.mark.parametrize("config_file", sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))),
                         ids=os.path.basename)
def test_every_default_path_of_every_config_resolves_inside_the_repository(config_file, monkeypatch):
    monkeypatch.delenv("XPRESS_DATA", raising=False)
    config = cli.with_overrides(config_file)
    root = os.path.realpath(ROOT)
    checked = 0
    for key, value in leaves(config).items():
        for path in _paths(value):
            if os.sep not in path:
                continue  # names (datasets, dtypes, stage names), not paths
            resolved = os.path.realpath(os.path.join(root, path))  # relative paths are the run's, under its cwd
            assert os.path.commonpath([resolved, root]) == root, (key, path)
            if key in ("data.train_files", "target.hf_dir", "data.tokenizer_dir") or key.endswith("_from"):
                assert os.path.exists(resolved), (key, path)
                checked += 1
    if os.path.basename(config_file) in ("tiny.py", "tiny_heads.py"):
        assert checked  # the configs that read shipped files do name them


def test_the_data_root_follows_xpress_data(monkeypatch, tmp_path):
    from xpress_jax.data.questions import load_questions
    from xpress_jax.errors import DataError
    assert load_questions("alpaca", 2)  # shipped
    monkeypatch.setenv("XPRESS_DATA", str(tmp_path))
    with pytest.raises(DataError, match=str(tmp_path)):
        load_questions("alpaca", 2)
    (tmp_path / "spec_bench80").mkdir()
    (tmp_path / "spec_bench80" / "alpaca.jsonl").write_text('{"turns": ["Why is the sky blue?"]}\n')
    assert load_questions("alpaca") == ["Why is the sky blue?"]


@pytest.mark.parametrize("line, message", [
    ('[1, 2]', "expected a JSON object, got list"),
    ('"text"', "expected a JSON object, got str"),
    ('{"turns": [5]}', "'turns' must be a non-empty list of strings"),
    ('{"turns": "hi"}', "'turns' must be a non-empty list of strings"),
    ('{"question": 3}', "'question' must be a string, got int"),
    ('{"messages": 5}', "'conversations' / 'messages' must be a list of objects"),
    ('{"conversations": ["x"]}', "'conversations' / 'messages' must be a list of objects"),
    ('{"conversations": [{"role": "user"}]}', "the first user turn has no string 'content' / 'value'"),
    ('{"id": 1}', "no question found"),
    ('{"turns": ["fine"]', "not JSON"),
])
def test_every_malformed_question_record_is_refused_with_its_file_and_line(tmp_path, line, message):
    from xpress_jax.data.questions import load_questions
    from xpress_jax.errors import DataError
    path = tmp_path / "q.jsonl"
    path.write_text('{"turns": ["a good first line"]}\n' + line + "\n")
    with pytest.raises(DataError, match=f"{path}:2: " + __import__("re").escape(message)):
        load_questions(str(path))


def test_every_module_parses_as_the_oldest_python_the_package_claims():
    """pyproject's requires-python is the oldest Python this code is written for (only 3.11 exists
    here, so the claim is checked by parsing every module with that grammar)."""
    import ast
    import re
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        major, minor = map(int, re.search(r'requires-python = ">=(\d+)\.(\d+)"', f.read()).groups())
    files = [p for d in ("xpress_jax", "configs", "tests") for p in glob.glob(os.path.join(ROOT, d, "**", "*.py"),
                                                                            recursive=True)]
    assert len(files) > 50
    for path in files:
        with open(path) as f:
            ast.parse(f.read(), filename=path, feature_version=(major, minor))
