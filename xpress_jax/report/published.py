"""The figures the papers publish, as data with their source, to set beside a run's.

Only what the papers' text states is carried: the D-Loop paper's Table 5 means and XPress's
end-to-end speedups and acceptance ratios, plus the DFlash authors' published speedups and
acceptance lengths that those papers build on. The per-benchmark tables of both papers are figures
in their PDFs and are not carried here (their text gives no per-benchmark acceptance lengths);
D-Loop's Qwen3-4B results are in those tables only. A figure is shown when the run's target has
the published model's shape (`target_name`).
"""

from __future__ import annotations

import dataclasses

# the published targets by their shape: (layers, hidden, intermediate, vocabulary)
TARGETS = {(36, 4096, 12288, 151936): "Qwen3-8B", (36, 2560, 9728, 151936): "Qwen3-4B"}

MEAN = "mean"  # a figure over the paper's own benchmark set, not one dataset


@dataclasses.dataclass(frozen=True)
class Figure:
    target: str  # "Qwen3-8B"
    method: str  # the decoder as eval names it: dflash, markov, xpress, dloop (at `branches`)
    metric: str  # tau, speedup, or tau_vs_dflash / tau_vs_markov (a ratio of two methods' tau)
    temperature: float
    dataset: str  # a benchmark name as eval labels it, or MEAN
    value: float
    source: str
    branches: int = 1  # D-Loop's K


_DLOOP = ("D-Loop (arXiv:2610.06011) Table 5, mean of its six benchmarks; the table sets it beside D2SD at "
          "K = 4 and its text does not restate D-Loop's K")
_XPRESS = "XPress (arXiv:2608.02438) section 6, seven benchmarks, T = 0"
_DFLASH = "DFlash authors (z-lab blog), T = 0"

FIGURES: tuple[Figure, ...] = (
    Figure("Qwen3-8B", "dloop", "tau", 0.0, MEAN, 8.11, _DLOOP, branches=4),
    Figure("Qwen3-8B", "dloop", "tau", 1.0, MEAN, 6.37, _DLOOP, branches=4),
    Figure("Qwen3-8B", "dloop", "speedup", 0.0, MEAN, 5.67, _DLOOP, branches=4),
    Figure("Qwen3-8B", "dloop", "speedup", 1.0, MEAN, 4.45, _DLOOP, branches=4),
    Figure("Qwen3-8B", "xpress", "speedup", 0.0, "gsm8k", 8.2, _XPRESS),
    Figure("Qwen3-8B", "xpress", "speedup", 0.0, MEAN, 6.2, _XPRESS),
    Figure("Qwen3-8B", "markov", "speedup", 0.0, MEAN, 5.9, _XPRESS),
    Figure("Qwen3-8B", "dflash", "speedup", 0.0, MEAN, 4.9, _XPRESS),
    Figure("Qwen3-8B", "xpress", "tau_vs_dflash", 0.0, MEAN, 1.29, _XPRESS),
    Figure("Qwen3-8B", "markov", "tau_vs_dflash", 0.0, MEAN, 1.23, _XPRESS),
    Figure("Qwen3-8B", "xpress", "tau_vs_markov", 0.0, MEAN, 1.05, _XPRESS),
    Figure("Qwen3-8B", "xpress", "tau_vs_markov", 0.0, "livecodebench", 1.07, _XPRESS),
    Figure("Qwen3-8B", "xpress", "tau_vs_markov", 0.0, "humaneval", 1.05, _XPRESS),
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
    return next((f.value for f in found if f.method == "xpress" and f.metric == "tau_vs_markov"
                 and f.dataset == MEAN), None)


def target_name(cfg) -> str | None:
    """The published model a target's shape is (a Qwen3Config), or None."""
    return TARGETS.get((cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size))


def figures(target: str | None, temperature: float) -> list[Figure]:
    return [f for f in FIGURES if f.target == target and f.temperature == temperature]


def _matches(f: Figure, dataset: str, method: dict) -> bool:
    return (f.dataset == dataset and f.method == method.get("decoder")
            and f.branches == method.get("branches", 1))


def cell(found: list[Figure], dataset: str, method: dict) -> str:
    """The published figures for one row of eval's table ("tau 6.53; 5.20x"), "-" without any."""
    parts = []
    for f in found:
        if _matches(f, dataset, method):
            parts.append(f"{f.value:.2f}x" if f.metric == "speedup" else f"{f.metric} {f.value:.2f}")
    return "; ".join(parts) or "-"


def means_table(report: dict, found: list[Figure]) -> list[list]:
    """Rows (method, metric, published mean, this run's mean over its datasets, source) for the
    papers' means, where the run has that method."""
    rows = []
    for f in (f for f in found if f.dataset == MEAN):
        labels = [label for label, m in report["methods"].items()
                  if m["decoder"] == f.method and m.get("branches", 1) == f.branches]
        for label in labels:
            values = [_metric(by_label, label, f.metric) for by_label in report["results"].values()]
            values = [v for v in values if v is not None]
            if values:
                rows.append([label, f.metric, f"{f.value:.2f}", f"{sum(values) / len(values):.2f}",
                             f"{len(values)}", f.source])
    return rows


def _metric(by_label: dict, label: str, metric: str) -> float | None:
    r = by_label.get(label)
    if r is None:
        return None
    if metric in ("tau", "speedup"):
        return r.get(metric)
    reference = metric.removeprefix("tau_vs_")
    ref = next((v for k, v in by_label.items() if k.split(".")[0] == reference), None)
    return None if ref is None else r["tau"] / ref["tau"]


def ratio_cell(report: dict, label: str, ref_report: dict, ref_label: str, dataset: str) -> str:
    """The papers' tau ratio of the two methods' decoders on `dataset` (or their mean, marked so),
    where both reports measured the same published target at the same temperature; "-" otherwise."""
    target = report.get("published_target")
    temperature = report.get("settings", {}).get("temperature")
    if target is None or target != ref_report.get("published_target") or \
            temperature != ref_report.get("settings", {}).get("temperature"):
        return "-"
    method = report.get("methods", {}).get(label, {})
    metric = f"tau_vs_{ref_report.get('methods', {}).get(ref_label, {}).get('decoder')}"
    found = [f for f in figures(target, temperature) if f.metric == metric and f.method == method.get("decoder")
             and f.branches == method.get("branches", 1)]
    for f in found:
        if f.dataset == dataset:
            return f"{f.value:.2f}"
    return next((f"{f.value:.2f} (mean)" for f in found if f.dataset == MEAN), "-")
