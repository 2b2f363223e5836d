"""Per-step cost of batch-1 decoding with XLA:CPU's thread pool on every core against one core,
side by side: each measurement runs in a fresh subprocess whose CPU affinity is set before jax
starts (XLA sizes its intra-op pool from the affinity), the two settings alternated.

    python benchmarks/cpu/step-split/threads.py --out=benchmarks/cpu/step-split/threads.json

Each subprocess loads the published run's target and DFlash drafter, decodes 192 tokens from a
random 100-token prompt with a cache of 320 slots (target-only, and DFlash verifying 4 drafts),
and reports ms per loop step ((192-token run - 1-token run) / steps, fastest of 5).
"""

import argparse
import json
import os
import subprocess
import sys

MEASURE = r'''
import json, os, sys
os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(",")})
import numpy as np
from xpress_jax.timing import fastest_seconds as fastest
from xpress_jax.checkpoints.hf_drafter import load_drafter
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodingModels, generate

run = sys.argv[1]
models = DecodingModels(load_qwen3(f"{run}/target"), load_drafter(f"{run}/dflash/export"))
prompt = np.random.default_rng(0).integers(10, 2000, 100).tolist()
rows = {}
for label, dec, s in [("target", "target", DecodeSettings()), ("dflash_v4", "dflash", DecodeSettings(verify_tokens=4))]:
    kw = dict(decoder=dec, settings=s, max_len=320)
    whole, out = fastest(lambda: generate(models, [prompt], max_new_tokens=192, **kw), 5)
    outside, _ = fastest(lambda: generate(models, [prompt], max_new_tokens=1, **kw), 5)
    steps = int(out.stats["steps"].max())
    rows[label] = {"ms_per_step": round((whole - outside) / steps * 1e3, 4), "steps": steps, "tokens": out.tokens[0]}
print(json.dumps(rows))
'''


def measure(run, cores):
    out = subprocess.run([sys.executable, "-c", MEASURE, run, ",".join(map(str, sorted(cores)))],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="runs/repro", help="a reproduction run directory")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="", help="write the figures here as JSON")
    args = ap.parse_args()
    every = sorted(os.sched_getaffinity(0))
    settings = {f"{len(every)}_cores": every, "1_core": every[:1]}
    rounds = []
    for r in range(args.rounds):
        got = {name: measure(args.run, cores) for name, cores in settings.items()}
        many, one = got[f"{len(every)}_cores"], got["1_core"]
        for label in many:
            same = many[label]["tokens"] == one[label]["tokens"]
            ratio = many[label]["ms_per_step"] / one[label]["ms_per_step"]
            print(f"round {r + 1} {label:10s} {len(every)} cores {many[label]['ms_per_step']:.3f} ms/step, "
                  f"1 core {one[label]['ms_per_step']:.3f}: {ratio:.2f}x, same tokens: {same}", flush=True)
        for row in got.values():
            for v in row.values():
                v.pop("tokens")
        rounds.append(got)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cores": every, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
