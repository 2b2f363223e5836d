"""Two methods of one or two eval reports, paired prompt by prompt: the reports are checked to
have decoded the same prompts the same way, then tau(method) / tau(reference) is bootstrapped
over prompts (`report.significance.paired_tau_ratio`) for every dataset both hold."""

from __future__ import annotations

import json
import os

from xpress_jax.errors import InputError
from xpress_jax.eval.metrics import tau_ratio
from xpress_jax.report import published
from xpress_jax.report.tables import markdown_table

# the eval settings that decide which prompts are decoded and which tokens come out
PAIRING_SETTINGS = ("num_prompts", "max_new_tokens", "max_prompt_tokens", "temperature", "seed")


def read_side(spec: str) -> tuple[dict, str]:
    """REPORT:LABEL or REPORT:TEMPERATURE:LABEL -> (the eval report, the label)."""
    path, _, rest = spec.partition(".json:")
    path += ".json"
    if not rest:
        raise InputError(f"{spec!r}: expected REPORT.json:LABEL (or REPORT.json:T0:LABEL)")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such report")
    with open(path) as f:
        report = json.load(f)
    if "results" not in report:  # a reproduction's results.json: one eval report per temperature
        temperature, _, label = rest.partition(":")
        evals = report.get("eval", {})
        if temperature not in evals or not label:
            raise InputError(f"{path} is a reproduction's results.json; name the temperature as "
                             f"{path}:T:LABEL with T one of {sorted(evals)}")
        return evals[temperature], label
    return report, rest


def compare(method: tuple[dict, str], reference: tuple[dict, str]) -> dict:
    """{dataset: {"ratio", "ci95", "tau", "tau_reference"}} over the datasets both reports hold."""
    (report, label), (ref_report, ref_label) = method, reference
    differ = [k for k in PAIRING_SETTINGS
              if report.get("settings", {}).get(k) != ref_report.get("settings", {}).get(k)]
    if differ:
        raise InputError("the two reports did not decode the same prompts the same way; they differ in "
                         + ", ".join(f"{k} ({report['settings'].get(k)} against {ref_report['settings'].get(k)})"
                                     for k in differ))
    datasets = [ds for ds in report["results"] if ds in ref_report["results"]]
    if not datasets:
        raise InputError(f"the reports share no dataset ({sorted(report['results'])} against "
                         f"{sorted(ref_report['results'])})")
    out = {}
    for ds in datasets:
        rows, ref_rows = report["results"][ds], ref_report["results"][ds]
        for name, r in ((label, rows), (ref_label, ref_rows)):
            if name not in r:
                raise InputError(f"{ds}: no method {name!r}; the report has {sorted(r)}")
            if "per_prompt" not in r[name]:
                raise InputError(f"{ds}/{name}: the report has no per-prompt figures; evaluate it again")
        # the target-only row's tokens per prompt: a different target or prompt set shows here
        lengths = [r.get("target", {}).get("per_prompt", {}).get("committed") for r in (rows, ref_rows)]
        if lengths[0] != lengths[1]:
            raise InputError(f"{ds}: target-only decoding gave different answer lengths in the two reports "
                             f"({lengths[0]} against {lengths[1]}): not the same target or prompts")
        out[ds] = {**tau_ratio(rows[label], ref_rows[ref_label]),
                   "tau": rows[label]["tau"], "tau_reference": ref_rows[ref_label]["tau"],
                   # the papers' ratio of these two methods on this target (report/published.py)
                   "published_ratio": published.ratio_cell(report, label, ref_report, ref_label, ds)}
    return out


def markdown(result: dict, label: str, ref_label: str) -> str:
    """The paired ratios, with the papers' ratio of the same two methods where `compare` found one."""
    header = ["dataset", f"{label} tau", f"{ref_label} tau", "ratio", "95% interval"]
    rows = [[ds, f"{r['tau']:.3f}", f"{r['tau_reference']:.3f}", f"{r['ratio']:.3f}",
             f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}"] for ds, r in result.items()]
    if any(r.get("published_ratio", "-") != "-" for r in result.values()):
        header.append("published ratio")
        for row, r in zip(rows, result.values()):
            row.append(r["published_ratio"])
    return markdown_table(header, rows)
