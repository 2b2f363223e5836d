"""The tiny reproduction's results as a reader sees them: each method against the same-budget
reference, the table each pass renders, the example answers, and the published copy."""

from __future__ import annotations

import os
import shutil


SAME_BUDGET = "dflash.more"


def same_budget_ratios(report: dict) -> dict:
    """{dataset: {method: tau / tau(dflash.more) with its 95% paired interval}}: each method against
    the DFlash drafter trained as many more steps as the method's own stage (empty where the eval
    did not measure dflash.more)."""
    from xpress_jax.eval.metrics import ratios_against
    return {ds: ratios_against(rows, SAME_BUDGET) for ds, rows in report["results"].items() if SAME_BUDGET in rows}


def pass_title(name: str) -> str:
    """T0 -> 'temperature 0'; T1_v4 -> 'temperature 1, the target verifying the first 4 drafts of each block'."""
    temperature, _, verify = name[1:].partition("_v")
    return f"temperature {temperature}" + (f", the target verifying the first {verify} drafts of each block"
                                           if verify else "")


def table(results: dict) -> str:
    """Per temperature and dataset: every method's tau, per-prompt tau, its tau against DFlash's with
    the 95% paired-bootstrap interval over prompts, repetition (and, in brackets, that of the drafter's
    own one-pass block at the same steps), speedup, and D-Loop's kept prefixes."""
    from xpress_jax.eval.report import dtypes_line, ratio_cell, repetition_cell
    from xpress_jax.report.tables import markdown_table

    lines = []
    for name, report in results["eval"].items():
        same_budget = results.get("tau_vs_same_budget", {}).get(name, {})
        header = ["dataset", "method", "tau", "tau (per-prompt mean)", "tau / dflash (95%)"]
        header += [f"tau / {SAME_BUDGET} (95%)"] * bool(same_budget)
        header += ["repetition (drafter's block)", "tokens/s", "speedup"]
        rows = [[ds, label, f"{r['tau']:.2f}", f"{r['tau_per_prompt_mean']:.2f}", ratio_cell(r.get("tau_vs_reference"))]
                + [ratio_cell(same_budget.get(ds, {}).get(label))] * bool(same_budget)
                + [repetition_cell(r), f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x"]
                for ds, by_label in report["results"].items() for label, r in by_label.items()]
        lines += [f"\n### {pass_title(name)}\n"] + ([dtypes_line(report) + "\n"] if report.get("dtypes") else [])
        lines += [markdown_table(header, rows).rstrip()]
        every = [(ds, label, r) for ds, by_label in report["results"].items() for label, r in by_label.items()]
        for ds, label, r in every:
            c = r.get("candidate")
            if c:
                lines.append(f"\n{ds} {label} candidate mode (top-{c['top_k']}, {c['max_iters']} iterations): token "
                             f"agreement {c['token_agreement']:.4f} with the exact refiner over {c['blocks']} blocks; "
                             f"tau {c['tau']:.3f} against {c['tau_exact']:.3f} exact")
        for ds, label, r in every:
            if "mean_prefix_kept" in r:
                lines.append(f"\n{ds} {label}: the verified branch kept {r['mean_prefix_kept']:.2f} pass-1 tokens "
                             f"per step; {100 * r['empty_prefix_share']:.0f}% of steps kept none (pass 2 = pass 1)")
        for ds, by_label in report["iteration_sweep"].items():
            for label, by_count in by_label.items():
                taus = ", ".join(f"{k}: {v:.2f}" for k, v in by_count.items())
                lines.append(f"\n{ds} {label} tau against Jacobi iterations: {taus}")
    times = ", ".join(f"{s} {v / 60:.1f} min" for s, v in results["stage_seconds"].items())
    lines.append(f"\nStage wall times: {times} (total {results['total_seconds'] / 60:.1f} min).")
    return "\n".join(lines).lstrip() + "\n"


def examples_text(results: dict, max_lines: int = 8) -> str:
    """Each dataset's first question and the target's answer (every method's output at temperature
    0), with the target passes each method spent on it."""
    first = next(iter(results["eval"].values()), {})
    blocks = []
    for ds, ex in first.get("examples", {}).items():
        answer = ex["answer"].strip().splitlines()
        shown = answer[:max_lines] + ([f"... ({len(answer) - max_lines} more lines)"] if len(answer) > max_lines else [])
        passes = ", ".join(f"{label} {n}" for label, n in ex["target_passes"].items())
        question = " / ".join(line.strip() for line in ex["question"].strip().splitlines() if line.strip())
        question = question if len(question) <= 160 else question[:157] + "..."
        blocks.append(f"[{ds}] {question}\n" + "\n".join("  " + line for line in shown)
                      + f"\n  target passes for this answer: {passes}")
    return "\n\n".join(blocks)


def publish(run: str, dest: str) -> None:
    """Copies what a reader of the results needs into `dest` (e.g. benchmarks/tiny), each result
    once: results.json (every eval report, the target's report, stage times), table.md (its
    rendering) and each eval pass's plots."""
    os.makedirs(dest, exist_ok=True)
    copies = {name: name for name in ("results.json", "table.md")}
    for t in sorted(os.listdir(os.path.join(run, "eval"))):
        for name in ("acceptance.png", "tau_vs_iterations.png"):
            copies[f"{t}_{name}"] = os.path.join("eval", t, name)
    for name, src in copies.items():
        if os.path.isfile(os.path.join(run, src)):  # T1 has no iteration sweep, so no tau_vs_iterations.png
            shutil.copy(os.path.join(run, src), os.path.join(dest, name))
