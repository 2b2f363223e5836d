"""`python -m xpress_jax.sample`: any decoder's answer to a prompt, as text with its trace."""

import json
import os
import shutil

import pytest

from cli_helpers import invoke, last_json, run
from xpress_jax import assets


def test_sample_runs_on_the_tiny_default():
    r = run("xpress_jax.sample", "--max_new_tokens=5", "--json")
    assert r.returncode == 0, r.stderr
    out = last_json(r.stdout)
    assert out["decoder"] == "target" and len(out["tokens"]) == 5 and out["per_step"] == [1] * 4


def test_sample_on_a_target_with_a_tokenizer(tmp_path, qwen3_tokenizer_dir):
    from conftest import make_hf_qwen3
    ckpt = make_hf_qwen3(str(tmp_path / "ckpt"), vocab_size=151936, num_layers=1, hidden_size=16,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    for f in os.listdir(qwen3_tokenizer_dir):
        shutil.copy(os.path.join(qwen3_tokenizer_dir, f), ckpt)
    r = invoke("xpress_jax.sample", "--max_new_tokens=3", f"--config.target.hf_dir={ckpt}", "--json")
    assert r.returncode == 0, r.stderr
    out = last_json(r.stdout)
    assert out["prompt_tokens"] > 10 and isinstance(out["text"], str)


@pytest.fixture(scope="module")
def every_head(tmp_path_factory):
    """The shipped tiny drafter (which records its target) with the shipped XPress refiner and
    random Markov and GRU heads beside it."""
    from xpress_jax.checkpoints.heads import save_head
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    from xpress_jax.cli import DEFAULT_CONFIG, load_config
    from xpress_jax.models.build import new_head
    ckpt = tmp_path_factory.mktemp("sample") / "ckpt"
    shutil.copytree(assets.TINY_DFLASH, ckpt)
    shutil.copytree(os.path.join(assets.TINY_XPRESS_HEADS, "heads"), ckpt / "heads")
    config = load_config(DEFAULT_CONFIG)
    for name in ("markov", "gru"):
        save_head(new_head(name, config, load_drafter(str(ckpt)).cfg), str(ckpt), name)
    return ckpt


@pytest.mark.parametrize("decoder", ["dflash", "markov", "gru", "xpress", "dloop"])
def test_every_decoder_answers_as_the_target_does_with_its_trace(every_head, decoder):
    """Greedy: each decoder's answer is the target's own, token for token; the trace's pieces are
    the answer cut at each target pass, and the text output shows the summary and the trace."""
    common = (f"--checkpoint={every_head}", "--prompt=Natalia sold 48 clips in April. How many in May?",
              "--max_new_tokens=24")
    target = last_json(invoke("xpress_jax.sample", *common, "--decoder=target", "--json").stdout)
    r = invoke("xpress_jax.sample", *common, f"--decoder={decoder}", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = last_json(r.stdout)
    assert out["tokens"] == target["tokens"] and out["text"] == target["text"] and out["decoder"] == decoder
    assert "recorded in" in r.stderr  # the target the drafter records, since none was given
    assert len(out["pieces"]) == out["steps"] + 1 and sum(out["per_step"]) == len(out["tokens"]) - 1
    assert "".join(out["pieces"]).startswith(out["text"])  # (then a stop token, which the text leaves out)
    assert out["tau"] == pytest.approx(sum(out["per_step"]) / out["steps"], abs=1e-3)
    if decoder in ("dflash", "xpress"):  # the trained drafter and refiner: some passes commit several tokens
        assert out["tau"] > 1.1 and max(out["per_step"]) > 2, out["per_step"]
    text = invoke("xpress_jax.sample", *common, f"--decoder={decoder}").stdout
    assert f"{decoder}: {len(out['tokens'])} tokens" in text and "trace (prefill [" in text
    assert " ".join(f"[{p}]" for p in out["pieces"][1:]).replace("\n", "\\n") in text


def test_prompts_from_a_question_file_one_answer_each(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("What is 7 * 6?", "Name a colour.")))
    r = invoke("xpress_jax.sample", f"--checkpoint={assets.TINY_DFLASH}", f"--prompts={questions}",
               "--max_new_tokens=6", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == ["What is 7 * 6?", "Name a colour."]


@pytest.mark.parametrize("args, message", [
    (["--decoder=beam"], "--decoder=beam: choose target or one of"),
    (["--prompt=hi", "--prompts=q.jsonl"], "--prompt and --prompts: choose one"),
    (["--prompt= "], "--prompt: empty"),
    (["--checkpoint=/no/such/dir"], "--checkpoint: directory '/no/such/dir' does not exist"),
    (["--temperature=-1"], "expected >= 0"),
])
def test_bad_input_is_one_line(args, message):
    r = invoke("xpress_jax.sample", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_run_directory_given_as_a_checkpoint_points_to_its_export(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(assets.TINY_DFLASH, run_dir / "export")
    (run_dir / "config.json").write_text(json.dumps({"seed": 0}))  # a run's own config
    for command in ("xpress_jax.sample", "xpress_jax.eval"):
        r = invoke(command, f"--checkpoint={run_dir}", f"--config.eval.out_dir={tmp_path / 'e'}")
        assert r.returncode == 2 and f"is a training run; its drafter and heads are in {run_dir / 'export'}" \
            in r.stderr, r.stderr
