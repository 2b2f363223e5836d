"""The launch scripts: --dry_run prints each worker's / task's exact command (coordinator,
process ids, environment); the local script really trains with two processes, and resumes
exactly after SIGKILL."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from cli_helpers import start_processes
from train_helpers import checkpoint_steps, final_params, override_args, train_config, wait_for_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(script, *args, env_extra=None, timeout=60):
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XPRESS_TEST_XLA_FLAGS", ""),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           **(env_extra or {})}
    return subprocess.run(["bash", os.path.join(ROOT, "launch", script), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def test_local_dry_run_prints_one_command_per_process():
    r = launch("local_multiprocess.sh", "--dry_run", "3", "--config.train.steps=7", env_extra={"XPRESS_PORT": "23456"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        assert line.startswith(f"[process {i}] XPRESS_COORDINATOR=localhost:23456 XPRESS_NUM_PROCESSES=3 "
                               f"XPRESS_PROCESS_ID={i} JAX_PLATFORMS=cpu")
        assert line.endswith("python -m xpress_jax.train --config.train.steps=7")
    r = launch("local_multiprocess.sh", "--dry_run", "2", "eval", "--datasets=gsm8k")
    assert r.returncode == 0 and [line.endswith("python -m xpress_jax.eval --datasets=gsm8k")
                                  for line in r.stdout.strip().splitlines()] == [True, True], r.stdout


def test_slurm_dry_run_names_the_first_node_as_coordinator():
    r = launch("slurm_gpu.sbatch", "--dry_run", "/ckpt/q", "/data/d.jsonl", "/runs/r", "--config.train.steps=9",
               env_extra={"XPRESS_NODES": "gpu-a gpu-b", "XPRESS_PORT": "1234"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [line.split("]")[0] for line in lines] == ["[task 0 on gpu-a", "[task 1 on gpu-b"]
    for i, line in enumerate(lines):
        assert f"XPRESS_COORDINATOR=gpu-a:1234 XPRESS_NUM_PROCESSES=2 XPRESS_PROCESS_ID={i} " in line
        assert "--config.target.hf_dir=/ckpt/q" in line and "--config.train.out_dir=/runs/r" in line
        assert "--config.data.train_files=('/data/d.jsonl',)" in line and line.endswith("--config.train.steps=9")


def test_tpu_dry_run_prints_the_ssh_command_and_each_worker():
    r = launch("tpu_pod.sh", "--dry_run", "my-pod", "us-east5-a", "/ckpt/q", "/data/d.jsonl", "/runs/r",
               env_extra={"XPRESS_TPU_WORKERS": "2"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("gcloud compute tpus tpu-vm ssh my-pod --zone us-east5-a --worker=all --command")
    assert "--config.train.distributed=true" in lines[0]
    assert [line.split("]")[0] for line in lines[1:]] == ["[worker 0", "[worker 1"]
    assert "process_id=1 num_processes=2" in lines[2]


def test_launch_scripts_refuse_bad_arguments():
    for script, args in (("local_multiprocess.sh", ["two"]), ("slurm_gpu.sbatch", ["--dry_run", "/t"]),
                         ("tpu_pod.sh", ["--dry_run", "a", "b"])):
        r = launch(script, *args)
        assert r.returncode == 2 and "usage:" in r.stderr, (script, r.stderr)


def start_two_processes(out_dir, *args):
    return start_processes(2, "train", *override_args(out_dir), *args)


def finish(run, timeout=900) -> str:
    out, err = run.communicate(timeout=timeout)
    assert run.returncode == 0, err[-3000:]
    return out


@pytest.mark.pipeline
def test_two_processes_agree_and_resume_bitwise_after_sigkill(tmp_path):
    """Two processes with two devices each, starting from an exported drafter (train.init_from,
    placed on their shared mesh): a run SIGKILLed after a checkpoint and resumed ends with exactly
    the parameters of a run never stopped. Each process reads its own shard of the data, at its
    own position, and resumes there; tokens_per_s counts both processes' tokens."""
    from xpress_jax.data.byte_tokenizer import pad_id, tokenizer_for
    from xpress_jax.data.dataset import make_dataset, read_records
    from xpress_jax.train.run import export, host_params
    from xpress_jax.train.setup import Setup
    config = train_config(tmp_path / "unused")
    setup = Setup(config, abstract=False)
    export(setup, host_params(setup.params), str(tmp_path / "init"))
    args = ("--config.train.steps=12", "--config.train.save_every=3", f"--config.train.init_from={tmp_path / 'init'}")

    straight = start_two_processes(tmp_path / "straight", *args)
    interrupted = start_two_processes(tmp_path / "interrupted", *args)
    wait_for_checkpoint(interrupted, tmp_path / "interrupted", 3, timeout_s=900)
    os.killpg(interrupted.pid, signal.SIGKILL)  # the launcher and both processes
    interrupted.wait()
    assert max(checkpoint_steps(tmp_path / "interrupted")) < 12
    resumed = start_two_processes(tmp_path / "interrupted", *args)
    assert "resumed at step" in resumed.communicate(timeout=900)[1] and resumed.returncode == 0

    finals = [json.loads(line) for line in finish(straight).strip().splitlines() if line.startswith("{")]
    for f in finals:
        f.pop("tokens_per_s")  # each process's own clock
    assert len(finals) == 2 and finals[0] == finals[1] and finals[0]["step"] == 12
    step_a, a, positions = final_params(tmp_path / "straight", **{"train.steps": "12"})
    step_b, b, _ = final_params(tmp_path / "interrupted", **{"train.steps": "12"})
    assert step_a == step_b == 12
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert os.path.isfile(tmp_path / "straight" / "export" / "model.safetensors")
    # the two shards' positions differ (the filter drops different records), so a resume that
    # gave every process the first one's position would read other data
    assert len(positions) == 2 and positions[0] != positions[1], positions

    # the first step's tokens: both processes' halves of the global batch
    records = read_records(list(config.data.train_files))
    tokenizer = tokenizer_for(config.data.tokenizer_dir or config.target.hf_dir, setup.drafter_cfg.vocab_size)
    halves = [next(iter(make_dataset(records, tokenizer, max_len=config.data.max_len, seed=config.seed,
                                     batch_size=config.train.batch_size // 2, process_index=p, process_count=2)))
              for p in range(2)]
    with open(tmp_path / "straight" / "log.jsonl") as f:
        first = json.loads(f.readline())
    assert first["step"] == 1 and first["tokens"] == sum(int(np.sum(h["ids"] != pad_id(tokenizer))) for h in halves)


@pytest.mark.pipeline
def test_a_sigterm_to_one_of_two_processes_saves_one_step_on_both():
    """A preemption notice reaches one process of two, at a step of its own: jax.distributed's
    preemption service makes both agree on one later step, both save it (the collective Orbax
    save) and exit cleanly, and both report that step."""
    import tempfile
    import time
    out_dir = tempfile.mkdtemp(prefix="sigterm_two_")
    run = start_two_processes(out_dir, "--config.train.steps=100000", "--config.train.save_every=100000")
    deadline = time.time() + 300
    log = os.path.join(out_dir, "log.jsonl")
    while not os.path.exists(log) or os.path.getsize(log) < 2:
        assert run.poll() is None and time.time() < deadline, run.stderr.read()[-3000:]
        time.sleep(0.2)
    children = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) == 2, children
    os.kill(int(children[1]), signal.SIGTERM)  # the second process only
    finals = [json.loads(line) for line in finish(run, timeout=300).strip().splitlines() if line.startswith("{")]
    assert len(finals) == 2 and finals[0]["step"] == finals[1]["step"] < 100000, finals
    assert checkpoint_steps(out_dir)[-1] == finals[0]["step"]  # (Orbax also saves a run's first step)


def test_the_result_lines_of_processes_sharing_a_console_stay_whole():
    """Every process of a run prints its result line to the console they share. Under
    PYTHONUNBUFFERED, print() writes the newline on its own, and two processes that end together
    can mix their lines ({...}{...}). cli.print_line writes each line whole: two processes printing
    2,000 lines each at once give 4,000 lines that all parse."""
    script = ("import json, sys; from xpress_jax.cli import print_line\n"
              "for i in range(2000): print_line(json.dumps({'process': sys.argv[1], 'i': i, 'pad': 'x' * 200}))")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", script, str(p)], cwd=ROOT, env=env, stdout=write)
             for p in range(2)]
    os.close(write)
    with os.fdopen(read) as f:
        lines = f.read().splitlines()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 4000 and {r["process"] for r in rows} == {"0", "1"}


def test_the_readmes_real_target_commands_parse_with_every_flag_and_config_key():
    """Each command of the README's "On a real Qwen3 target" block, shell variables expanded, parses
    with that command's own flags and config file: no unknown flag, key or bad value."""
    import importlib
    import re
    import shlex
    from absl import flags
    from xpress_jax import cli
    from xpress_jax.config_schema import check_config
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = readme.split("## On a real Qwen3 target", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    variables = dict(re.match(r"(\w+)=(.*)", part).groups() for line in lines if re.match(r"^[A-Z]=", line)
                     for part in shlex.split(line.replace(";", " ")) if re.match(r"^[A-Z]=", part))
    commands = [line for line in lines if line.startswith("python -m xpress_jax.")]
    assert len(commands) == 7  # generate, four trainings, eval at T = 0 and 1
    for line in commands:
        line = re.sub(r"\$(\w+)", lambda m: shlex.quote(variables[m.group(1)]), line.split("#")[0])
        argv = shlex.split(line)[2:]
        module = importlib.import_module(f"{argv[0]}.__main__")
        flag_values = flags.FlagValues()
        # a fresh copy of the command's own flags, but for --config: an in-process run of the command
        # (cli.invoke) leaves it defined, and define_config_flag defines it anew
        for name in module.FLAGS:
            if name != "config" and not name.startswith("config."):
                flag_values[name] = module.FLAGS[name]
        argv = [argv[0]] + [a.replace("configs/", os.path.join(ROOT, "configs") + "/") for a in argv[1:]]
        cli.define_config_flag(flag_values, argv)
        flag_values(argv)
        check_config(flag_values.config)
