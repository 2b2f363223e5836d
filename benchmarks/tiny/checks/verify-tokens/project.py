"""How many drafts per block should the target verify on this CPU? A projection from held-out data.

    python benchmarks/tiny/checks/verify-tokens/project.py \
        --heldout=benchmarks/tiny/checks/heads-heldout/results.json \
        --decode=benchmarks/cpu/verify-tokens/decode.json --context=300

For each method of the held-out report (whole blocks verified) and each verify length m timed by
the decode suite (`python -m xpress_jax.bench --suite=decode --verify_tokens=...`), the projected
speedup is tau_m / break_even_m, where tau_m = 1 + sum_{k<=m} a_k (a_k: the share of steps whose
acceptance reached draft k) and break_even_m is the step's cost at m in target-only steps. It is a
projection: verifying fewer drafts moves where later blocks start, so the real tau_m differs a
little. The held-out prompts are neither evaluation sets nor anything the drafters trained on.
Writes projection.json beside this script.
"""

import argparse
import json
import os

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--heldout", required=True, help="an xpress_jax.eval results.json (whole blocks)")
parser.add_argument("--decode", required=True, help="a decode-suite decode.json timed at several --verify_tokens")
parser.add_argument("--context", default="300", help="the decode suite's context length to read")
parser.add_argument("--batch", default="1")
args = parser.parse_args()

rows = json.load(open(args.decode))["contexts"][args.context][args.batch]
block = json.load(open(args.decode))["shapes"]["block"]
# each decode variant's step at each m, in target-only steps (XPress timed at K = 4, no early stop)
break_even = {}
for label, r in rows.items():
    variant, _, m = label.partition("_v")
    if variant != "target":
        break_even.setdefault(variant, {})[int(m) if m else block - 1] = r["break_even_tau"]
lengths = sorted(break_even["dflash"])
VARIANT = {"dflash": "dflash", "markov": "markov", "gru": "gru", "xpress": "xpress_K4"}
report = json.load(open(args.heldout))["results"]
out = {"break_even_tau": break_even, "projected_speedup": {}}
print("projected speedup (tau_m / break-even_m, each method at its own step cost); * marks the best m")
print("set | method | " + " | ".join(f"m={m}" for m in lengths))
for ds, methods in report.items():
    name = os.path.basename(ds).removesuffix(".jsonl")
    for label, r in methods.items():
        a = r.get("accept_per_position") or []
        if not a:
            continue
        variant = VARIANT.get(label.split(".")[0], "dflash")
        if variant not in break_even:
            raise SystemExit(f"{args.decode} has no {variant!r} rows (for {label}); time it with --decode_variants")
        cost = break_even[variant]
        proj = {m: (1 + sum(a[:m])) / cost[m] for m in lengths}
        best = max(proj, key=proj.get)
        out["projected_speedup"].setdefault(name, {})[label] = {"by_m": proj, "best_m": best}
        print(f"{name} | {label} | " + " | ".join(f"{proj[m]:.3f}" + ("*" if m == best else "") for m in lengths))
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "projection.json"), "w") as f:
    json.dump(out, f, indent=1)
