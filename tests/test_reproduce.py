"""The reproduction pipeline at smoke size, run as a user runs it: every stage produces what the
next one needs, a second run is all cache hits, and the exported target and DFlash drafter give,
in the official PyTorch `dflash` package, exactly our tokens and acceptance lengths."""

import json
import os
import shutil

import numpy as np
import pytest

from cli_helpers import ROOT, invoke, run
from xpress_jax.methods import head_of

SMOKE = os.path.join(ROOT, "configs", "tiny_repro_smoke.py")
STAGES = ("dflash", "dflash.more", "xpress", "xpress.frozen", "markov", "gru", "dloop", "dloop+xpress")  # the trained ones
LABELS = STAGES + ("dloop.b2", "dloop+xpress.b2")  # the evaluated methods (dloop_branches = 1, 2)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro") / "run"
    r = run("xpress_jax.reproduce", f"--config={SMOKE}", f"--out={out}", timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    return out, r


def read_json(path):
    return json.loads(path.read_text())


@pytest.mark.pipeline
def test_every_stage_finishes(smoke_run):
    out, _ = smoke_run
    for stage in ("target", "regen") + STAGES + ("eval",):
        assert (out / stage / "DONE.json").is_file(), stage


@pytest.mark.pipeline
def test_the_target_is_an_hf_directory_with_its_tokenizer_and_report(smoke_run):
    out, _ = smoke_run
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "pretrain.json"):
        assert (out / "target" / name).is_file(), name
    report = read_json(out / "target" / "pretrain.json")
    assert report["val_loss"] > 0 and 0 <= report["greedy"]["distinct_4"] <= 1 and report["greedy"]["examples"]


@pytest.mark.pipeline
def test_regeneration_gives_every_conversation_the_targets_reply(smoke_run):
    out, _ = smoke_run
    regen = [json.loads(line) for line in open(out / "regen" / "data.jsonl")]
    assert len(regen) == 16 and all(row["conversations"][-1]["role"] == "assistant" for row in regen)


@pytest.mark.pipeline
def test_every_trained_stage_exports_the_dflash_layout_with_its_head(smoke_run):
    out, _ = smoke_run
    for stage in STAGES:
        export = out / stage / "export"
        assert read_json(export / "config.json")["architectures"] == ["DFlashDraftModel"]
        head = head_of(stage.split(".")[0])
        assert (export / "heads" / f"{head}.safetensors").is_file() if head else not (export / "heads").exists()


@pytest.mark.pipeline
def test_every_method_is_lossless_at_temperature_0_with_tau_and_its_interval(smoke_run):
    out, _ = smoke_run
    t0 = read_json(out / "eval" / "T0" / "results.json")
    rows = t0["results"]["gsm8k"]
    assert set(rows) == {"target", *LABELS}
    assert all(rows[label]["lossless"] is True for label in LABELS)
    for label in LABELS:  # tau and its per-prompt mean from the committed tokens and target passes of each prompt
        counts = rows[label]["per_prompt"]
        assert rows[label]["tau"] == pytest.approx(sum(counts["committed"]) / sum(counts["steps"]), rel=1e-9)
        assert rows[label]["tau_per_prompt_mean"] == pytest.approx(
            np.mean(np.asarray(counts["committed"]) / np.asarray(counts["steps"])), abs=1e-4)
    assert set(t0["iteration_sweep"]["gsm8k"]) == {"xpress", "xpress.frozen"}
    for label in LABELS:  # every method against dflash on the same prompts, with its interval
        if label != "dflash":
            c = rows[label]["tau_vs_reference"]
            assert c["reference"] == "dflash" and 0 < c["ci95"][0] <= c["ci95"][1]
            assert c["ratio"] == pytest.approx(rows[label]["tau"] / rows["dflash"]["tau"], abs=1e-3)
    assert rows["dloop.b2"]["branches"] == 2


@pytest.mark.pipeline
def test_xpress_candidate_mode_is_measured(smoke_run):
    out, _ = smoke_run
    cand = read_json(out / "eval" / "T0" / "results.json")["results"]["gsm8k"]["xpress"]["candidate"]
    # a block agrees only where all its tokens do
    assert cand["blocks"] > 0 and cand["block_agreement"] <= cand["token_agreement"] <= 1 and cand["tau"] > 0


@pytest.mark.pipeline
def test_every_method_is_evaluated_at_temperature_1(smoke_run):
    out, _ = smoke_run
    t1 = read_json(out / "eval" / "T1" / "results.json")
    assert t1["settings"]["temperature"] == 1.0 and set(t1["results"]["gsm8k"]) == {"target", *LABELS}


def test_the_speed_passes_follow_every_temperature_and_verify_the_first_m_drafts():
    """configs/tiny_repro.py's eval passes (the smoke run has none of the speed ones): each
    temperature with whole blocks, then again with the target verifying each block's first m
    drafts, the iteration sweep and candidate mode only at T = 0 with whole blocks."""
    from xpress_jax import cli
    from xpress_jax.reproduce.results import pass_title
    from xpress_jax.reproduce.stages import eval_passes
    config = cli.with_overrides(os.path.join(ROOT, "configs", "tiny_repro.py"))
    m = config.reproduce.speed_verify_tokens
    passes = dict(eval_passes(config, "run"))
    assert list(passes) == ["T0", "T1", f"T0_v{m}", f"T1_v{m}"] and m > 0
    for name, s in passes.items():
        assert (s.temperature, s.verify_tokens) == (float(name[1]), m if "_v" in name else 0), name
        assert s.out_dir == os.path.join("run", "eval", name)
        assert bool(s.iteration_sweep) == bool(s.candidate_k) == (name == "T0"), name
    assert passes["T0"].iteration_sweep == tuple(config.eval.iteration_sweep)
    assert pass_title(f"T1_v{m}") == f"temperature 1, the target verifying the first {m} drafts of each block"


@pytest.mark.pipeline
def test_the_results_record_every_stages_time_and_every_eval(smoke_run):
    out, _ = smoke_run
    results = read_json(out / "results.json")
    assert set(results["stage_seconds"]) == {"target", "regen", *STAGES, "eval"}
    assert set(results["eval"]) == {"T0", "T1"}


@pytest.mark.pipeline
def test_every_method_is_paired_with_the_same_budget_drafter(smoke_run):
    """dflash.more/: the drafter trained as many more steps as a head, paired over prompts."""
    out, _ = smoke_run
    results = read_json(out / "results.json")
    for name in ("T0", "T1"):
        rows = read_json(out / "eval" / name / "results.json")["results"]["gsm8k"]
        same_budget = results["tau_vs_same_budget"][name]["gsm8k"]
        assert set(same_budget) == set(LABELS) - {"dflash.more"}
        for label, c in same_budget.items():
            assert c["ratio"] == pytest.approx(rows[label]["tau"] / rows["dflash.more"]["tau"], abs=1e-3)
            assert 0 < c["ci95"][0] <= c["ci95"][1]
    assert "| tau / dflash (95%) | tau / dflash.more (95%) |" in (out / "table.md").read_text()


@pytest.mark.pipeline
def test_the_table_is_printed_with_dloops_prefixes(smoke_run):
    out, r = smoke_run
    table = (out / "table.md").read_text()
    assert "| gsm8k | xpress |" in table and "| gsm8k | xpress |" in r.stdout
    assert "gsm8k dloop: the verified branch kept" in table  # D-Loop's prefixes


@pytest.mark.pipeline
def test_the_console_shows_progress_and_results_and_library_logs_go_to_a_file(smoke_run):
    out, r = smoke_run
    assert " I1" not in r.stderr and "checkpoint_manager" not in r.stderr
    assert "checkpoint_manager" in (out / "log.txt").read_text()


@pytest.mark.pipeline
def test_a_second_run_is_all_cache_hits_and_publishes_the_results(smoke_run, tmp_path):
    out, _ = smoke_run
    published = tmp_path / "benchmarks" / "tiny"
    r = invoke("xpress_jax.reproduce", f"--config={SMOKE}", f"--out={out}", f"--publish={published}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("done already") == len(STAGES) + 3 and "running" not in r.stderr
    assert set(os.listdir(published)) == {"results.json", "table.md", "T0_acceptance.png", "T0_tau_vs_iterations.png",
                                          "T1_acceptance.png"}
    assert (published / "table.md").read_text() == (out / "table.md").read_text()
    published_results = json.loads((published / "results.json").read_text())
    assert published_results["target"]["val_loss"] > 0 and set(published_results["eval"]) == {"T0", "T1"}


@pytest.mark.pipeline
def test_the_exported_target_loads_in_transformers_and_passes_logit_check(smoke_run):
    out, _ = smoke_run
    r = invoke("xpress_jax.tools.logit_check", f"--hf_dir={out / 'target'}")
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.pipeline
def test_official_dflash_gives_our_tokens_and_acceptance_lengths(smoke_run, monkeypatch):
    """dflash_generate (PyTorch, greedy) on the exported target + DFlash drafter against our
    jitted loop on the same prompts: same tokens, same steps, same per-prompt acceptance length."""
    import time

    import torch
    import transformers
    from dflash import model as dflash_model
    from dflash.model import DFlashDraftModel, dflash_generate

    from xpress_jax.checkpoints.hf_drafter import load_drafter
    from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
    from xpress_jax.data.chat import load_tokenizer, prompt_ids
    from xpress_jax.data.questions import load_questions
    from xpress_jax.decoding.speculative import DecodingModels, generate

    # return_stats times with torch.cuda.synchronize; on this CPU a plain clock does the same job
    monkeypatch.setattr(dflash_model, "_cuda_time", time.perf_counter)
    out, _ = smoke_run
    tok = load_tokenizer(str(out / "target"))
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    questions = load_questions("gsm8k", 2) + load_questions("humaneval", 1)
    prompts = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    max_new = 40

    ref_target = transformers.AutoModelForCausalLM.from_pretrained(str(out / "target"), dtype=torch.float32).eval()
    ref_drafter = DFlashDraftModel.from_pretrained(str(out / "dflash" / "export")).float().eval()
    ours = DecodingModels(load_qwen3(str(out / "target")), load_drafter(str(out / "dflash" / "export")))
    block = ours.drafter.cfg.block_size
    for prompt in prompts:
        mine = generate(ours, [prompt], decoder="dflash", max_new_tokens=max_new, stop_ids=stops)
        # the reference with room for a full block at our end, then cut where we stop
        ref = dflash_generate(ref_drafter, ref_target, torch.tensor([prompt]), max_new + block, stops,
                              temperature=0.0, return_stats=True)
        ref_tokens = ref.output_ids[0, len(prompt):].tolist()
        assert ref_tokens[:len(mine.tokens[0])] == mine.tokens[0]
        budget, expected = len(mine.tokens[0]) - 1, []  # tokens after the prefill's first one
        for produced in ref.acceptance_lengths:
            if sum(expected) >= budget:
                break
            expected.append(min(produced, budget - sum(expected)))
        steps = int(mine.stats["steps"][0])
        assert mine.stats["per_step"][0, :steps].tolist() == expected  # acceptance length of every step
        assert mine.tau == pytest.approx(sum(expected) / len(expected))


def test_a_stage_without_its_inputs_or_an_unknown_stage_is_refused(tmp_path):
    r = invoke("xpress_jax.reproduce", f"--config={SMOKE}", f"--out={tmp_path}", "--stages=dflash")
    assert r.returncode == 2 and "stage dflash needs ['target', 'regen'] first" in r.stderr
    assert "Traceback" not in r.stderr
    r = invoke("xpress_jax.reproduce", f"--config={SMOKE}", f"--out={tmp_path}", "--stages=medusa")
    assert r.returncode == 2 and "unknown stages ['medusa']" in r.stderr


@pytest.mark.pipeline
def test_export_a_target_step_and_the_drafter_run_with_its_target(smoke_run, tmp_path):
    """Any step of the target run as an HF directory; a drafter run with --target writes the
    target it trained against, with its tokenizer."""
    import transformers
    from cli_helpers import last_json
    out, _ = smoke_run
    r = invoke("xpress_jax.export", f"--run={out / 'target'}", "--step=6", f"--out={tmp_path / 't'}", "--dtype=float32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_json(r.stdout)["step"] == 6
    a = transformers.AutoModelForCausalLM.from_pretrained(str(out / "target"))
    b = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "t"))
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert (p == q).all(), name
    assert (tmp_path / "t" / "tokenizer.json").is_file()
    r = invoke("xpress_jax.export", f"--run={out / 'dflash'}", f"--out={tmp_path / 'd'}", "--target")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "d" / "model.safetensors").is_file() and (tmp_path / "d" / "target" / "tokenizer.json").is_file()
    transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "d" / "target"))


@pytest.mark.pipeline
def test_the_e2e_benchmark_runs_on_the_trained_checkpoints(smoke_run, tmp_path):
    out, _ = smoke_run
    r = run("xpress_jax.bench", "--suite=e2e", f"--run_dir={out}", f"--repro_config={SMOKE}", "--num_prompts=2",
            "--max_new_tokens=12", "--batches=1,2", "--reps=1", f"--out={tmp_path}", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(tmp_path / "e2e.json") as f:
        e2e = json.load(f)
    assert e2e["lossless_failures"] == 0 and set(e2e["decode"]) == {"target", *STAGES}
    assert all(v["tokens_per_s"] > 0 for v in e2e["decode"].values())
    blocks = e2e["real_blocks"]
    assert blocks["blocks"] >= 2 and set(blocks["by_batch"]) == {"1", "2"}
    assert 1 <= blocks["early_stop_iterations"]["xpress_it4_early_stop"] <= 4
    assert blocks["early_stop_iterations"]["xpress_it15_early_stop"] <= 15
    assert 0.0 <= blocks["candidate_agreement_it4"] <= 1.0
    assert {"xpress", "xpress.frozen"} <= set(e2e["candidate"])
    assert os.path.getsize(tmp_path / "e2e-speed.png") > 0
    costs = e2e["step_costs"]
    assert set(costs["target_pass_s"]) == {"1", "2", "4", "8", "16"} and costs["draft_s"] > 0
    assert costs["verify_over_target_step"] == pytest.approx(costs["target_pass_s"]["16"] / costs["target_pass_s"]["1"])
    # break-even tau: a method's time per verification step over the target's time per token
    target_tps = e2e["decode"]["target"]["tokens_per_s"]
    for v in e2e["decode"].values():
        assert v["break_even_tau"] == pytest.approx(v["tau"] * target_tps / v["tokens_per_s"])
    assert e2e["decode"]["target"]["break_even_tau"] == pytest.approx(1.0)
    assert "breaks even at tau" in r.stdout and "one-token passes" in r.stdout


def test_a_cached_stage_is_reused_only_while_its_settings_and_inputs_match(tmp_path, monkeypatch):
    """No silent reuse: a finished stage whose config fields changed, or that was built on an
    earlier upstream stage, stops the run with a one-line error naming what changed."""
    from xpress_jax import cli
    from xpress_jax.reproduce import stages as reproduction
    from xpress_jax.errors import InputError

    ran = []

    def fake_stage(config, run, stage):
        ran.append(stage)
        os.makedirs(os.path.join(run, stage), exist_ok=True)
        return {"step": 1, "steps": 1}

    monkeypatch.setattr(reproduction, "run_stage", fake_stage)
    monkeypatch.setattr(reproduction, "gather", lambda config, run: {})
    monkeypatch.setattr(reproduction, "table", lambda results: "")
    run_dir, first = str(tmp_path / "run"), ["target", "regen", "dflash", "markov"]
    config = cli.with_overrides(SMOKE)
    reproduction.reproduce(config, run_dir, first)
    assert ran == first
    reproduction.reproduce(cli.with_overrides(SMOKE, **{"train.log_every": 3}), run_dir, first)  # cosmetic field
    assert ran == first  # all cache hits
    with pytest.raises(InputError, match=r"markov is finished but it was made with reproduce.head_steps=2 \(now 5\)"):
        reproduction.reproduce(cli.with_overrides(SMOKE, **{"reproduce.head_steps": 5}), run_dir, first)
    with pytest.raises(InputError, match=r"target is finished but it was made with pretrain.steps=.*stages after it "
                                         r"\(regen, dflash, markov\)"):
        reproduction.reproduce(cli.with_overrides(SMOKE, **{"pretrain.steps": 99}), run_dir, first)
    # the user redoes dflash/ only: markov/ was trained on the old one
    shutil.rmtree(os.path.join(run_dir, "dflash"))
    reproduction.reproduce(config, run_dir, ["dflash"])
    with pytest.raises(InputError, match=r"markov is finished but it was built on an earlier dflash/"):
        reproduction.reproduce(config, run_dir, first)
    # a stage that gained a need after it ran is stale (as eval is, once the pipeline gains a method's stage)
    shutil.rmtree(os.path.join(run_dir, "markov"))
    reproduction.reproduce(config, run_dir, ["markov"])
    monkeypatch.setitem(reproduction.NEEDS, "markov", reproduction.NEEDS["markov"] + ("gru",))
    with pytest.raises(InputError, match=r"markov is finished but it was made without gru/"):
        reproduction.reproduce(config, run_dir, ["markov"])


def test_a_resumed_stage_reports_the_wall_time_of_all_its_runs(tmp_path, monkeypatch):
    """A stage interrupted (an exception, or SIGTERM's early stop) and resumed records the sum of
    its runs' times, not only the last run's."""
    import itertools
    import types

    from xpress_jax import cli
    from xpress_jax.reproduce import stages as reproduction

    outcomes = iter([KeyboardInterrupt(), {"step": 3, "steps": 10}, {"step": 10, "steps": 10}])

    def fake_stage(config, run, stage):
        outcome = next(outcomes)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    clock = itertools.count(0.0, 30.0)  # every run of the stage lasts 30 s on this clock
    monkeypatch.setattr(reproduction, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(reproduction, "run_stage", fake_stage)
    monkeypatch.setattr(reproduction, "gather", lambda config, run: {})
    monkeypatch.setattr(reproduction, "table", lambda results: "")
    run_dir, config = str(tmp_path / "run"), cli.with_overrides(SMOKE)
    with pytest.raises(KeyboardInterrupt):
        reproduction.reproduce(config, run_dir, ["target"])
    reproduction.reproduce(config, run_dir, ["target"])  # stops early at step 3
    assert not reproduction.is_done(run_dir, "target")
    reproduction.reproduce(config, run_dir, ["target"])
    with open(os.path.join(run_dir, "target", "DONE.json")) as f:
        assert json.load(f)["seconds"] == 90.0


def test_the_main_job_starts_from_the_shipped_checkpoints_and_notices_when_they_change(tmp_path, monkeypatch):
    """configs/tiny_heads.py ships target/ and dflash/: it runs only regen, its two heads and eval,
    its heads start from the shipped drafter, and heads trained on other shipped weights are stale."""
    from xpress_jax import assets, cli
    from xpress_jax.errors import InputError
    from xpress_jax.reproduce import stages as reproduction

    main = os.path.join(ROOT, "configs", "tiny_heads.py")
    config = cli.with_overrides(main)
    assert reproduction.pipeline(config) == ("regen", "xpress.frozen", "markov", "eval")
    assert reproduction.needs(config, "eval") == ("target", "regen", "dflash", "xpress.frozen", "markov")
    run_dir = str(tmp_path / "run")
    c = reproduction.stage_config(config, run_dir, "markov")
    assert (c.train.init_from, c.target.hf_dir, c.train.trainable) == (assets.TINY_DFLASH, assets.TINY_TARGET, "heads")
    assert [m.checkpoint for m in reproduction.trained_methods(config, run_dir)] == [
        assets.TINY_DFLASH, os.path.join(run_dir, "xpress.frozen", "export"), os.path.join(run_dir, "markov", "export")]

    monkeypatch.setattr(reproduction, "run_stage", lambda config, run, stage: {"step": 1, "steps": 1})
    monkeypatch.setattr(reproduction, "gather", lambda config, run: {})
    monkeypatch.setattr(reproduction, "table", lambda results: "")
    reproduction.reproduce(config, run_dir, ["regen", "markov"])
    with open(os.path.join(run_dir, "markov", "DONE.json")) as f:
        inputs = json.load(f)["inputs"]
    assert inputs["dflash"] == assets.sha256(os.path.join(assets.TINY_DFLASH, "model.safetensors"))[:16]
    with pytest.raises(InputError, match=r"does not run \['target'\] \(shipped"):
        reproduction.reproduce(config, run_dir, ["target"])
    # another drafter in place of the shipped one: the head trained on it is stale
    other = tmp_path / "other_dflash"
    shutil.copytree(assets.TINY_DFLASH, other)
    with open(other / "model.safetensors", "ab") as f:
        f.write(b" ")
    moved = cli.with_overrides(main, **{"reproduce.dflash_from": str(other)})
    with pytest.raises(InputError, match=r"markov is finished but it was built on an earlier dflash/"):
        reproduction.reproduce(moved, run_dir, ["markov"])
    with pytest.raises(InputError, match=r"reproduce.dflash_from=.* is not a checkpoint directory"):
        reproduction.reproduce(cli.with_overrides(main, **{"reproduce.dflash_from": str(tmp_path)}), run_dir)
