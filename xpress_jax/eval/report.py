"""An eval report for readers: results.md (benchmarks by methods as the papers tabulate them, then
every figure, the paired ratios below it), acceptance.png, tau_and_speedup.png and, with an iteration
sweep, tau_vs_iterations.png; results.json beside them."""

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


def harness_speedup_cell(r: dict) -> str:
    """The harness's speedup (mean decode seconds per token, prefill excluded) with its interval."""
    if r.get("speedup_harness") is None:
        return "-"
    ci = r.get("speedup_harness_ci95")
    return f"{r['speedup_harness']:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")


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
             f"{r['tokens_per_s']:.1f}", "-" if r["speedup"] is None else r["speedup"], harness_speedup_cell(r),
             lossless(r)]
            for ds, by_label in results.items() for label, r in by_label.items()]
    header = ["dataset", "method", "tau", "tau (per-prompt mean)", "repetition (drafter's block)", "tokens/s",
              "speedup", "speedup (decode, harness; 95%)", "lossless"]
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


def papers_table(report: dict, found: list) -> str:
    """Benchmarks by methods, as the papers tabulate them: each cell the harness's tau and speedup
    (mean over responses; decode time per token, prefill excluded), a published figure of the same
    definition beside it where the papers' text gives one for that benchmark, and the mean over
    this run's benchmarks."""
    results, methods = report["results"], {**report["methods"], "target": {"decoder": "target"}}
    datasets = list(results)
    labels = list(dict.fromkeys(label for rows in results.values() for label in rows if label != "target"))

    def cell(ds, label):
        r = results[ds].get(label)
        if r is None:
            return "-"
        speedup = "-" if r.get("speedup_harness") is None else f"{r['speedup_harness']:.2f}x"
        text = f"{r['tau_per_prompt_mean']:.2f} / {speedup}"
        theirs = published.same_definition(found, ds, methods.get(label, {}))
        return text + (f" ({theirs})" if theirs else "")

    rows = []
    for label in labels:
        measured = [results[ds][label] for ds in datasets if label in results[ds]]
        speedups = [r["speedup_harness"] for r in measured if r.get("speedup_harness")]
        mean = (f"{sum(r['tau_per_prompt_mean'] for r in measured) / len(measured):.2f} / "
                f"{sum(speedups) / len(speedups):.2f}x" if speedups else "-")
        rows.append([label] + [cell(ds, label) for ds in datasets] + [mean])
    return markdown_table(["method"] + datasets + [f"mean ({len(datasets)})"], rows)


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
    text = dtypes_line(report) + "\n\n"
    text += ("As the papers tabulate: tau / speedup as the DFlash harness reports them (tau: mean over responses, "
             "bonus token included; speedup: target-only's mean decode time per token over the method's, prefill "
             "excluded)" + (", a published figure of the same definition in brackets" if found else "") + ":\n\n")
    text += papers_table(report, found) + "\nEvery figure, with the pooled ones and the intervals:\n\n"
    text += markdown(report["results"], cell)
    rows = published.means_table(report, found)
    if rows:
        text += (f"\nThe papers' means for {report['published_target']} at T = {report['settings']['temperature']:g}, "
                 "beside this run's mean of the same definition only over the same benchmarks (the papers' text "
                 "does not name all of them; docs/evaluation.md, \"The published figures\"):\n\n")
        text += markdown_table(["method", "metric", "published", "this run", "benchmarks", "source"], rows)
    return text


def write_outputs(report: dict, out_dir: str) -> None:
    results, sweep = report["results"], report["iteration_sweep"]
    atomic.write_json(os.path.join(out_dir, "results.json"), report)
    atomic.write_text(os.path.join(out_dir, "results.md"), report_markdown(report))
    plots.acceptance_per_position({ds: {h: r for h, r in v.items() if h != "target"} for ds, v in results.items()},
                                  os.path.join(out_dir, "acceptance.png"))
    plots.by_benchmark(results, os.path.join(out_dir, "tau_and_speedup.png"))
    if sweep:
        reference = {ds: {h: r["tau"] for h, r in v.items() if h != "target" and h not in sweep.get(ds, {})}
                     for ds, v in results.items()}  # the methods without a sweep, as flat lines
        plots.tau_against_iterations(sweep, reference, os.path.join(out_dir, "tau_vs_iterations.png"),
                                     published_plateau=published.xpress_plateau(published_figures(report)))
