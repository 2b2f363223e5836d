"""Compare two methods prompt by prompt, within one eval report or across two.

    python -m xpress_jax.compare --method=runs/a/results.json:xpress.frozen --reference=runs/a/results.json:markov
    python -m xpress_jax.compare --method=benchmarks/tiny/results.json:T0:xpress \\
        --reference=runs/ctrl/results.json:dflash.ctrl100

Each side is REPORT:LABEL, where REPORT is an `xpress_jax.eval` results.json, or a reproduction's
results.json with the temperature named too (REPORT:T0:LABEL). For every dataset both reports
hold, it prints tau(method) / tau(reference) with a 95% paired bootstrap over prompts
(`significance.paired_tau_ratio`). Pairing needs the same prompts decoded the same way, so reports
whose eval settings differ in what decides the prompts or the tokens are refused, and so are
reports whose target-only rows gave different answer lengths (another target, or other prompts).
So are reports made before eval kept per-prompt figures.
"""

from __future__ import annotations

import json
import os

from absl import flags

from xpress_jax import cli, files
from xpress_jax.errors import InputError
from xpress_jax.evaluation import tau_ratio

FLAGS = flags.FLAGS
flags.DEFINE_string("method", None, "REPORT:LABEL (or REPORT:T0:LABEL for a reproduction's results.json).")
flags.DEFINE_string("reference", None, "REPORT:LABEL of the method to divide by.")
flags.DEFINE_string("out", "", "Also write the comparison as JSON here.")

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
                raise InputError(f"{ds}/{name}: the report has no per-prompt figures (made before eval kept "
                                 f"them); evaluate it again")
        # the target-only row's tokens per prompt: a different target or prompt set shows here
        lengths = [r.get("target", {}).get("per_prompt", {}).get("committed") for r in (rows, ref_rows)]
        if lengths[0] != lengths[1]:
            raise InputError(f"{ds}: target-only decoding gave different answer lengths in the two reports "
                             f"({lengths[0]} against {lengths[1]}): not the same target or prompts")
        out[ds] = {**tau_ratio(rows[label], ref_rows[ref_label]),
                   "tau": rows[label]["tau"], "tau_reference": ref_rows[ref_label]["tau"]}
    return out


def markdown(result: dict, label: str, ref_label: str) -> str:
    lines = [f"| dataset | {label} tau | {ref_label} tau | ratio | 95% interval |", "|---|---|---|---|---|"]
    lines += [f"| {ds} | {r['tau']:.3f} | {r['tau_reference']:.3f} | {r['ratio']:.3f} | "
              f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f} |" for ds, r in result.items()]
    return "\n".join(lines) + "\n"


def main(config_unused):
    del config_unused  # compares finished reports; no model is built
    if not FLAGS.method or not FLAGS.reference:
        raise InputError("--method and --reference are required")
    method, reference = read_side(FLAGS.method), read_side(FLAGS.reference)
    result = compare(method, reference)
    print(markdown(result, method[1], reference[1]), end="")
    if FLAGS.out:
        files.write_json(FLAGS.out, {"method": FLAGS.method, "reference": FLAGS.reference, "results": result})


if __name__ == "__main__":
    cli.run(main)
