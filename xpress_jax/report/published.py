"""The figures the papers publish, as data with their source, to set beside a run's.

Only what the papers' text states is carried: the D-Loop paper's Table 5 means and XPress's
end-to-end speedups and acceptance ratios, plus the DFlash authors' published speedups and
acceptance lengths that those papers build on. The per-benchmark tables of both papers are figures
in their PDFs and are not carried here (their text gives no per-benchmark acceptance lengths);
D-Loop's Qwen3-4B results are in those tables only. A figure is shown when the run's target has
the published model's shape (`target_name`), and only beside the run's figure of the same definition
(`METRICS`); a mean is set beside the run's only over the same benchmarks, which the papers' text
names for none of these means, so those rows show the published value alone.
"""

from __future__ import annotations

import dataclasses

# the published targets by their shape: (layers, hidden, intermediate, vocabulary)
TARGETS = {(36, 4096, 12288, 151936): "Qwen3-8B", (36, 2560, 9728, 151936): "Qwen3-4B"}

MEAN = "mean"  # a figure over the paper's own benchmark set, not one dataset

# a figure's metric -> the run's figure of the same definition (eval/metrics.py)
METRICS = {
    "tau": "tau_per_prompt_mean",  # mean over responses, bonus token included (the DFlash harness's)
    "speedup": "speedup_harness",  # mean decode seconds per token, target-only's over the method's
    # XPress's tau counts accepted drafts only (no bonus token); its ratios are of that tau
    "tau_no_bonus_vs_dflash": "tau_no_bonus_per_prompt_mean",
    "tau_no_bonus_vs_markov": "tau_no_bonus_per_prompt_mean",
}


@dataclasses.dataclass(frozen=True)
class Figure:
    target: str  # "Qwen3-8B"
    method: str  # the decoder as eval names it: dflash, markov, xpress, dloop (at `branches`)
    metric: str  # a key of METRICS (tau_no_bonus_vs_X: a ratio of two methods' tau without the bonus)
    temperature: float
    dataset: str  # a benchmark name as eval labels it, or MEAN
    value: float
    source: str
    branches: int | None = 1  # D-Loop's K; None: the text does not state it (any K's row)
    benchmarks: tuple[str, ...] | None = None  # a MEAN's benchmarks where the text names them all
    over: str = ""  # a MEAN's benchmark count, as the text says it


_DLOOP = ("D-Loop (arXiv:2610.06011) Table 5, mean of six benchmarks; K = 4 in its caption is D2SD's, D-Loop's "
          "K is not stated; the speedup's definition is not stated (read as the DFlash harness's)")
_XPRESS = ("XPress (arXiv:2608.02438) section 6, T = 0; tau without the bonus token; the speedup's definition is "
           "not stated (read as the DFlash harness's)")
_DFLASH = "DFlash authors (z-lab blog), T = 0, measured with their harness"

FIGURES: tuple[Figure, ...] = (
    Figure("Qwen3-8B", "dloop", "tau", 0.0, MEAN, 8.11, _DLOOP, branches=None, over="6, not named in the text"),
    Figure("Qwen3-8B", "dloop", "tau", 1.0, MEAN, 6.37, _DLOOP, branches=None, over="6, not named in the text"),
    Figure("Qwen3-8B", "dloop", "speedup", 0.0, MEAN, 5.67, _DLOOP, branches=None, over="6, not named in the text"),
    Figure("Qwen3-8B", "dloop", "speedup", 1.0, MEAN, 4.45, _DLOOP, branches=None, over="6, not named in the text"),
    Figure("Qwen3-8B", "xpress", "speedup", 0.0, "gsm8k", 8.2, _XPRESS),
    Figure("Qwen3-8B", "xpress", "speedup", 0.0, MEAN, 6.2, _XPRESS, over="7, not all named in the text"),
    Figure("Qwen3-8B", "markov", "speedup", 0.0, MEAN, 5.9, _XPRESS, over="7, not all named in the text"),
    Figure("Qwen3-8B", "dflash", "speedup", 0.0, MEAN, 4.9, _XPRESS, over="7, not all named in the text"),
    Figure("Qwen3-8B", "xpress", "tau_no_bonus_vs_dflash", 0.0, MEAN, 1.29, _XPRESS, over="7, not all named in the text"),
    Figure("Qwen3-8B", "markov", "tau_no_bonus_vs_dflash", 0.0, MEAN, 1.23, _XPRESS, over="7, not all named in the text"),
    Figure("Qwen3-8B", "xpress", "tau_no_bonus_vs_markov", 0.0, MEAN, 1.05, _XPRESS, over="7, not all named in the text"),
    Figure("Qwen3-8B", "xpress", "tau_no_bonus_vs_markov", 0.0, "livecodebench", 1.07, _XPRESS),
    Figure("Qwen3-8B", "xpress", "tau_no_bonus_vs_markov", 0.0, "humaneval", 1.05, _XPRESS),
    Figure("Qwen3-8B", "dflash", "speedup", 0.0, "math500", 6.17, _DFLASH),
    Figure("Qwen3-8B", "dflash", "speedup", 0.0, "gsm8k", 5.20, _DFLASH),
    Figure("Qwen3-8B", "dflash", "speedup", 0.0, "mbpp", 4.75, _DFLASH),
    Figure("Qwen3-4B", "dflash", "tau", 0.0, "gsm8k", 6.53, _DFLASH),
    Figure("Qwen3-4B", "dflash", "tau", 0.0, "math500", 7.84, _DFLASH),
)

# XPress's tau against Jacobi iterations as its text states it: above the Markov head's on every
# benchmark by K = 4, and a plateau by K = 7 at the mean ratio above
XPRESS_PLATEAU_FROM_K = 7


def xpress_plateau(found: list[Figure]) -> float | None:
    """XPress's mean tau over the Markov head's at its plateau, among `found`, or None."""
    return next((f.value for f in found if f.method == "xpress" and f.metric == "tau_no_bonus_vs_markov"
                 and f.dataset == MEAN), None)


def target_name(cfg) -> str | None:
    """The published model a target's shape is (a Qwen3Config), or None."""
    return TARGETS.get((cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size))


def figures(target: str | None, temperature: float) -> list[Figure]:
    return [f for f in FIGURES if f.target == target and f.temperature == temperature]


def _same_method(f: Figure, method: dict) -> bool:
    return f.method == method.get("decoder") and f.branches in (None, method.get("branches", 1))


def _matches(f: Figure, dataset: str, method: dict) -> bool:
    return f.dataset == dataset and _same_method(f, method)


def cell(found: list[Figure], dataset: str, method: dict) -> str:
    """The published figures for one row of eval's table ("tau 6.53; 5.20x"), "-" without any."""
    parts = []
    for f in found:
        if _matches(f, dataset, method):
            parts.append(f"{f.value:.2f}x" if f.metric == "speedup" else f"{f.metric} {f.value:.2f}")
    return "; ".join(parts) or "-"


def same_definition(found: list[Figure], dataset: str, method: dict) -> str:
    """The published tau or speedup for one benchmark and method ("published 5.20x"), "" without one."""
    parts = [f"{f.value:.2f}x" if f.metric == "speedup" else f"{f.value:.2f}" for f in found
             if _matches(f, dataset, method) and f.metric in ("tau", "speedup")]
    return "published " + ", ".join(parts) if parts else ""


def means_table(report: dict, found: list[Figure]) -> list[list]:
    """Rows (method, metric, published mean, this run's mean over the same benchmarks, the
    benchmarks, source) for the papers' means, where the run has that method; the run's mean is
    "-" unless the text names the benchmarks and the run measured exactly those."""
    rows = []
    for f in (f for f in found if f.dataset == MEAN):
        for label in (label for label, m in report["methods"].items() if _same_method(f, m)):
            values = [_metric(by_label, label, f.metric) for by_label in report["results"].values()]
            values = [v for v in values if v is not None]
            same_set = f.benchmarks is not None and set(f.benchmarks) == set(report["results"])
            if values:
                rows.append([label, f.metric, f"{f.value:.2f}",
                             f"{sum(values) / len(values):.2f}" if same_set else "-",
                             ", ".join(f.benchmarks) if f.benchmarks else f.over, f.source])
    return rows


def _metric(by_label: dict, label: str, metric: str) -> float | None:
    """The run's figure of `metric`'s definition (METRICS) for one method on one dataset."""
    r = by_label.get(label)
    if r is None:
        return None
    if "_vs_" not in metric:
        return r.get(METRICS[metric])
    reference = metric.split("_vs_")[1]
    ref = next((v for k, v in by_label.items() if k.split(".")[0] == reference), None)
    key = METRICS[metric]
    return None if ref is None or not ref.get(key) else r[key] / ref[key]


def ratio_cell(report: dict, label: str, ref_report: dict, ref_label: str, dataset: str) -> str:
    """The papers' tau ratio of the two methods' decoders on `dataset` (or their mean, marked so),
    where both reports measured the same published target at the same temperature; "-" otherwise."""
    target = report.get("published_target")
    temperature = report.get("settings", {}).get("temperature")
    if target is None or target != ref_report.get("published_target") or \
            temperature != ref_report.get("settings", {}).get("temperature"):
        return "-"
    method = report.get("methods", {}).get(label, {})
    metric = f"tau_no_bonus_vs_{ref_report.get('methods', {}).get(ref_label, {}).get('decoder')}"
    found = [f for f in figures(target, temperature) if f.metric == metric and _same_method(f, method)]
    for f in found:  # XPress's ratio counts accepted drafts only; compare's counts the bonus token too
        if f.dataset == dataset:
            return f"{f.value:.2f} (no bonus)"
    return next((f"{f.value:.2f} (mean, no bonus)" for f in found if f.dataset == MEAN), "-")
