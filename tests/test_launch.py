"""The launch scripts: --dry_run prints each worker's / task's exact command (coordinator,
process ids, environment); the local script really trains with two processes."""

import json
import os
import subprocess
import sys

import portpicker

from train_helpers import checkpoint_steps, override_args

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


def test_local_script_trains_with_two_processes_that_agree(tmp_path):
    r = launch("local_multiprocess.sh", "2", *override_args(tmp_path), "--config.train.steps=3",
               "--config.train.save_every=3", env_extra={"XPRESS_PORT": str(portpicker.pick_unused_port())},
               timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    finals = [json.loads(line) for line in r.stdout.strip().splitlines() if line.startswith("{")]
    for f in finals:
        f.pop("tokens_per_s")  # each process's own clock
    assert len(finals) == 2 and finals[0] == finals[1] and finals[0]["step"] == 3
    assert checkpoint_steps(tmp_path)[-1] == 3
