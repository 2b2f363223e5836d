"""The papers' protocol end to end: configs/paper_eval.py on the tiny target, the published drafter
in the official package's layout, and the questions split over devices (eval's own tests are in
test_eval.py; the benchmarks' files and prompts in test_questions.py)."""

import json
import os

import numpy as np
import pytest

from cli_helpers import invoke
from xpress_jax.checkpoints.heads import save_head

MT_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "benchmarks", "mt_bench")


def test_the_papers_protocol_runs_on_the_tiny_target(tmp_path, monkeypatch):
    """configs/paper_eval.py with the shipped tiny target standing in for Qwen3-8B, at reduced
    lengths: the eight benchmarks from their published files (bench/NAME), every decoder, XPress's
    iteration sweep and D-Loop at K = 1 and 4, each lossless at T = 0. (Its T = 1 pass is the same
    command with --temperature=1, parsed with the README's commands in test_launch.py; sampling
    itself is tested in test_speculative.py and test_dloop.py.)"""
    import shutil
    from cli_helpers import ROOT
    from xpress_jax import assets
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    from xpress_jax.cli import load_config
    from xpress_jax.data.benchmarks import PUBLISHED
    from xpress_jax.models.build import new_head
    ckpt = tmp_path / "ckpt"
    shutil.copytree(assets.TINY_DFLASH, ckpt)
    shutil.copytree(os.path.join(assets.TINY_XPRESS_HEADS, "heads"), ckpt / "heads")
    config = load_config(os.path.join(ROOT, "configs", "paper_eval.py:tiny_heads"))
    for name in ("markov", "gru"):  # random serial heads beside the shipped refiner
        save_head(new_head(name, config, load_drafter(str(ckpt)).cfg), str(ckpt), name)
    (tmp_path / "bench").symlink_to(os.path.join(ROOT, "tests", "data", "benchmarks"))
    monkeypatch.chdir(tmp_path)
    common = [f"--config={ROOT}/configs/paper_eval.py:tiny_heads", f"--config.target.hf_dir={assets.TINY_TARGET}",
              "--num_prompts=1", "--max_new_tokens=6", "--config.eval.time_split=false"]
    every = ",".join(f"{d}={ckpt}" for d in ("dflash", "markov", "gru", "xpress", "dloop"))
    r = invoke("xpress_jax.eval", *common, f"--checkpoints={every}", "--check_lossless", "--out=t0")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "t0" / "results.json").read_text())
    assert list(report["results"]) == list(PUBLISHED)
    s = report["settings"]
    assert (s["batch_size"], s["temperature"], s["iteration_sweep"], s["dloop_branches"]) == (
        1, 0.0, [1, 2, 4, 8], [1, 4])
    for ds, rows in report["results"].items():
        assert set(rows) == {"target", "dflash", "markov", "gru", "xpress", "dloop", "dloop.b4"}, ds
        assert all(r["lossless"] is True for label, r in rows.items() if label != "target"), ds
        assert set(report["iteration_sweep"][ds]["xpress"]) == {"1", "2", "4", "8"}
    assert report["published_target"] is None  # the tiny target: no published figures beside it
    # the harness's protocol: its counts asked, MT-Bench's two turns each a response, every source
    protocol = report["protocol"]
    assert protocol["acceptance"] == "greedy" and protocol["datasets"]["gsm8k"]["asked"] == 1
    assert config.eval.num_prompts == 0 and config.eval.acceptance == "match"  # the harness's counts and T = 1 rule
    assert protocol["datasets"]["mt_bench"]["responses"] == 2 and report["responses"]["mt_bench"][1]["turn"] == 2
    # one of the 3 test-split questions: the seeded shuffle's first, default_rng(0).permutation(3)[0] == 2
    assert report["responses"]["mbpp"][0]["source"].endswith("sanitized-mbpp.json:32 (task_id 510)")
    xpress = report["results"]["mt_bench"]["xpress"]
    assert xpress["n_prompts"] == 2
    # the harness's speedup: target-only's mean decode seconds per token over the method's, response by response
    per_token = {label: np.asarray(report["results"]["mt_bench"][label]["per_prompt"]["decode_s_per_token"])
                 for label in ("target", "xpress")}
    assert all(len(v) == 2 and (v >= 0).all() for v in per_token.values())
    if per_token["xpress"].mean() > 0:  # six tokens on a busy CPU can take no longer than the one-token call
        assert xpress["speedup_harness"] == pytest.approx(per_token["target"].mean() / per_token["xpress"].mean(),
                                                          rel=1e-2, abs=1e-3)
    assert xpress["tau_no_bonus_per_prompt_mean"] == pytest.approx(xpress["tau_per_prompt_mean"] - 1)


def test_the_published_drafter_in_the_official_layout_is_evaluated_as_dflash(tmp_path):
    """DFlash in the papers' tables is the published drafter: a directory written by the official
    package (`dflash.DFlashDraftModel.save_pretrained`, here a tiny random one for the shipped
    target) is read as it is and evaluated, losslessly, under the label dflash."""
    import torch
    import transformers
    from dflash import model as dflash_model
    from xpress_jax import assets
    published = json.loads(open(os.path.join(assets.TINY_DFLASH, "config.json")).read())
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(**{k: published[k] for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta")}, initializer_range=0.2)
    cfg.num_target_layers, cfg.block_size = published["num_target_layers"], published["block_size"]
    cfg.dflash_config, cfg.architectures = published["dflash_config"], ["DFlashDraftModel"]
    dflash_model.DFlashDraftModel(cfg).eval().save_pretrained(str(tmp_path / "published"))
    fixtures = os.path.join(os.path.dirname(__file__), "data", "benchmarks", "gsm8k")
    r = invoke("xpress_jax.eval", f"--config.target.hf_dir={assets.TINY_TARGET}",
               f"--checkpoints=dflash={tmp_path / 'published'}", f"--datasets=gsm8k={fixtures}", "--num_prompts=2",
               "--max_new_tokens=8", "--config.eval.time_split=false", "--config.eval.iteration_sweep=()",
               "--check_lossless", f"--out={tmp_path / 'out'}")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["methods"]["dflash"]["checkpoint"] == str(tmp_path / "published")
    row = report["results"]["gsm8k"]["dflash"]
    assert row["lossless"] is True and row["n_prompts"] == 2 and row["steps"] > 0


def test_eval_splits_the_questions_over_devices_and_gives_the_one_device_answers(tmp_path):
    """eval.devices=4 (of the 8 simulated): every response's tokens and target passes equal the
    one-device run's, and each device decoded a quarter of the questions (counted)."""
    from xpress_jax import assets
    runs = {}
    for devices in (1, 4):
        out = tmp_path / f"d{devices}"
        r = invoke("xpress_jax.eval", f"--config.target.hf_dir={assets.TINY_TARGET}",
                   f"--checkpoints=dflash={assets.TINY_DFLASH}", "--datasets=gsm8k", "--num_prompts=8",
                   "--max_new_tokens=12", "--config.eval.time_split=false", f"--config.eval.devices={devices}",
                   f"--out={out}")
        assert r.returncode == 0, r.stderr[-3000:]
        runs[devices] = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
        runs[devices, "report"] = json.loads((out / "results.json").read_text())
    key = lambda a: (a["method"], a["source"], a["turn"])  # noqa: E731
    assert [key(a) for a in runs[1]] == [key(a) for a in runs[4]] and len(runs[1]) == 16  # 8 questions, 2 decoders
    assert [(a["tokens"], a["per_step"]) for a in runs[1]] == [(a["tokens"], a["per_step"]) for a in runs[4]]
    devices = [r["device"] for r in runs[4, "report"]["responses"]["gsm8k"]]
    assert sorted(devices.count(d) for d in range(4)) == [2, 2, 2, 2] and set(devices) == {0, 1, 2, 3}
    assert {r["device"] for r in runs[1, "report"]["responses"]["gsm8k"]} == {0}
    assert all(a["equals_target_only"] for a in runs[4])


@pytest.mark.pipeline
def test_eval_over_two_processes_gives_the_one_device_answers(tmp_path):
    """Two processes of two devices each (`launch/local_multiprocess.sh 2 eval`), MT-Bench's two
    turns and GSM8K: every response's tokens and target passes equal the one-device run's, each of
    the four workers decoded its share, and only process 0 printed the table and wrote the outputs."""
    from cli_helpers import start_processes
    from xpress_jax import assets
    args = (f"--config.target.hf_dir={assets.TINY_TARGET}", f"--checkpoints=dflash={assets.TINY_DFLASH}",
            f"--datasets=gsm8k,mt_bench={MT_BENCH}", "--num_prompts=4", "--max_new_tokens=12",
            "--config.eval.time_split=false")
    one = invoke("xpress_jax.eval", *args, "--config.eval.devices=1", f"--out={tmp_path / 'one'}")
    assert one.returncode == 0, one.stderr[-3000:]
    run = start_processes(2, "eval", *args, "--config.eval.devices=0", f"--out={tmp_path / 'two'}")
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    assert out.count("results: ") == 1 and out.count("| method | gsm8k | mt_bench |") == 1, out
    answers = {n: [json.loads(line) for line in (tmp_path / n / "answers.jsonl").read_text().splitlines()]
               for n in ("one", "two")}
    key = lambda a: (a["dataset"], a["method"], a["source"], a["turn"], a["prompt_tokens"])  # noqa: E731
    assert [key(a) for a in answers["one"]] == [key(a) for a in answers["two"]]
    assert len(answers["one"]) == 2 * (4 + 8)  # two decoders; MT-Bench asks two turns
    assert [(a["tokens"], a["per_step"]) for a in answers["one"]] == [(a["tokens"], a["per_step"])
                                                                      for a in answers["two"]]
    report = json.loads((tmp_path / "two" / "results.json").read_text())
    assert report["protocol"]["workers"].startswith("4 ")
    devices = [r["device"] for r in report["responses"]["mt_bench"]]
    assert sorted(devices) == [0, 0, 1, 1, 2, 2, 3, 3]  # one question (both its turns) per worker
    assert [r["device"] for r in report["responses"]["gsm8k"]] == [0, 1, 2, 3]


def test_a_later_turn_is_asked_after_the_decoders_own_answer():
    """At T = 1 the drafter's sampled answers differ from target-only decoding's: each decoder's
    second MT-Bench turn is prompted with exactly the conversation holding its own first answer,
    rendered as Qwen3's template renders an earlier assistant turn."""
    import dataclasses
    from xpress_jax import assets
    from xpress_jax.cli import DEFAULT_CONFIG, load_config
    from xpress_jax.data.chat import load_tokenizer, prompt_ids
    from xpress_jax.data.questions import load_dataset_entry
    from xpress_jax.eval.evaluate import build_methods, conversation, decode_dataset, parse_methods, stop_ids
    from xpress_jax.eval.settings import EvalSettings
    from xpress_jax.decoding.speculative import DecodingModels
    config = load_config(DEFAULT_CONFIG)
    config.target.hf_dir = assets.TINY_TARGET
    methods = parse_methods([f"dflash={assets.TINY_DFLASH}"], (), "")
    s = dataclasses.replace(EvalSettings.from_config(config.eval), temperature=1.0, max_new_tokens=12)
    target, models = build_methods(config, methods, s.drafter_dtype)
    decoders = {"target": (DecodingModels(target), None), "dflash": (models["dflash"], methods[0])}
    tok = load_tokenizer(assets.TINY_TARGET)
    questions = load_dataset_entry(f"mt_bench={MT_BENCH}", 2).questions
    decoded, responses = decode_dataset("mt_bench", questions, decoders, s, tok, stop_ids(tok), 64, progress=False)
    assert [(r["source"], r["turn"]) for r in responses] == [(q.source, t) for q in questions for t in (1, 2)]
    texts = {label: [tok.decode(t, skip_special_tokens=True) for t in runs.tokens]
             for label, (_, runs) in decoded.items()}
    assert texts["target"][0::2] != texts["dflash"][0::2]  # the two decoders' first answers differ
    for label, (prompts, _) in decoded.items():
        for k, r in enumerate(responses):
            q = questions[k // 2]
            earlier = [texts[label][k - 1]] if r["turn"] == 2 else []
            assert prompts[k] == prompt_ids(tok, conversation(q, earlier, r["turn"] - 1), earlier_think_blocks=False)
