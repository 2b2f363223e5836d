"""Bad input never ends in a traceback or a silent surprise: config fields are checked before
anything is built, a resume with another config is refused, a corrupt newest checkpoint falls back
to the previous one, and broken checkpoint files are named."""

import concurrent.futures
import glob
import json
import os
import shutil

import numpy as np
import portpicker
import pytest

from cli_helpers import ROOT, invoke, run
from train_helpers import override_args, train_config
from xpress_jax.cli import load_config, with_overrides
from xpress_jax.config_schema import check_config, leaves, rule_of
from xpress_jax.errors import CheckpointError, ConfigError


def tiny(**overrides):
    return with_overrides(os.path.join(ROOT, "configs", "tiny.py"), **overrides)


def test_every_field_of_every_shipped_config_has_a_rule_and_passes():
    for path in glob.glob(os.path.join(ROOT, "configs", "*.py")):
        config = load_config(path)
        assert all(rule_of(k) for k in leaves(config)), path
        check_config(config)


@pytest.mark.parametrize("key, value, message", [
    ("train.batch_size", "0", "train.batch_size=0: expected an integer >= 1"),
    ("train.num_anchors", "0", "train.num_anchors=0"),
    ("train.save_every", "0", "train.save_every=0"),
    ("train.steps", "-5", "train.steps=-5: expected an integer >= 0"),
    ("mesh.shape", "4", "mesh.shape=(4,): expected a tuple of 3 sizes"),
    ("mesh.shape", "(0, 1, 1)", "mesh.shape=(0, 1, 1)"),
    ("mesh.shape", "(-1, -1, 1)", "at most once"),
    ("dtype", "float64", "dtype='float64': expected one of float32, bfloat16, float16"),
    ("target.arch.num_key_value_heads", "3", "not a multiple of target.arch.num_key_value_heads=3"),
    ("train.heads", "('xpress', 'medusa')", "train.heads"),
    ("eval.num_prompts", "-1", "eval.num_prompts=-1"),
    ("eval.temperature", "-1.0", "eval.temperature=-1.0"),
    ("sample.prompt", "", "sample.prompt='': expected a non-empty string"),
    ("train.loss.dloop_beta", "1.0", "train.loss.dloop_beta=1.0"),
])
def test_bad_fields_are_named_with_what_is_allowed(key, value, message):
    with pytest.raises(ConfigError) as e:
        check_config(tiny(**{key: value}))
    assert message in str(e.value)


def test_the_cli_refuses_before_building_or_writing_anything(tmp_path):
    out = tmp_path / "run"
    for args, message in (
            (["--config.train.batch_size=0"], "train.batch_size=0"),
            (["--config.mesh.shape=(16,1,1)"], "needs 16 devices, have 8"),
            (["--config.train.num_anchors=0"], "train.num_anchors=0")):
        r = invoke("xpress_jax.train", f"--config.train.out_dir={out}", *args)
        assert r.returncode == 2, r.stderr[-2000:]
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert lines[0].startswith("error: ") and message in lines[0] and "Traceback" not in r.stderr
        assert not out.exists()
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config(:\n")
    r = invoke("xpress_jax.train", f"--config={broken}")
    assert r.returncode == 2 and f"config file {broken}, line 1" in r.stderr and "Traceback" not in r.stderr
    r = invoke("xpress_jax.eval", "--num_prompts=-1", f"--out={tmp_path / 'eval'}")
    assert r.returncode == 2 and "eval.num_prompts=-1" in r.stderr and not (tmp_path / "eval").exists()


def test_resuming_with_another_config_is_refused_and_the_record_kept(tmp_path):
    from xpress_jax.train.run import train
    train(train_config(tmp_path, **{"train.steps": "4", "train.save_every": "2"}), stop_after=2)
    record = (tmp_path / "config.json").read_text()
    for key, value in (("train.batch_size", "4"), ("train.lr", "0.001"), ("seed", "3"), ("data.max_len", "128")):
        with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}: .* -> .*allow_config_change"):
            train(train_config(tmp_path, **{"train.steps": "4", "train.save_every": "2", key: value}))
        assert (tmp_path / "config.json").read_text() == record
    # the same config resumes; logging and saving cadence may change
    train(train_config(tmp_path, **{"train.steps": "4", "train.save_every": "2", "train.log_every": "2"}))
    assert (tmp_path / "config.json").read_text() == record
    # a deliberate change is accepted and recorded beside the original
    r = invoke("xpress_jax.train", *override_args(tmp_path, **{"train.steps": "4", "train.log_every": "2",
                                                               "train.b2": "0.9", "train.allow_config_change": "true"}))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "config.json").read_text() == record
    assert json.loads((tmp_path / "config.resumed_at_4.json").read_text())["train"]["b2"] == 0.9


def test_a_start_that_fails_leaves_no_run_directory(tmp_path):
    """A missing train.init_from is named as missing; one that is not a drafter fails after the
    checkpoint manager made its folder: either way the new out_dir is gone."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for init_from, message in ((tmp_path / "missing", "train.init_from: directory"), (empty, "no config.json")):
        out = tmp_path / "run"
        r = invoke("xpress_jax.train", *override_args(out, **{"train.init_from": str(init_from)}))
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()


def test_a_longer_run_continues_its_schedule_and_never_restarts_it(tmp_path):
    """A run of 12 steps stopped at 6, then given 20: refused without train.continue_schedule
    (allow_config_change does not restart the schedule either); with it, the learning rate at step
    7 is the old schedule's at its 6th update, and it falls by the recorded cosine to the end value
    at step 20; a later resume (no flag needed) rebuilds the same schedule."""
    from xpress_jax.train import schedule
    from xpress_jax.train.run import train
    from xpress_jax.train.state import make_schedule
    common = {"train.save_every": "3", "train.final_lr_fraction": "0.1", "train.async_checkpointing": "false"}
    config = train_config(tmp_path, **common, **{"train.steps": "12"})
    train(config, stop_after=6)
    for extra in ({}, {"train.allow_config_change": "true"}):
        with pytest.raises(ConfigError, match=r"schedule ends at step 12, and this config runs 20 steps; "
                                              r"--config.train.continue_schedule=true"):
            train(train_config(tmp_path, **common, **{"train.steps": "20"}, **extra))
    longer = train_config(tmp_path, **common, **{"train.steps": "20", "train.continue_schedule": "true"})
    train(longer, stop_after=9)  # to step 15
    old = make_schedule(config.train, 12)
    # log.jsonl's lr has three significant digits
    lr = {row["step"]: row["lr"] for row in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())}
    assert lr[7] == pytest.approx(float(old(6)), rel=2e-3) and lr[6] == pytest.approx(float(old(5)), rel=2e-3)
    segments = schedule.read(str(tmp_path))
    assert segments[-1] == {"from_step": 6, "to_step": 20, "kind": "cosine_from",
                            "from_lr": pytest.approx(float(old(6)))}
    new = schedule.build(longer.train, segments)
    for step in range(7, 16):
        assert lr[step] == pytest.approx(float(new(step - 1)), rel=2e-3), step
    assert lr[8] < lr[7]  # falling, never back up to the warmup's peak
    train(train_config(tmp_path, **common, **{"train.steps": "20"}))  # resumes at 15 without the flag
    lr = {row["step"]: row["lr"] for row in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())}
    assert lr[20] == pytest.approx(float(new(19)), rel=2e-3)
    assert float(new(20)) == pytest.approx(0.1 * longer.train.lr, rel=1e-6)


def _corrupt(step_dir):
    """Truncates every array file of a saved step to half its size."""
    files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "*"), recursive=True)
             if os.path.isfile(f) and os.path.getsize(f) > 64]
    assert files
    for f in files:
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)


def test_a_corrupt_newest_checkpoint_falls_back_and_resumes_exactly(tmp_path, capsys):
    from xpress_jax.train.run import train
    settings = {"train.steps": "6", "train.save_every": "2", "train.async_checkpointing": "false"}
    straight = train(train_config(tmp_path / "straight", **settings))
    run_dir = tmp_path / "broken"
    train(train_config(run_dir, **settings), stop_after=4)
    _corrupt(run_dir / "checkpoints" / "4")
    shutil.copytree(run_dir / "checkpoints" / "2", run_dir / "checkpoints" / "8.orbax-checkpoint-tmp-99")
    resumed = train(train_config(run_dir, **settings))
    err = capsys.readouterr().err
    assert "checkpoint step 4" in err and "does not restore" in err and "resumed at step 2" in err
    assert (tmp_path / "broken" / "checkpoints.corrupt" / "4").is_dir()  # kept for inspection
    assert not list((run_dir / "checkpoints").glob("*.orbax-checkpoint-tmp*"))
    for k, v in straight["state"]["params"].items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(resumed["state"]["params"][k]), err_msg=k)


def test_broken_checkpoint_files_are_named(tmp_path):
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=rf"{bad / 'config.json'}: not valid JSON"):
        load_drafter(str(bad))
    (bad / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
                                                 "hidden_size": 8, "rope_theta": 1e4}))
    with pytest.raises(CheckpointError, match=r"config.json: missing fields \['vocab_size'"):
        load_drafter(str(bad))
    (bad / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object, found list"):
        load_drafter(str(bad))
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{")
    r = invoke("xpress_jax.sample", f"--config.target.hf_dir={target}")
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr


def test_data_errors_name_the_file_and_line(tmp_path):
    from xpress_jax.data.byte_tokenizer import ByteTokenizer
    from xpress_jax.data.dataset import make_dataset, read_records
    from xpress_jax.errors import DataError
    good = json.dumps({"question": "q", "answer": "a"})
    cases = [
        (good.encode() + b"\n\xff\xfe bad bytes\n", r":2: not UTF-8"),
        (f"{good}\n[1, 2]\n".encode(), r":2: a record must be a JSON object, found list"),
        (f"{good}\n\"text\"\n".encode(), r":2: a record must be a JSON object, found str"),
        (f"{good}\n\n{{broken\n".encode(), r":3: not JSON"),
        ((f"{good}\n" * 500 + json.dumps({"conversations": [{"role": "bot", "content": "x"}]}) + "\n").encode(),
         r":501: record '\?', turn 0: needs a role"),
        (f"{good}\n".encode() + json.dumps({"conversations": ["hello"]}).encode() + b"\n", r":2: .*found str"),
    ]
    for i, (content, message) in enumerate(cases):
        path = tmp_path / f"d{i}.jsonl"
        path.write_bytes(content)
        with pytest.raises(DataError, match=rf"{path}{message}"):
            read_records([str(path)])
    long_question = tmp_path / "long.jsonl"
    long_question.write_text(json.dumps({"question": "x" * 300, "answer": "y"}) + "\n")
    with pytest.raises(DataError, match="assistant turn starts past it"):
        make_dataset(read_records([str(long_question)]), ByteTokenizer(300), max_len=64, batch_size=1, seed=0)


def test_a_process_that_never_arrives_is_named(tmp_path):
    def alone(process_id):  # each on its own port, so the two never meet; both wait out the timeout at once
        env = {"XPRESS_COORDINATOR": f"localhost:{portpicker.pick_unused_port()}", "XPRESS_NUM_PROCESSES": "2",
               "XPRESS_INIT_TIMEOUT": "3", "XPRESS_PROCESS_ID": str(process_id)}
        return run("xpress_jax.train", f"--config.train.out_dir={tmp_path / str(process_id)}", env_extra=env)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        coordinator, worker = pool.map(alone, (0, 1))
    assert coordinator.returncode == 2 and "processes [1] did not check in" in coordinator.stderr
    assert worker.returncode == 2 and "process 0 did not answer" in worker.stderr
    assert "Traceback" not in coordinator.stderr + worker.stderr


def test_a_failed_save_names_its_step_and_the_last_good_one(tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    from xpress_jax.train.run import train
    real_save = ocp.CheckpointManager.save

    def disk_full_at_4(self, step, *args, **kwargs):
        if step == 4:
            raise OSError(28, "No space left on device")
        return real_save(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", disk_full_at_4)
    with pytest.raises(CheckpointError, match=r"saving step 4 .* No space left on device.*last good checkpoint is "
                                              r"step 2"):
        train(train_config(tmp_path, **{"train.steps": "6", "train.save_every": "2"}))


def test_bad_data_or_checkpoints_leave_no_run_directory(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n[1, 2]\n")
    out = tmp_path / "run"
    r = invoke("xpress_jax.train", f"--config.train.out_dir={out}", f"--config.data.train_files=('{bad}',)",
               "--config.train.batch_size=8")  # this process's 8 devices would not split the tiny batch of 4
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and f"{bad}:2: a record must be a JSON object" in lines[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not out.exists()
    r = invoke("xpress_jax.train", f"--config.train.out_dir={out}", "--config.mesh.shape=(1,8,1)")
    assert r.returncode == 2 and "train.batch_size=4 does not split over fsdp=8" in r.stderr and not out.exists()
    r = invoke("xpress_jax.eval", f"--checkpoints=dflash={tmp_path}", f"--out={tmp_path / 'eval' / 'x'}")
    assert r.returncode == 2 and "no config.json" in r.stderr and not (tmp_path / "eval").exists()


def test_the_command_line_overrides_are_read_from_that_command_lines_flags():
    """Each command line's own `--config.a.b` keys, from its parsed flags; nothing is kept between
    command lines (a second parse in one process sees only its own)."""
    from absl import flags
    from xpress_jax import cli
    seen = []
    for argv in (["x", "--config.heads.rank=8", "--config.eval.num_prompts=3"], ["x", "--config.seed=2"], ["x"]):
        flag_values = flags.FlagValues()
        cli.define_config_flag(flag_values, argv)
        flag_values(argv)
        seen.append(cli.config_overrides(flag_values))
    assert seen == [{"heads.rank", "eval.num_prompts"}, {"seed"}, frozenset()]


def test_a_target_directory_without_its_tokenizer_is_refused_naming_what_is_missing(tmp_path, tiny_dirs):
    """A real target decoded through bytes would train and evaluate on the wrong tokens: eval,
    train and the drafter's mask token refuse the directory in one line, before any weight is read."""
    import shutil
    target = tmp_path / "target"
    shutil.copytree(tiny_dirs["tied_gqa1"], target)
    r = invoke("xpress_jax.eval", f"--config.target.hf_dir={target}", f"--out={tmp_path / 'e'}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{target}: no tokenizer (tokenizer_config.json and tokenizer.json missing)" in r.stderr
    (target / "tokenizer_config.json").write_text("{}")
    r = invoke("xpress_jax.train", *override_args(tmp_path / "t"), f"--config.target.hf_dir={target}",
               "--config.drafter.mask_token_id=-1")
    assert r.returncode == 2 and "no tokenizer (tokenizer.json missing)" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "t").exists()
