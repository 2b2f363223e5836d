"""The paired bootstrap of tau ratios: exact at the edges, and its 95% interval covers the true
ratio about 95% of the time on data drawn from a known model."""

import numpy as np
import pytest

from xpress_jax.eval.metrics import compare_to_reference
from xpress_jax.eval.report import markdown
from xpress_jax.report.significance import paired_tau_ratio


def test_a_method_equal_to_its_reference_has_ratio_one_and_no_spread():
    c, s = np.array([30, 50, 20]), np.array([15, 20, 12])
    assert paired_tau_ratio(c, s, c, s) == {"ratio": 1.0, "ci95": [1.0, 1.0]}


def test_the_ratio_is_of_taus_over_all_steps():
    r = paired_tau_ratio([40, 60], [10, 20], [30, 30], [15, 15])
    assert r["ratio"] == pytest.approx((100 / 30) / (60 / 30), abs=1e-4)
    assert r["ci95"][0] <= r["ratio"] <= r["ci95"][1]


def test_mismatched_or_empty_prompts_are_refused():
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired_tau_ratio([1, 2], [1, 1], [1], [1])
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired_tau_ratio([], [], [], [])


def _prompts(rng, n, gain):
    """n prompts: each has its own difficulty (shared by both methods, so the pairing matters);
    the method commits `gain` times the reference's tokens per step, plus noise."""
    steps = rng.integers(40, 120, n)
    base_tau = rng.uniform(1.5, 3.0, n)  # [n_prompts]
    ref = np.round(steps * base_tau)
    method = np.round(steps * base_tau * gain * rng.lognormal(0.0, 0.08, n))
    return method, steps, ref, steps


def test_the_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    gain, trials, covered = 1.1, 200, 0
    for t in range(trials):
        r = paired_tau_ratio(*_prompts(rng, 16, gain), replicates=500, seed=t)
        covered += r["ci95"][0] <= gain <= r["ci95"][1]
    # the percentile bootstrap runs a little narrow at n = 16; 200 trials give a binomial sd of 1.5%
    assert 0.85 <= covered / trials <= 0.99


def test_a_real_gain_is_told_from_noise_on_16_prompts():
    rng = np.random.default_rng(2)
    gained = paired_tau_ratio(*_prompts(rng, 16, 1.15))
    assert gained["ci95"][0] > 1.0
    same = paired_tau_ratio(*_prompts(rng, 16, 1.0))
    assert same["ci95"][0] < 1.0 < same["ci95"][1]


def test_eval_rows_gain_a_comparison_against_dflash_and_the_table_shows_it():
    def row(committed, steps):
        return {"tau": sum(committed) / sum(steps), "tau_per_prompt_mean": 1.0, "repetition_rate": None,
                "tokens_per_s": 1.0, "speedup": 1.0, "lossless": True,
                "per_prompt": {"committed": committed, "steps": steps}}
    rows = {"target": row([10, 10], [10, 10]), "markov": row([30, 44], [10, 20]), "dflash": row([20, 40], [10, 20])}
    compare_to_reference(rows)
    assert "tau_vs_reference" not in rows["dflash"] and "tau_vs_reference" not in rows["target"]
    assert rows["markov"]["tau_vs_reference"]["reference"] == "dflash"
    assert rows["markov"]["tau_vs_reference"]["ratio"] == pytest.approx((74 / 30) / (60 / 30), abs=1e-4)
    table = markdown({"gsm8k": rows})
    assert "| gsm8k | markov | dflash | 1.233 |" in table
