"""The papers' figures beside a run's: recognised by the target's shape, shown per row and as
means in eval's results.md, as a ratio in compare's table, and as a curve in the sweep's plot."""

from xpress_jax.cli import load_config
from xpress_jax.eval.report import report_markdown, write_outputs
from xpress_jax.compare.pairing import markdown as compare_markdown
from xpress_jax.models.build import target_config
from xpress_jax.report import published


def _row(tau, speedup=None):
    return {"tau": tau + 0.5, "tau_per_prompt_mean": tau, "tau_no_bonus_per_prompt_mean": tau - 1,
            "repetition_rate": None, "tokens_per_s": 10.0, "speedup": speedup, "speedup_harness": speedup,
            "lossless": None, "accept_per_position": [0.9, 0.7]}


def _report(target, temperature=0.0):
    rows = {"target": _row(1.0, 1.0), "dflash": _row(5.0, 4.0), "markov": _row(6.0, 4.5),
            "xpress": _row(6.6, 5.0), "dloop.b4": _row(7.0, 5.2)}
    return {"published_target": target, "settings": {"temperature": temperature},
            "methods": {"dflash": {"decoder": "dflash"}, "markov": {"decoder": "markov"},
                        "xpress": {"decoder": "xpress"}, "dloop.b4": {"decoder": "dloop", "branches": 4}},
            "results": {"gsm8k": rows, "livecodebench": {k: dict(v) for k, v in rows.items()}},
            "iteration_sweep": {"gsm8k": {"xpress": {"1": 6.0, "4": 6.5, "8": 6.6}}}}


def test_the_published_targets_are_recognised_by_their_shape():
    assert published.target_name(target_config(load_config("configs/qwen3_8b.py"))) == "Qwen3-8B"
    assert published.target_name(target_config(load_config("configs/qwen3_4b.py"))) == "Qwen3-4B"
    assert published.target_name(target_config(load_config("configs/tiny.py"))) is None


def test_results_md_sets_the_papers_figures_beside_the_runs(tmp_path):
    text = report_markdown(_report("Qwen3-8B"))
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in text.splitlines() if line.startswith("|")}
    assert rows[("gsm8k", "dflash")].rstrip("| ").endswith("5.20x")  # the DFlash authors' GSM8K speedup
    assert rows[("gsm8k", "xpress")].rstrip("| ").endswith("8.20x")
    assert rows[("livecodebench", "xpress")].rstrip("| ").endswith("tau_no_bonus_vs_markov 1.07")
    assert rows[("livecodebench", "dflash")].rstrip("| ").endswith("| -")
    # the papers' means beside no run mean: their benchmark sets are not all named, so no run measured the same
    assert "| dloop.b4 | tau | 8.11 | - | 6, not named in the text |" in text  # D-Loop's K unstated: any K's row
    assert "| xpress | tau_no_bonus_vs_markov | 1.05 | - | 7, not all named in the text |" in text
    at_t1 = report_markdown(_report("Qwen3-8B", temperature=1.0))
    assert "| dloop.b4 | tau | 6.37 |" in at_t1 and "tau_no_bonus_vs_markov" not in at_t1  # XPress: T = 0 only
    for other in (_report(None), _report("Qwen3-8B", temperature=0.5)):
        assert "published" not in report_markdown(other)
    write_outputs(_report("Qwen3-8B"), str(tmp_path))  # the sweep's plot with the paper's plateau beside it
    assert (tmp_path / "tau_vs_iterations.png").stat().st_size > 0


def test_compare_shows_the_papers_ratio_of_the_same_two_methods():
    method, reference = _report("Qwen3-8B"), _report("Qwen3-8B")
    ratio = {ds: {"tau": 6.6, "tau_reference": 6.0, "ratio": 1.1, "ci95": [1.0, 1.2],
                  "published_ratio": published.ratio_cell(method, "xpress", reference, "markov", ds)}
             for ds in ("gsm8k", "livecodebench")}
    assert ratio["livecodebench"]["published_ratio"] == "1.07 (no bonus)"
    assert ratio["gsm8k"]["published_ratio"] == "1.05 (mean, no bonus)"
    assert "| published ratio |" in compare_markdown(ratio, "xpress", "markov")
    assert published.ratio_cell(_report(None), "xpress", _report(None), "markov", "gsm8k") == "-"
    assert published.ratio_cell(method, "xpress", _report("Qwen3-4B"), "markov", "gsm8k") == "-"


def test_a_mean_is_set_beside_the_runs_only_over_the_benchmarks_it_names(monkeypatch):
    """The run's figure of the same definition: the harness's tau and speedup, XPress's ratios of
    tau without the bonus token (here (5.6 - 1) / (6.0 - 1) = 0.92, not 5.6 / 6.0)."""
    named = published.Figure("Qwen3-8B", "xpress", "tau_no_bonus_vs_markov", 0.0, published.MEAN, 1.05, "test",
                             benchmarks=("gsm8k", "livecodebench"))
    report = _report("Qwen3-8B")
    for by_label in report["results"].values():
        by_label["xpress"] = _row(5.6, 5.0)
    assert published.means_table(report, [named])[0][:4] == ["xpress", "tau_no_bonus_vs_markov", "1.05", "0.92"]
    named_other = published.Figure("Qwen3-8B", "xpress", "tau", 0.0, published.MEAN, 6.0, "test", benchmarks=("gsm8k",))
    assert published.means_table(report, [named_other])[0][3] == "-"  # the run measured two benchmarks, not one
