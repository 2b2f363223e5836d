"""The eval command end to end on tiny models, per-method checkpoints, the question sets."""

import json
import os

import numpy as np
import pytest
from flax import nnx

from cli_helpers import invoke, run
from xpress_jax.checkpoints.heads import save_head
from xpress_jax.checkpoints.target_record import write_record
from xpress_jax.data.questions import load_questions


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """Random tiny drafter and heads saved as a checkpoint, evaluated from the command line with
    --check_lossless against each method's own verify pass, DFlash, Markov, XPress and D-Loop + XPress
    at two branches, and an iteration sweep: (checkpoint, out, results.json)."""
    from xpress_jax.models.build import build_models
    from xpress_jax.checkpoints.hf_drafter import save_drafter
    from xpress_jax.cli import DEFAULT_CONFIG, load_config
    tmp_path = tmp_path_factory.mktemp("eval_run")
    config = load_config(DEFAULT_CONFIG)
    target, drafter, heads = build_models(config, "", ("markov", "xpress"))
    ckpt = tmp_path / "ckpt"
    save_drafter(drafter, str(ckpt), dtype=np.float32)
    write_record(config, target.cfg, str(ckpt))  # as an export records its (random) target
    for name, head in heads.items():
        save_head(head, str(ckpt), name)
    out = tmp_path / "eval"
    r = invoke("xpress_jax.eval", f"--checkpoint={ckpt}", "--decoders=dflash,markov,xpress,dloop+xpress",
               "--dloop_branches=2", "--datasets=gsm8k", "--num_prompts=2", "--max_new_tokens=5",
               "--check_lossless", "--config.eval.lossless_reference=verify_pass", f"--out={out}",
               "--config.eval.iteration_sweep=(1, 3)")
    assert r.returncode == 0, r.stderr[-3000:]
    return ckpt, out, json.loads((out / "results.json").read_text())


def test_eval_records_the_checkpoint_it_measured(eval_run):
    ckpt, _, report = eval_run
    assert report["checkpoint"] == str(ckpt) and report["drafter_config"]["architectures"] == ["DFlashDraftModel"]


def test_eval_measures_every_method_on_every_prompt(eval_run):
    _, _, report = eval_run
    for head in ("target", "dflash", "markov", "xpress", "dloop+xpress.b2"):
        r_h = report["results"]["gsm8k"][head]
        assert r_h["n_prompts"] == 2 and r_h["new_tokens"] == 10 and r_h["tokens_per_s"] > 0 and r_h["speedup"] > 0
        # tau pooled and per response, from the same counts the report lists per prompt
        committed, steps = (np.asarray(r_h["per_prompt"][k]) for k in ("committed", "steps"))
        assert steps.sum() == r_h["steps"] and r_h["tau"] == pytest.approx(committed.sum() / steps.sum())
        assert r_h["tau_per_prompt_mean"] == pytest.approx((committed / steps).mean(), abs=1e-4)
    assert report["results"]["gsm8k"]["target"]["tau"] == 1.0  # one token a pass
    xpress = report["results"]["gsm8k"]["xpress"]
    assert len(xpress["accept_per_position"]) == 15
    assert xpress["tau_no_bonus_per_prompt_mean"] == pytest.approx(xpress["tau_per_prompt_mean"] - 1.0, abs=1e-4)


def test_eval_checks_losslessness_against_both_references(eval_run):
    """Against each method's own verify pass with every draft refused, and one-token decoding too:
    the reference decodes again only the answers that differ from target-only decoding's (none
    here, in float32 on a CPU)."""
    _, _, report = eval_run
    rows = report["results"]["gsm8k"]
    assert rows["xpress"]["lossless"] is True and rows["xpress"]["against_target_only"]["mismatches"] == 0
    assert rows["dloop+xpress.b2"]["lossless"] is True
    assert all(rows[m]["reference_reruns"] == 0 for m in ("dflash", "markov", "xpress", "dloop+xpress.b2"))


def test_eval_reports_dloops_prefixes_and_branches(eval_run):
    _, _, report = eval_run
    loop = report["results"]["gsm8k"]["dloop+xpress.b2"]
    assert loop["branches"] == 2 and loop["time_split"]["draft_s"] > 0
    assert 0.0 <= loop["empty_prefix_share"] <= 1.0 and 0.0 <= loop["mean_prefix_kept"] <= 14
    assert "mean_prefix_kept" not in report["results"]["gsm8k"]["xpress"]


def test_eval_measures_repetition_against_the_drafters_own_block(eval_run):
    _, _, report = eval_run
    dflash = report["results"]["gsm8k"]["dflash"]
    assert dflash["drafter_repetition_rate"] == dflash["repetition_rate"]  # its block is the drafter's


def test_eval_splits_a_steps_time_and_sweeps_the_jacobi_iterations(eval_run):
    _, _, report = eval_run
    split = report["results"]["gsm8k"]["xpress"]["time_split"]
    assert set(split) == {"prefill_s", "draft_s", "fold_s", "refine_s", "verify_s"} and split["fold_s"] > 0
    assert set(report["iteration_sweep"]["gsm8k"]["xpress"]) == {"1", "3"}


def test_eval_writes_its_table_and_plots(eval_run):
    _, out, _ = eval_run
    for name in ("results.md", "acceptance.png", "tau_vs_iterations.png"):
        assert os.path.getsize(out / name) > 0


def test_eval_cli_rejects_unknown_head(tmp_path):
    r = invoke("xpress_jax.eval", "--decoders=medusa", f"--out={tmp_path}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "eval.decoders=['medusa']: expected a tuple of decoders from dflash, markov, gru, xpress, dloop" in r.stderr


def test_generate_replaces_assistant_turns_with_the_targets_reply_and_resumes(tmp_path):
    from xpress_jax.models.build import build_target
    from xpress_jax.cli import DEFAULT_CONFIG, load_config
    from xpress_jax.data.byte_tokenizer import ByteTokenizer
    from xpress_jax.data.chat import prompt_ids
    from xpress_jax.decoding.speculative import generate_greedy
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}]},
        {"question": "2+2?", "answer": "4"}]) + "\n")
    args = ("xpress_jax.generate", f"--input={src}", f"--output={tmp_path / 'out'}", "--max_new_tokens=5")
    r = invoke(*args)  # in this process: its 8 devices split the batch (--devices=0, all of them)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in open(tmp_path / "out" / "data.jsonl")]
    assert [row["id"] for row in rows] == ["a", "1"]
    tok = ByteTokenizer(512)
    target = build_target(load_config(DEFAULT_CONFIG))
    stops = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    expect = generate_greedy(target, [prompt_ids(tok, [{"role": "user", "content": "hi"}])], max_new_tokens=5,
                             stop_ids=stops).tokens[0]
    assert rows[0]["conversations"][1]["content"] == tok.decode(expect, skip_special_tokens=True)
    again = run(*args)  # the entry point, one device
    assert again.returncode == 0 and "2 already regenerated, 0 to go" in again.stderr
    assert len(open(tmp_path / "out" / "data.jsonl").readlines()) == 2
    # the target split over 4 devices instead of the batch: the same replies
    split = invoke("xpress_jax.generate", f"--input={src}", f"--output={tmp_path / 'split'}", "--max_new_tokens=5",
                   "--tensor_parallel=4")
    assert split.returncode == 0, split.stderr[-2000:]
    assert [json.loads(line) for line in open(tmp_path / "split" / "data.jsonl")] == rows
    both = invoke("xpress_jax.generate", f"--input={src}", f"--output={tmp_path / 'both'}", "--tensor_parallel=2",
                  "--devices=2")
    assert both.returncode == 2 and "choose one" in both.stderr and "Traceback" not in both.stderr


def test_checkpoints_per_method_are_parsed_into_labelled_methods(tmp_path):
    from xpress_jax.errors import InputError
    from xpress_jax.eval.evaluate import Method, parse_methods
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "config.json").write_text("{}")  # parsing reads no further
    assert parse_methods([f"dflash={a}", f"xpress.frozen={b}", f"xpress={a}"], [], "") == [
        Method("dflash", "dflash", str(a)), Method("xpress.frozen", "xpress", str(b)), Method("xpress", "xpress", str(a))]
    assert parse_methods(None, ["dflash", "markov"], str(a)) == [Method("dflash", "dflash", str(a)),
                                                                 Method("markov", "markov", str(a))]
    # D-Loop methods once per K; K = 1 keeps the label
    assert parse_methods([f"dloop={a}", f"dflash={a}"], [], "", branches=(1, 4)) == [
        Method("dloop", "dloop", str(a), 1), Method("dloop.b4", "dloop", str(a), 4), Method("dflash", "dflash", str(a))]
    assert parse_methods(None, ["dloop+xpress"], str(a), branches=(2,)) == [
        Method("dloop+xpress.b2", "dloop+xpress", str(a), 2)]
    with pytest.raises(InputError, match="dloop_branches must be positive"):
        parse_methods([f"dloop={a}"], [], "", branches=(0,))
    with pytest.raises(InputError, match="labels repeat"):
        parse_methods([f"dloop={a}", f"dloop.b2={b}"], [], "", branches=(1, 2))
    for bad, message in (([f"medusa={a}"], "'medusa' is not a decoder"), (["dflash"], "expected LABEL=DIR"),
                         ([f"dflash={tmp_path / 'nope'}"], "does not exist"),
                         ([f"dflash={a}", f"dflash={b}"], "repeats a label")):
        with pytest.raises(InputError, match=message):
            parse_methods(bad, [], "")


def test_eval_cli_refuses_a_bad_checkpoints_flag(tmp_path):
    r = invoke("xpress_jax.eval", f"--checkpoints=target={tmp_path}", f"--out={tmp_path / 'o'}")
    assert r.returncode == 2 and "'target' is not a decoder" in r.stderr and "Traceback" not in r.stderr
    heads_only = tmp_path / "heads_only"  # D-Loop runs the drafter twice: heads alone are not enough
    (heads_only / "heads").mkdir(parents=True)
    (heads_only / "heads" / "xpress.safetensors").write_bytes(b"")
    r = invoke("xpress_jax.eval", f"--checkpoints=dloop={heads_only}", f"--out={tmp_path / 'o'}")
    assert r.returncode == 2 and "no config.json (expected a DFlash drafter directory)" in r.stderr
    assert "Traceback" not in r.stderr
    r = invoke("xpress_jax.eval", "--decoders=dloop", "--dloop_branches=two", f"--out={tmp_path / 'o'}")
    assert r.returncode == 2 and "--dloop_branches: expected integers" in r.stderr and "Traceback" not in r.stderr


def test_the_eval_target_of_the_8b_config_is_held_in_bf16():
    """Eval, generate and sample build the target as training does: target_param_dtype (bf16),
    not the float32 of the trained parts (16.4 GB instead of 32.8 GB for Qwen3-8B)."""
    import math
    from xpress_jax.models.build import build_target
    from xpress_jax.cli import config_path, load_config
    config = load_config(config_path("qwen3_8b.py"))
    target = nnx.eval_shape(lambda: build_target(config))
    params = [v for _, v in nnx.to_flat_state(nnx.state(target, nnx.Param))]
    assert {str(v.dtype) for v in params} == {"bfloat16"}
    gb = sum(math.prod(v.shape) * 2 for v in params) / 1e9
    print(f"Qwen3-8B target held for eval: {gb:.1f} GB")
    assert 16.0 < gb < 16.8


def test_an_export_is_evaluated_from_its_directory_alone(tmp_path):
    """The shipped drafter with its XPress refiner (rank 64) under configs/tiny.py, whose heads have
    rank 32 and whose drafter differs: the checkpoint's own shapes are used, and the methods
    measured are the ones it holds (no Markov or GRU head in it, so none asked for). The drafter
    and head are held in bf16 (eval.drafter_dtype)."""
    import shutil
    from xpress_jax import assets
    ckpt = tmp_path / "ckpt"
    shutil.copytree(assets.TINY_DFLASH, ckpt)
    shutil.copytree(os.path.join(assets.TINY_XPRESS_HEADS, "heads"), ckpt / "heads")
    out = tmp_path / "eval"
    r = invoke("xpress_jax.eval", f"--config.target.hf_dir={assets.TINY_TARGET}", f"--checkpoint={ckpt}",
               "--datasets=gsm8k", "--num_prompts=2", "--max_new_tokens=8", "--check_lossless", f"--out={out}",
               "--config.eval.iteration_sweep=()", "--config.eval.drafter_dtype=bfloat16")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert set(report["results"]["gsm8k"]) == {"target", "dflash", "xpress"}
    # served as people serve it: the drafter and its head in bf16, named beside the speedups; still lossless
    assert report["dtypes"] == {"target": "float32", "target_compute": "float32", "drafter_and_heads": "bfloat16"}
    assert (out / "results.md").read_text().startswith("Target weights in float32 (compute float32); drafter and "
                                                       "heads in bfloat16")
    assert report["results"]["gsm8k"]["xpress"]["lossless"] is True
    assert report["examples"]["gsm8k"]["answer"] and report["examples"]["gsm8k"]["target_passes"]["target"] >= 1
    r = invoke("xpress_jax.eval", f"--config.target.hf_dir={assets.TINY_TARGET}", f"--checkpoint={ckpt}",
               "--config.heads.rank=32", f"--out={tmp_path / 'e2'}")
    assert r.returncode == 2 and "--config.heads.rank=32 but" in r.stderr and "has rank=64" in r.stderr


def test_eval_holds_the_drafter_and_heads_in_the_dtype_asked():
    import jax
    from flax import nnx
    from xpress_jax import assets
    from xpress_jax.cli import DEFAULT_CONFIG, with_overrides
    from xpress_jax.eval.evaluate import Method, build_methods
    config = with_overrides(DEFAULT_CONFIG, **{"target.hf_dir": assets.TINY_TARGET})
    for name in ("bfloat16", "float32"):
        target, models = build_methods(config, [Method("dflash", "dflash", assets.TINY_DFLASH)], name)
        dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(models["dflash"].drafter, nnx.Param))}
        assert dtypes == {jax.numpy.dtype(name)}
        assert {x.dtype for x in jax.tree.leaves(nnx.state(target, nnx.Param))} == {jax.numpy.dtype("float32")}


def test_eval_can_split_the_target_over_devices_and_decodes_the_same_tokens():
    """eval.tensor_parallel=4: the shipped target's heads, MLP width and vocabulary split over 4
    devices, the drafter replicated there; DFlash decodes the tokens it decodes on one device. A
    split the target cannot take is refused before any weight is read."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P
    from xpress_jax import assets
    from xpress_jax.cli import DEFAULT_CONFIG, with_overrides
    from xpress_jax.decoding.speculative import generate
    from xpress_jax.errors import ConfigError
    from xpress_jax.eval.evaluate import Method, build_methods
    config = with_overrides(DEFAULT_CONFIG, **{"target.hf_dir": assets.TINY_TARGET})
    methods = [Method("dflash", "dflash", assets.TINY_DFLASH)]
    _, whole = build_methods(config, methods, "float32")
    target, split = build_methods(config, methods, "float32", tensor_parallel=4)
    assert target.embed_tokens[...].sharding.spec == P("tensor", None)
    assert split["dflash"].drafter.fc[...].sharding.is_fully_replicated
    assert len(split["dflash"].drafter.fc[...].sharding.device_set) == 4
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 2000, n).tolist() for n in (12, 30)]
    a = generate(whole["dflash"], prompts, max_new_tokens=32)
    b = generate(split["dflash"], prompts, max_new_tokens=32)
    assert a.tokens == b.tokens and a.stats["steps"].tolist() == b.stats["steps"].tolist()
    with pytest.raises(ConfigError, match=r"num_attention_heads=4 does not split over tensor=3"):
        build_methods(config, methods, "float32", tensor_parallel=3)
    with pytest.raises(ConfigError, match=rf"over 16 devices: this process has {jax.local_device_count()}"):
        build_methods(config, methods, "float32", tensor_parallel=16)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_the_lossless_check_names_each_divergence_with_the_targets_margin(param_dtype):
    """Greedy outputs against target-only decoding: identical outputs pass; a differing one is
    counted, located at its first differing token, and given the target's top-1 minus top-2 logit
    there, from a forward pass over the prompt and the agreed tokens (bf16 targets too)."""
    import jax
    import jax.numpy as jnp
    from compiled import jit_call
    from flax import nnx
    from spec_fixtures import redraw, target_config
    from xpress_jax.decoding.speculative import generate_greedy
    from xpress_jax.eval.evaluate import lossless_check
    from xpress_jax.models.qwen3 import Qwen3
    dtype = jnp.dtype(param_dtype)
    target = redraw(Qwen3(target_config(), rngs=nnx.Rngs(0), dtype=dtype, param_dtype=dtype), 0)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    base = generate_greedy(target, prompts, max_new_tokens=8).tokens
    same = lossless_check(target, prompts, base, base)
    assert same == {"mismatches": 0, "mismatch_rate": 0.0, "lossless": True, "first_divergences": []}
    changed = [base[0], base[1][:5] + [(base[1][5] + 1) % 48] + base[1][6:]]
    report = lossless_check(target, prompts, changed, base)
    assert report["mismatches"] == 1 and report["mismatch_rate"] == 0.5 and report["lossless"] is False
    (d,) = report["first_divergences"]
    assert (d["prompt"], d["position"]) == (1, 5)
    logits = jit_call(target, jnp.asarray([prompts[1] + base[1][:5]])).logits[0, -1].astype(jnp.float32)
    top = jax.lax.top_k(logits, 2)[0]
    # the check's pass pads the sequence to its prompt bucket: the same logits up to float32 rounding
    assert d["target_margin"] == pytest.approx(float(top[0] - top[1]), abs=1e-5) and d["target_margin"] >= 0


def test_the_verify_pass_reference_is_exact_in_bf16():
    """The shipped tiny target and DFlash drafter. The method's own loop with every draft refused
    (reject_drafts) commits one target token a step, read from row 0 of the same verification
    pass: in f32 it is one-token target-only decoding token for token; in bf16 it is the method's
    output token for token, at an acceptance where rows past 0 decide most tokens. One-token
    decoding runs other matmul shapes, and where it parts from the method in bf16 it is at a
    near-tie of the target (on this CPU: 3 of these 8 prompts, margins below 0.04)."""
    import jax.numpy as jnp
    from xpress_jax import assets
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
    from xpress_jax.data.chat import load_tokenizer, prompt_ids
    from xpress_jax.decoding.speculative import DecodingModels, generate
    from xpress_jax.errors import InputError
    from xpress_jax.eval.evaluate import lossless_check
    tok = load_tokenizer(assets.TINY_TARGET)
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    prompts = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in load_questions("gsm8k", 16)[8:]]
    kw = dict(max_new_tokens=64, stop_ids=stops, pad_multiple=64)

    def models(dtype):
        target = load_qwen3(assets.TINY_TARGET, dtype=dtype, param_dtype=dtype)
        return DecodingModels(target, load_drafter(assets.TINY_DFLASH, dtype=dtype, param_dtype=dtype))

    f32 = models(jnp.float32)
    reference = generate(f32, prompts[:4], decoder="dflash", reject_drafts=True, **kw)
    assert (reference.stats["committed"] == reference.stats["steps"]).all()  # one token a step
    assert reference.tokens == generate(DecodingModels(f32.target), prompts[:4], decoder="target", **kw).tokens

    bf16 = models(jnp.bfloat16)
    method = generate(bf16, prompts, decoder="dflash", **kw)
    reference = generate(bf16, prompts, decoder="dflash", reject_drafts=True, **kw)
    assert method.tau > 1.5 and reference.tokens == method.tokens
    one_token = generate(DecodingModels(bf16.target), prompts, decoder="target", **kw).tokens
    report = lossless_check(bf16.target, prompts, method.tokens, one_token)
    assert all(d["target_margin"] < 0.25 for d in report["first_divergences"]), report
    with pytest.raises(InputError, match="reject_drafts is a greedy reference"):
        generate(bf16, prompts[:1], decoder="dflash", reject_drafts=True, temperature=1.0, **kw)


def test_a_drafter_whose_target_layers_repeat_trains_exports_and_evaluates_losslessly(tmp_path):
    """DFlash's spacing rule on a 6-layer target with the 8B recipe's 5 drafter layers and 16-token
    block reads target layers 1, 2, 2, 2, 3: the drafter trains on them, exports, and evaluates
    with the same taps, lossless against target-only decoding."""
    from cli_helpers import invoke
    from train_helpers import override_args
    from xpress_jax.models.drafter import default_target_layer_ids
    assert default_target_layer_ids(6, 5) == [1, 2, 2, 2, 3]
    shape = {"target.arch.num_hidden_layers": "6", "drafter.num_layers": "5", "drafter.block_size": "16",
             "drafter.target_layer_ids": "()",  # DFlash's spacing rule
             "data.max_len": "128"}
    run_dir = tmp_path / "run"
    r = invoke("xpress_jax.train", *override_args(run_dir, **shape, **{
        "train.steps": "2", "train.save_every": "2", "train.async_checkpointing": "false", "train.heads": "()"}))
    assert r.returncode == 0, r.stderr[-3000:]
    export = json.loads((run_dir / "export" / "config.json").read_text())
    assert export["dflash_config"]["target_layer_ids"] == [1, 2, 2, 2, 3]
    out = tmp_path / "eval"
    r = invoke("xpress_jax.eval", *override_args(run_dir, **shape), f"--checkpoint={run_dir / 'export'}",
               "--decoders=dflash", "--datasets=gsm8k", "--num_prompts=2", "--max_new_tokens=24",
               "--check_lossless", "--config.eval.iteration_sweep=()", f"--out={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())["results"]["gsm8k"]
    assert results["dflash"]["lossless"] is True
    assert results["dflash"]["new_tokens"] == results["target"]["new_tokens"] > 0


def test_the_recipes_prompt_lengths_pad_to_the_longest_prompts_bucket_and_decode_losslessly(tmp_path):
    """The 8B recipe's prompt lengths at tiny width: one set with prompts of 100, 530, 700, 960 and
    2,000 tokens. Every prompt is padded to the longest's bucket (2,048: whole prefill chunks of
    512), never to a common multiple of bucket and chunk, and DFlash's tokens equal target-only
    decoding's (the 2,048-token answers: tests/test_speculative.py)."""
    from xpress_jax.checkpoints.hf_drafter import save_drafter
    from xpress_jax.cli import DEFAULT_CONFIG, load_config
    from xpress_jax.decoding.padding import bucket_length, shared_length
    from xpress_jax.eval.evaluate import encode_prompts
    from xpress_jax.models.build import build_models
    for longest, bucket in ((530, 1024), (700, 1024), (960, 1024), (2000, 2048)):  # one bucket, at most
        shared = shared_length([100, longest], 512)
        assert shared == bucket and {bucket_length(n, shared, 512) for n in (100, longest)} == {bucket}
    config = load_config(DEFAULT_CONFIG)
    overhead = len(encode_prompts(config, ["x"], 10_000)[0][0]) - 1  # the chat template's tokens
    lengths = (100, 530, 700, 960, 2000)
    questions = tmp_path / "lengths.jsonl"
    questions.write_text("".join(json.dumps({"turns": ["x" * (n - overhead)]}) + "\n" for n in lengths))
    prompts = encode_prompts(config, [json.loads(line)["turns"][0] for line in questions.read_text().splitlines()],
                             10_000)[0]
    assert [len(p) for p in prompts] == list(lengths)
    target, drafter, _ = build_models(config, "", ())
    save_drafter(drafter, str(tmp_path / "ckpt"), dtype=np.float32)
    write_record(config, target.cfg, str(tmp_path / "ckpt"))
    out = tmp_path / "eval"
    r = invoke("xpress_jax.eval", f"--checkpoint={tmp_path / 'ckpt'}", "--decoders=dflash", f"--datasets={questions}",
               "--num_prompts=5", "--max_new_tokens=32", "--check_lossless", "--config.eval.max_prompt_tokens=2048",
               "--config.eval.batch_size=5", "--config.eval.iteration_sweep=()", f"--out={out}")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["padded_prompt_length"] == 2048
    rows = report["results"][str(questions)]
    assert rows["dflash"]["n_prompts"] == 5 and rows["dflash"]["lossless"] is True
    assert rows["dflash"]["new_tokens"] == rows["target"]["new_tokens"] == 5 * 32


def test_the_lossless_reference_follows_the_arithmetic_of_the_run(monkeypatch):
    """eval.lossless_reference=auto: one-token target-only decoding where it rounds as the verify
    pass does (float32 on a CPU); the method's own verify pass in bf16, and in float32 on a GPU,
    whose float32 matmuls run in TF32 by default. An explicit choice is kept."""
    import jax
    import jax.numpy as jnp
    from xpress_jax.eval.evaluate import lossless_reference
    assert lossless_reference("auto", jnp.float32) == "target_only"
    assert lossless_reference("auto", jnp.bfloat16) == "verify_pass"
    assert lossless_reference("target_only", jnp.bfloat16) == "target_only"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert lossless_reference("auto", jnp.float32) == "verify_pass"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_off_by_one_commit_fails_the_lossless_check(monkeypatch, dtype):
    """The negative control: the shipped tiny target and drafter with an acceptance rule that
    commits one draft token more than the target verified. Against the verify-pass reference (its
    loop offers no draft to the rule, so the bug cannot reach it; computed once, with the rule as
    it is) the check fails, in float32 and in bf16; with the rule as it is, the same check passes."""
    import functools

    import jax
    import jax.numpy as jnp
    from xpress_jax import assets
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
    from xpress_jax.data.chat import load_tokenizer, prompt_ids
    from xpress_jax.decoding import speculative
    from xpress_jax.decoding.verify import greedy_accept
    from xpress_jax.eval.evaluate import lossless_check
    tok = load_tokenizer(assets.TINY_TARGET)
    prompts = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in load_questions("gsm8k", 2)]
    dt = jnp.dtype(dtype)
    models = speculative.DecodingModels(load_qwen3(assets.TINY_TARGET, dtype=dt, param_dtype=dt),
                                    load_drafter(assets.TINY_DFLASH, dtype=dt, param_dtype=dt))
    kw = dict(max_new_tokens=32, pad_multiple=64)

    def off_by_one(draft, target_logits):  # [batch, n], [batch, n+1, vocab]
        acc, _ = greedy_accept(draft, target_logits)
        acc = jnp.minimum(acc + 1, draft.shape[1])
        return acc, jnp.take_along_axis(jnp.argmax(target_logits, -1), acc[:, None], axis=1)[:, 0].astype(jnp.int32)

    reference = speculative.generate(models, prompts, reject_drafts=True, **kw).tokens  # no draft reaches the rule

    def check():
        return lossless_check(models.target, prompts, speculative.generate(models, prompts, **kw).tokens, reference)

    assert check()["lossless"] is True
    # the loop is traced anew with the bug under a jit of its own (a new callable, so no trace is
    # shared); every other compiled program of the session stays cached
    monkeypatch.setattr(speculative, "greedy_accept", off_by_one)
    monkeypatch.setattr(speculative, "_decode", jax.jit(functools.partial(speculative._decode_loop),
                                                        static_argnames=("graphdef", "opts")))
    try:
        report = check()
    finally:
        monkeypatch.undo()
    assert report["lossless"] is False and report["mismatches"] >= 1, report
