"""The command-line tools, run as a user would run them."""

import os

import pytest

from cli_helpers import ROOT, invoke, last_json, run
from xpress_jax.cli import load_config
from xpress_jax.tools.param_count import component_counts


def test_param_count_qwen3_8b():
    counts = component_counts(load_config(os.path.join(ROOT, "configs", "qwen3_8b.py")))
    assert counts["target"] == 8_190_735_360
    assert counts["drafter"] == 1_048_626_432  # 5 x 192,946,432 + fc 83,886,080 + 2 x 4096
    assert abs(counts["xpress_refiner"] - 80.5e6) / 80.5e6 < 0.01
    assert 2.6e6 <= counts["xpress_core"] <= 2.9e6
    assert counts["markov_head"] == 2 * 151_936 * 256
    assert counts["gru_head"] > 0


def test_param_count_cli():
    r = run("xpress_jax.tools.param_count", "--config=configs/qwen3_8b.py")
    assert r.returncode == 0, r.stderr
    assert last_json(r.stdout)["target"] == 8_190_735_360


def test_logit_check_passes_and_fails_by_tolerance(tiny_dirs):
    """On random ids when asked (the tiny directory has no tokenizer); without them, the missing
    tokenizer is refused in one line, not replaced by random ids unasked."""
    r = run("xpress_jax.tools.logit_check", f"--hf_dir={tiny_dirs['untied_gqa2']}", "--random_tokens=32")
    assert r.returncode == 0, r.stderr
    out = last_json(r.stdout)
    assert out["passed"] and out["max_abs_diff"] < 1e-4 and out["kl"] < 1e-8 and out["token_source"] == "random"
    refused = invoke("xpress_jax.tools.logit_check", f"--hf_dir={tiny_dirs['untied_gqa2']}")
    assert refused.returncode == 2 and "has no tokenizer" in refused.stderr and "--random_tokens" in refused.stderr
    strict = invoke("xpress_jax.tools.logit_check", f"--hf_dir={tiny_dirs['untied_gqa2']}", "--random_tokens=32",
                    "--tolerance=1e-12")
    assert strict.returncode == 1 and not last_json(strict.stdout)["passed"]


def test_logit_check_missing_directory(tmp_path):
    r = invoke("xpress_jax.tools.logit_check", f"--hf_dir={tmp_path / 'nope'}")
    assert r.returncode == 2 and "no config.json" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--config.target.bogus=1"], "unknown config key 'target.bogus'"),
    (["--config.nope.x=1"], "unknown config key 'nope'"),
    (["--config=configs/missing.py"], "does not exist"),
    (["--config.sample.max_new_tokens=abc"], "invalid literal"),
    (["--config.target.hf_dir=/no/such/dir"], "no config.json"),
])
def test_cli_reports_bad_config_in_one_line(args, message):
    r = invoke("xpress_jax.sample", *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
