"""The benchmarks: the cost model counts what XLA counts, the roofline verdict follows the
measured peaks, and each suite runs as a user runs it and writes its figures and plots."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from cli_helpers import ROOT, invoke
from xpress_jax.bench import costs

SMALL = costs.Shapes(batch=2, n=5, vocab=300, hidden=32, rank=8, gru_hidden=8, proj_dim=8, weight_bytes=4)


def xla_flops(fn, *args) -> float:
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]


def test_matmul_flops_equal_xla_cost_analysis():
    h = jnp.ones((SMALL.batch, SMALL.n, SMALL.hidden))
    table = jnp.ones((SMALL.vocab, SMALL.hidden))
    assert costs.lm_head(SMALL).flops == xla_flops(lambda x, t: jnp.einsum("bnh,vh->bnv", x, t), h, table)
    z = jnp.ones((SMALL.batch * SMALL.n, SMALL.rank))
    w_r = jnp.ones((SMALL.rank, SMALL.vocab))
    readout = 2.0 * SMALL.batch * SMALL.n * SMALL.rank * SMALL.vocab  # the iteration's dominant term
    assert readout == xla_flops(lambda a, b: a @ b, z, w_r)
    assert costs.xpress_iteration(SMALL).flops >= readout


def test_serial_heads_stream_their_readout_once_per_step_and_xpress_once_per_iteration():
    v_r = SMALL.vocab * SMALL.rank * SMALL.weight_bytes
    logits = 2 * SMALL.batch * SMALL.n * SMALL.vocab * 4
    assert costs.markov_serial(SMALL).bytes == SMALL.n * v_r + logits
    k4 = costs.xpress_exact(SMALL, 4).bytes - costs.xpress_block_constant(SMALL).bytes
    assert k4 == pytest.approx(4 * costs.xpress_iteration(SMALL).bytes)
    assert costs.xpress_iteration(SMALL).bytes > v_r  # W_r read once per iteration for every position


def test_roofline_verdict_follows_the_peaks():
    cost = costs.Cost(flops=1e9, bytes=1e9)
    assert costs.bound(cost, {"matmul_flops_per_s": 1e12, "read_bytes_per_s": 1e10}, 0.2)["bound"] == "memory"
    verdict = costs.bound(cost, {"matmul_flops_per_s": 1e9, "read_bytes_per_s": 1e12}, 2.0)
    assert verdict["bound"] == "compute" and verdict["roofline_fraction"] == 0.5


def run_gpu_script(out, budget_s=None):
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XPRESS_TEST_XLA_FLAGS", ""),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "GPU_SH_TINY": "1",  # every stage at tiny shapes; at 8B shapes: benchmarks/cpu/gpu-dry-run/
           "GPU_SH_LIMIT_SCALE": "4"}  # the accelerator's stage limits, on a CPU that other tests share
    if budget_s is not None:
        env["GPU_SH_BUDGET_S"] = str(budget_s)
    r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu.sh"), "--dry_run", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
    with open(out / "stages.jsonl") as f:
        return r, [json.loads(line) for line in f]


def test_the_gpu_scripts_install_and_stage_limits_fit_its_600_s_budget():
    import re
    script = open(os.path.join(ROOT, "benchmarks", "gpu.sh")).read()
    budget = int(re.search(r"GPU_SH_BUDGET_S:-(\d+)", script).group(1))
    install = int(re.search(r"GPU_SH_INSTALL_S:-(\d+)", script).group(1))
    real = script[script.index("\nelse\n  stage parity"):]  # the accelerator branch's stages
    limits = {name: int(limit) for name, limit in re.findall(r"stage (\w+) (\d+) ", real)}
    assert list(limits) == ["parity", "decode", "dry_run", "heads", "e2e", "train"]
    assert budget == 600 and install + sum(limits.values()) < budget, (install, limits)
    assert script.index("started=$SECONDS") < script.index("pip install")  # the budget counts the install


def test_the_gpu_script_installs_what_is_missing_from_a_wheel_folder_alone(tmp_path):
    """An offline image: gpu.sh --install_only --wheels=DIR first prints jax's version, the devices
    and the missing package (one only a wheel folder has), installs it from the folder with no
    index (the CUDA jaxlib it also asks for is not there: reported, not fatal), and ends quickly."""
    import base64
    import hashlib
    import time
    import zipfile
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    info = "xpress_fake_wheel-0.1.dist-info"
    files = {"xpress_fake_wheel/__init__.py": "VALUE = 7\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: xpress-fake-wheel\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def digest(text):
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    record = "".join(f"{name},sha256={digest(text)},{len(text.encode())}\n" for name, text in files.items())
    files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheels / "xpress_fake_wheel-0.1-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "GPU_SH_REQUIRE": "xpress_fake_wheel", "PIP_TARGET": str(site), "PYTHONPATH": str(site),
           "XLA_FLAGS": os.environ.get("XPRESS_TEST_XLA_FLAGS", ""), "JAX_PLATFORMS": "cpu"}
    t0 = time.time()
    r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu.sh"), "--install_only", f"--wheels={wheels}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = r.stderr.splitlines()
    assert lines[0].startswith("gpu.sh: jax 0.") and "(cpu: " in lines[0] and lines[0].endswith(
        "missing: xpress_fake_wheel"), r.stderr
    assert "could not install jax[cuda12]" in r.stderr and lines[-1].endswith("missing: nothing"), r.stderr
    assert r.returncode == 0 and (site / "xpress_fake_wheel" / "__init__.py").is_file()
    assert time.time() - t0 < 120
    r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu.sh"), "--wheels=/no/such/dir"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage:" in r.stderr


@pytest.mark.pipeline
def test_the_gpu_script_runs_every_stage_and_the_suites_write_their_figures(tmp_path):
    """benchmarks/gpu.sh --dry_run on this CPU at tiny shapes (GPU_SH_TINY; the 8B run is recorded in
    benchmarks/cpu/gpu-dry-run), each stage recorded as it ends: the decode and heads stages compile
    their programs on abstract weights, the dry run reads the step's attention kernel lowered for
    TPU, and the train suite writes its figures and plots."""
    r, stages = run_gpu_script(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [s["stage"] for s in stages] == ["parity", "decode", "dry_run", "heads", "e2e", "train"]
    assert all(s["status"] == "ok" for s in stages), stages
    collected = (tmp_path / "parity.log").read_text()
    for test in ("match_transformers", "equals_hf_generate", "greedy_equals_target_only", "preserves_the_target_distr",
                 "exact_in_bf16"):
        assert test in collected, test
    with open(tmp_path / "dry_run.json") as f:
        dry = json.load(f)
    assert dry["complete"] and dry["flops_per_device"] > 0 and dry["max_len"] == 512
    assert dry["fused_attention"] == {"cpu": [], "tpu": ["splash"], "gpu": ["flash_gpu"]}
    with open(tmp_path / "decode.json") as f:
        decode = json.load(f)
    assert decode["complete"] and decode["shapes"]["target_layers"] == 4
    compiled = decode["contexts"]["128"]["1"]
    assert list(compiled) == ["target", "dflash"] and all(c["compile_s"] > 0 for c in compiled.values())
    with open(tmp_path / "e2e" / "results.json") as f:
        e2e = json.load(f)
    assert e2e["results"]["gsm8k"]["dflash"]["lossless"] is True
    with open(tmp_path / "machine.json") as f:
        assert json.load(f)["dry_run"] is True

    with open(tmp_path / "heads.json") as f:
        heads = json.load(f)
    assert heads["complete"] and set(heads["batches"]) == {"2"}
    assert all(len(b["compile_s"]) == 13 for b in heads["batches"].values())

    with open(tmp_path / "train.json") as f:
        train = json.load(f)
    variants = train["variants"]
    assert set(variants) == {"remat=True,anchor_chunk=4", "remat=False,anchor_chunk=4"}  # --anchor_chunks=4
    assert all(v["tokens_per_s"] > 0 for v in variants.values())
    # rematerialisation recomputes the drafter's forward in the backward pass: more flops, same step
    remat, stored = variants["remat=True,anchor_chunk=4"], variants["remat=False,anchor_chunk=4"]
    assert remat["flops"] > stored["flops"] and remat["loss"] == pytest.approx(stored["loss"], rel=1e-4)
    # one device count: strong and weak are one program, split evenly (tests/test_trainer.py
    # asserts how memory and FLOPs fall between device counts)
    scaling = train["scaling"]
    assert scaling["strong"] == scaling["weak"] and scaling["strong"][0]["devices"] == 4
    assert scaling["strong"][0]["peak_gib"] > 0 and 0.9 < scaling["strong"][0]["flops_vs_ideal"] < 1.3
    assert os.path.getsize(tmp_path / "train-scaling.png") > 0 and "| strong | 4 |" in (tmp_path / "train.log").read_text()
    frozen = train["frozen_drafter"]["markov"]  # --frozen_heads=markov
    assert set(train["frozen_drafter"]) == {"markov"}
    assert frozen["frozen"]["seconds_per_step"] > 0 and frozen["full_backward"]["seconds_per_step"] > 0
    assert 0 < frozen["flops_ratio"] < 1


def test_the_heads_suite_times_every_call_with_its_roofline(tmp_path):
    """The heads suite at tiny sizes: every call timed, its FLOPs, bytes and bound, the H200
    roofline, the plots and the summary lines."""
    r = invoke("xpress_jax.bench", "--suite=heads", f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}",
               "--batches=2", "--context=32", "--reps=1", f"--out={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    with open(tmp_path / "heads.json") as f:
        heads = json.load(f)
    assert set(heads["batches"]) == {"2"} and heads["jax"] == jax.__version__ and heads["date"]
    for result in heads["batches"].values():
        assert result["ratio_to_markov"]["markov"] == 1.0
        assert {"drafter_forward", "lm_head", "xpress_fold", "xpress_it8", "xpress_it4_top8"} <= set(result["seconds"])
        assert all(c["bound"] in ("compute", "memory") and c["gflops"] > 0 for c in result["costs"].values())
        assert 1 <= result["early_stop_iterations_random_weights"] <= 4
        # the paper's unit and the H200 roofline: the iteration streams the rank-r readout once,
        # a Markov block streams it at each of its n steps
        roof = result["h200_roofline"]
        # the slope is a timing: at tiny sizes with one repetition its sign is noise, so only its use is checked
        assert result["per_iteration_vs_markov_block"] == pytest.approx(
            result["per_iteration_s"] / result["seconds"]["markov"]) and roof["read_bytes_per_s"] == 4.8e12
        assert roof["xpress_iteration_bound_s"] == roof["xpress_iteration_bytes"] / 4.8e12
        assert roof["markov_block_bytes"] > 2 * roof["xpress_iteration_bytes"]
    for png in ("heads-latency_vs_iterations.png", "heads-draft_step.png"):
        assert os.path.getsize(tmp_path / png) > 0
    assert "XPress 4 iterations" in r.stdout
    assert "at an H200's 4.8 TB/s" in r.stdout


def test_the_gpu_script_records_the_stages_its_budget_leaves_out(tmp_path):
    r, stages = run_gpu_script(tmp_path, budget_s=19)
    assert r.returncode == 0 and [s["status"] for s in stages] == ["skipped"] * 6, (r.stderr, stages)
    assert "budget is spent" in r.stderr


def test_the_decode_suite_reports_each_variant_as_it_is_measured():
    """A cut run keeps what it measured: progress() after each variant, with the rows so far."""
    from xpress_jax.bench.decode import chosen_variants, suite
    from xpress_jax.cli import load_config
    seen = []
    suite(load_config(os.path.join(ROOT, "configs", "tiny.py")), contexts=(16,), batches=(1,), new_tokens=8,
          variants=chosen_variants(["dflash", "markov"]), compile_only=True,
          progress=lambda partial: seen.append(list(partial["contexts"]["16"]["1"])))
    assert seen == [["target"], ["target", "dflash"], ["target", "dflash", "markov"]]


def test_decode_suite_reports_every_decoder_against_target_only(tmp_path):
    from xpress_jax.bench.decode import VARIANTS
    tiny = os.path.join(ROOT, "configs", "tiny.py")
    new_tokens = 48  # the counts are checked here, not the times (the benchmark records those)
    r = invoke("xpress_jax.bench", "--suite=decode", f"--decode_config={tiny}", "--contexts=16", "--batches=1",
               f"--decode_tokens={new_tokens}", "--reps=1", f"--out={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    with open(tmp_path / "decode.json") as f:
        result = json.load(f)
    assert result["config"] == tiny
    rows = result["contexts"]["16"]["1"]
    assert list(rows) == [label for label, _, _ in VARIANTS]
    assert rows["target"]["break_even_tau"] == 1.0
    for label, row in rows.items():
        assert row["seconds_per_step"] > 0, label
        # no stop ids: every run commits exactly the tokens after the first, so `steps` is the loop's count
        assert round(row["tokens_per_step"] * row["steps"]) == new_tokens - 1, label
    assert rows["target"]["steps"] == new_tokens - 1  # target-only commits one token a step
    assert os.path.getsize(tmp_path / "decode-break_even_tau.png") > 0
    assert "break-even tau: dflash" in r.stdout and "Traceback" not in r.stderr


def test_decode_suite_times_other_shapes_and_chosen_variants(tmp_path):
    """--decode_set overrides the config's shapes (as --config.KEY does), --decode_variants keeps
    target-only and the named rows; an unknown key or label is a one-line error."""
    tiny = os.path.join(ROOT, "configs", "tiny.py")
    # 3 repetitions of 256 tokens: at these shapes target-only decoding takes milliseconds, and a
    # single repetition of 128 tokens could time faster than one token under load
    common = ("xpress_jax.bench", "--suite=decode", f"--decode_config={tiny}", "--contexts=8", "--batches=1",
              "--decode_tokens=256", "--reps=3", f"--out={tmp_path}")
    r = invoke(*common, "--decode_set=target.arch.num_hidden_layers=3,heads.rank=8", "--decode_variants=markov",
               "--verify_tokens=0,2")
    assert r.returncode == 0, r.stderr[-3000:]
    with open(tmp_path / "decode.json") as f:
        result = json.load(f)
    assert result["overrides"] == ["target.arch.num_hidden_layers=3", "heads.rank=8"]
    assert result["shapes"]["target_layers"] == 3 and result["shapes"]["head_rank"] == 8
    rows = result["contexts"]["8"]["1"]
    assert list(rows) == ["target", "markov", "markov_v2"]  # each drafter variant at each verify length
    assert rows["markov_v2"]["tokens_per_step"] <= 3 and rows["markov_v2"]["break_even_tau"] > 0
    r = invoke(*common, "--decode_variants=medusa")
    assert r.returncode == 2 and "unknown decode variants ['medusa']" in r.stderr and "Traceback" not in r.stderr
    r = invoke(*common, "--decode_variants=dflash", "--verify_tokens=40")
    assert r.returncode == 2 and "verify_tokens 40 is outside" in r.stderr and "Traceback" not in r.stderr
    r = invoke(*common, "--decode_set=target.arch.num_layers=3")
    assert r.returncode == 2 and "num_layers" in r.stderr and "Traceback" not in r.stderr
    r = invoke("xpress_jax.bench", "--suite=all", "--scaling_devices=2,16", f"--out={tmp_path / 'none'}")
    assert r.returncode == 2 and "--scaling_devices=2,16: expected device counts between 1 and 8" in r.stderr
    r = invoke("xpress_jax.bench", "--suite=all", "--frozen_heads=medusa", f"--out={tmp_path / 'none'}")
    assert r.returncode == 2 and "--frozen_heads: unknown heads ['medusa']" in r.stderr
    r = invoke("xpress_jax.bench", "--suite=all", "--anchor_chunks=0", f"--out={tmp_path / 'none'}")
    assert r.returncode == 2 and "--anchor_chunks=0: expected positive anchor counts" in r.stderr
    assert not os.listdir(tmp_path / "none")  # refused before any suite ran


def test_decode_suite_refuses_a_run_too_short_to_time(monkeypatch):
    from xpress_jax import cli
    from xpress_jax.bench import decode
    from xpress_jax.errors import InputError
    config = cli.load_config(os.path.join(ROOT, "configs", "tiny.py"))
    monkeypatch.setattr(decode, "fastest_seconds", lambda fn, reps: (0.01, fn()))  # both runs take "0.01 s"
    with pytest.raises(InputError, match="too few to time"):
        decode.suite(config, contexts=(8,), new_tokens=4, reps=1, variants=decode.VARIANTS[:1])


def test_the_regen_suite_sets_continuous_batching_beside_a_static_batch(tmp_path):
    """In process, on this process's 8 simulated devices: every way gives the same tokens, and the
    figures the benchmark record reads (useful tokens per decode slot, tokens/s, the share of time
    admitting at each prompt's own bucket and at the queue's) are there."""
    r = invoke("xpress_jax.bench", "--suite=regen", "--regen_prompts=8", "--regen_max_new_tokens=32",
               "--regen_batches=8", "--reps=1", f"--out={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "regen.json").read_text())
    row = result["batches"]["8"]
    assert result["complete"] and result["devices"] == 8 and row["same_tokens"] is True
    assert 0 < row["static"]["useful_per_slot"] <= row["continuous"]["useful_per_slot"] <= 1
    assert row["static"]["answer_tokens"] == row["continuous"]["answer_tokens"] > 8
    queue, own = row["continuous_queue_bucket"], row["continuous"]
    assert queue["decode_slots"] == own["decode_slots"]  # the same decoding; only admissions differ
    # every prompt admitted once: at the queue's longest bucket, or at its own (two or more here)
    admitted, seconds = result["admitted_at"], result["prefill_seconds"]
    assert sum(admitted["own"].values()) == sum(admitted["queue"].values()) == 8
    assert len(admitted["queue"]) == 1 and len(admitted["own"]) >= 2
    assert max(map(int, admitted["own"])) == int(next(iter(admitted["queue"])))
    for way, run in (("own", own), ("queue", queue)):  # the share: those prefills' times over the run's
        spent = sum(n * seconds[length] for length, n in admitted[way].items())
        assert run["admission_share"] == pytest.approx(min(spent / 8 / run["seconds"], 1.0))
    assert "useful tokens per decode slot" in r.stdout and "of the time admitting" in r.stdout
