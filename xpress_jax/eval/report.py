"""An eval report for readers: results.md (one table per report, the paired ratios below it),
acceptance.png and, with an iteration sweep, tau_vs_iterations.png; results.json beside them."""

from __future__ import annotations

import os

from xpress_jax import atomic
from xpress_jax.report import plots, published
from xpress_jax.report.tables import markdown_table


def repetition_cell(r: dict) -> str:
    """A method's repetition with its drafter's one-pass block's in brackets ("0.531 (0.692)"); "-"
    for target-only rows."""
    if r.get("repetition_rate") is None:
        return "-"
    return f"{r['repetition_rate']:.3f} ({r['drafter_repetition_rate']:.3f})"


def ratio_cell(c: dict | None) -> str:
    """A paired tau ratio with its 95% interval ("1.052 (0.98-1.12)"); "-" without one."""
    return f"{c['ratio']:.3f} ({c['ci95'][0]:.2f}-{c['ci95'][1]:.2f})" if c else "-"


def markdown(results: dict, published_cell=None) -> str:
    """Every method of every dataset (with the papers' figures for that row when `published_cell`
    gives them); then each method's tau against the reference's."""
    def lossless(r):
        if r.get("lossless") is None:
            return "-"
        return "yes" if r["lossless"] else f"NO ({r['mismatches']}/{r['n_prompts']} prompts)"
    rows = [[ds, label, f"{r['tau']:.3f}", f"{r['tau_per_prompt_mean']:.3f}", repetition_cell(r),
             f"{r['tokens_per_s']:.1f}", "-" if r["speedup"] is None else r["speedup"], lossless(r)]
            for ds, by_label in results.items() for label, r in by_label.items()]
    header = ["dataset", "method", "tau", "tau (per-prompt mean)", "repetition (drafter's block)", "tokens/s",
              "speedup", "lossless"]
    if published_cell is not None:
        header.append("published")
        for row in rows:
            row.append(published_cell(row[0], row[1]))
    text = markdown_table(header, rows)
    compared = [[ds, label, c["reference"], f"{c['ratio']:.3f}", f"{c['ci95'][0]:.3f}-{c['ci95'][1]:.3f}"]
                for ds, by_label in results.items() for label, r in by_label.items()
                if (c := r.get("tau_vs_reference"))]
    if compared:
        text += ("\ntau against the reference method on the same prompts, with a 95% paired bootstrap over "
                 "prompts (an interval holding 1 is no evidence of an ordering):\n\n")
        text += markdown_table(["dataset", "method", "reference", "tau ratio", "95% interval"], compared)
    return text


def dtypes_line(report: dict) -> str:
    """What the speedups were measured with: the target's weights and compute, the drafter's and heads'."""
    d = report.get("dtypes")
    if not d:
        return ""
    return (f"Target weights in {d['target']} (compute {d['target_compute']}); drafter and heads in "
            f"{d['drafter_and_heads']}; {report.get('device', '')}.")


def published_figures(report: dict) -> list:
    """The papers' figures for this run's target at its temperature (none for other targets)."""
    return published.figures(report.get("published_target"), report["settings"]["temperature"])


def report_markdown(report: dict) -> str:
    """results.md: the dtypes, the table, and where the target is a published one, the papers'
    figures beside the run's (per row, and the papers' means against the run's)."""
    found = published_figures(report)
    cell = None
    if found:
        methods = {**report["methods"], "target": {"decoder": "target"}}
        cell = lambda ds, label: published.cell(found, ds, methods.get(label, {}))  # noqa: E731
    text = dtypes_line(report) + "\n\n" + markdown(report["results"], cell)
    rows = published.means_table(report, found)
    if rows:
        text += (f"\nThe papers' means for {report['published_target']} at T = {report['settings']['temperature']:g} "
                 "against this run's mean over its datasets (their benchmark sets and prompts differ from a "
                 "run's unless it used the same):\n\n")
        text += markdown_table(["method", "metric", "published", "this run", "datasets", "source"], rows)
    return text


def write_outputs(report: dict, out_dir: str) -> None:
    results, sweep = report["results"], report["iteration_sweep"]
    atomic.write_json(os.path.join(out_dir, "results.json"), report)
    atomic.write_text(os.path.join(out_dir, "results.md"), report_markdown(report))
    plots.acceptance_per_position({ds: {h: r for h, r in v.items() if h != "target"} for ds, v in results.items()},
                                  os.path.join(out_dir, "acceptance.png"))
    if sweep:
        reference = {ds: {h: r["tau"] for h, r in v.items() if h != "target" and h not in sweep.get(ds, {})}
                     for ds, v in results.items()}  # the methods without a sweep, as flat lines
        plots.tau_against_iterations(sweep, reference, os.path.join(out_dir, "tau_vs_iterations.png"),
                                     published_plateau=published.xpress_plateau(published_figures(report)))
