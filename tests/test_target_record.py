"""The target a drafter was trained against, recorded in its export (target.json): eval and sample
take it when none is given, and refuse a checkpoint without one or a target that differs."""

import json
import os
import shutil

import pytest

from cli_helpers import invoke
from train_helpers import override_args, train_config
from xpress_jax import assets
from xpress_jax.checkpoints.target_record import RECORD, fingerprint_dir, fingerprint_random, resolve_target, \
    write_record
from xpress_jax.cli import DEFAULT_CONFIG, load_config
from xpress_jax.errors import ConfigError
from xpress_jax.models.qwen3 import Qwen3Config


def test_an_export_records_its_random_target_and_eval_rebuilds_exactly_that_one(tmp_path):
    """A run on the random tiny target exports its seed and shape; eval with the same config takes
    that random target, and a config whose random target differs (another seed) is refused."""
    from xpress_jax.train.run import train
    config = train_config(tmp_path / "run", **{"train.steps": "1", "train.async_checkpointing": "false"})
    train(config)
    export = tmp_path / "run" / "export"
    record = json.loads((export / RECORD).read_text())
    assert record["hf_dir"] is None and record["seed"] == 0 and record["fingerprint"] == fingerprint_random(config)
    common = [*override_args(tmp_path / "unused"), f"--checkpoint={export}", "--decoders=dflash", "--num_prompts=1",
              "--max_new_tokens=3", "--config.eval.time_split=false"]
    r = invoke("xpress_jax.eval", *common, f"--out={tmp_path / 'eval'}")
    assert r.returncode == 0 and "the random target" in r.stderr and "seed 0" in r.stderr, r.stderr[-2000:]
    r = invoke("xpress_jax.eval", *common, "--config.seed=7", f"--out={tmp_path / 'eval7'}")
    assert r.returncode == 2 and "trained against a random target (seed 0" in r.stderr and "--config.seed=0" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "eval7").exists()


@pytest.fixture
def pair(tmp_path):
    """A copy of the shipped tiny target and of its drafter (whose record points at ../target)."""
    shutil.copytree(assets.TINY_TARGET, tmp_path / "target")
    shutil.copytree(assets.TINY_DFLASH, tmp_path / "dflash")
    return tmp_path / "target", tmp_path / "dflash"


def test_the_fingerprint_follows_the_weights_and_tokenizer_not_the_path(pair, tmp_path):
    target, _ = pair
    assert fingerprint_dir(str(target)) == fingerprint_dir(assets.TINY_TARGET)
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header + 10] ^= 1  # one bit of the first tensor
    weights.write_bytes(bytes(data))
    assert fingerprint_dir(str(target)) != fingerprint_dir(assets.TINY_TARGET)
    shutil.copytree(assets.TINY_TARGET, tmp_path / "other")
    (tmp_path / "other" / "tokenizer_config.json").write_text(
        (tmp_path / "other" / "tokenizer_config.json").read_text().replace("<|im_end|>", "<|im_stop|>", 1))
    assert fingerprint_dir(str(tmp_path / "other")) != fingerprint_dir(assets.TINY_TARGET)


def test_a_recorded_target_is_found_beside_the_drafter_or_at_its_path_and_named_when_gone(pair, tmp_path, capsys):
    target, drafter = pair
    config = load_config(DEFAULT_CONFIG)
    resolve_target(config, [str(drafter)])  # the shipped record: ../target, beside the drafter
    assert config.target.hf_dir == str(target) and "recorded in" in capsys.readouterr().err

    moved = tmp_path / "elsewhere" / "dflash"
    shutil.copytree(drafter, moved)  # the drafter alone moves: the absolute path still finds the target
    os.remove(moved / RECORD)
    recording = load_config(DEFAULT_CONFIG)
    recording.target.hf_dir = str(target)
    write_record(recording, Qwen3Config.from_dir(str(target)), str(moved))
    config = load_config(DEFAULT_CONFIG)
    resolve_target(config, [str(moved)])
    assert config.target.hf_dir == str(target)

    shutil.rmtree(target)
    with pytest.raises(ConfigError, match=r"was trained against .* which is not there; give it with "
                                          r"--config.target.hf_dir=DIR"):
        resolve_target(load_config(DEFAULT_CONFIG), [str(moved)])


def test_a_target_that_differs_from_the_record_is_refused_unless_accepted(pair, tmp_path, capsys):
    target, drafter = pair
    other = tmp_path / "other"
    shutil.copytree(target, other)
    (other / "config.json").write_text(json.dumps({**json.loads((other / "config.json").read_text()),
                                                   "rope_theta": 12345.0}))
    config = load_config(DEFAULT_CONFIG)
    config.target.hf_dir = str(other)
    with pytest.raises(ConfigError, match=r"is not the target .* was trained against .*accept_other=true"):
        resolve_target(config, [str(drafter)])
    config.target.accept_other = True
    resolve_target(config, [str(drafter)])
    assert "warning:" in capsys.readouterr().err and config.target.hf_dir == str(other)
    config = load_config(DEFAULT_CONFIG)
    config.target.hf_dir = str(target)  # the same target, copied: accepted
    resolve_target(config, [str(drafter)])


def test_a_checkpoint_without_a_record_needs_its_target_named(pair, tmp_path):
    _, drafter = pair
    os.remove(drafter / RECORD)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "What is 7 * 6?"}) + "\n")
    for command, args in (("xpress_jax.eval", [f"--datasets={questions}", f"--out={tmp_path / 'e'}"]),
                          ("xpress_jax.sample", [])):
        r = invoke(command, f"--checkpoint={drafter}", *args)
        assert r.returncode == 2 and "records no target" in r.stderr and "--config.target.hf_dir=DIR" in r.stderr
        assert "Traceback" not in r.stderr and r.stderr.splitlines()[0].startswith("error:"), r.stderr
