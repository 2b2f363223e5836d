"""Per-step cost of decoding with the KV cache as this checkout writes it against another checkout
(--old), side by side: each measurement runs in a fresh subprocess, the two checkouts alternated.

    git worktree add /tmp/old bcad55e   # the 4-D cache [batch, kv_heads, slots, head_dim]
    python benchmarks/cpu/cache-copies/ab.py --old=/tmp/old --out=benchmarks/cpu/cache-copies/ab.json
    git worktree add /tmp/old2 91fab7f  # rows, but written through a 4-D view (D-Loop's branch move)
    python benchmarks/cpu/cache-copies/ab.py --old=/tmp/old2 --slots=400 --cases=target,dflash_v4,dloop,dloop_k4 \
        --out=benchmarks/cpu/cache-copies/ab_branch_move.json

Each subprocess loads the published run's target and drafters, decodes 192 tokens from a random
100-token prompt with caches of the given slots (target-only; DFlash verifying 4 drafts; D-Loop's
drafter with 1 and 4 branches), and reports ms per loop step ((192-token run - 1-token run) /
steps, fastest of 5) and the whole-cache copies in the compiled loop body.
"""

import argparse
import json
import os
import subprocess
import sys

MEASURE = r'''
import json, re, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.checkpoints.hf_drafter import load_drafter
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.timing import fastest_seconds as fastest
from xpress_jax.decoding.speculative import DecodeOptions, DecodingModels, _decode, generate

run, slots, cases = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3].split(",")
target = load_qwen3(f"{run}/target")
dflash_models = DecodingModels(target, load_drafter(f"{run}/dflash/export"))
CASES = {"target": (dflash_models, "target", DecodeSettings()),
         "dflash_v4": (dflash_models, "dflash", DecodeSettings(verify_tokens=4)),
         "dloop": (DecodingModels(target, load_drafter(f"{run}/dloop/export")), "dloop", DecodeSettings()),
         "dloop_k4": (DecodingModels(target, load_drafter(f"{run}/dloop/export")), "dloop", DecodeSettings(branches=4))}
prompt = np.random.default_rng(0).integers(10, 2000, 100).tolist()

def loop_copies(models, opts):
    g, st = nnx.split(models)
    hlo = _decode.lower(g, st, jnp.zeros((1, 100), jnp.int32), jnp.array([100]), jnp.array([1], jnp.int32),
                        jax.random.key(0), jnp.float32(1.0), opts).compile().as_text()
    body = re.search(r"body=(%[\w.\-]+)", hlo).group(1)
    text = hlo[hlo.index("\n" + body + " "):]
    text = text[:text.index("\n}")]
    # a copy of a buffer with the cache's slot count (4-D or rows layout)
    return len(re.findall(r"= f32\[[0-9,]*,%d,48\]\{[0-9,]*\} copy\(" % opts.max_len, text))

rows = {}
for L in slots:
    for label in cases:
        models, dec, s = CASES[label]
        kw = dict(decoder=dec, settings=s, max_len=L)
        whole, out = fastest(lambda: generate(models, [prompt], max_new_tokens=192, **kw), 5)
        outside, _ = fastest(lambda: generate(models, [prompt], max_new_tokens=1, **kw), 5)
        steps = int(out.stats["steps"].max())
        opts = DecodeOptions(decoder=dec, max_new_tokens=192, greedy=True, max_len=L, settings=s)
        rows[f"{label}@{L}"] = {"ms_per_step": round((whole - outside) / steps * 1e3, 4), "steps": steps,
                                "tokens": out.tokens[0], "loop_cache_copies": loop_copies(models, opts)}
print(json.dumps(rows))
'''


def measure(checkout, run, slots, cases):
    env = dict(os.environ, PYTHONPATH=checkout)
    out = subprocess.run([sys.executable, "-c", MEASURE, run, slots, cases], env=env, cwd=checkout, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the checkout to compare with (e.g. a worktree of bcad55e)")
    ap.add_argument("--run", default=os.path.abspath("runs/repro"))
    ap.add_argument("--slots", default="320,640")
    ap.add_argument("--cases", default="target,dflash_v4", help="of target, dflash_v4, dloop, dloop_k4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/cpu/cache-copies/ab.json")
    args = ap.parse_args()
    new = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    rounds = []
    for r in range(args.rounds):
        pair = {"old": measure(os.path.abspath(args.old), args.run, args.slots, args.cases),
                "new": measure(new, args.run, args.slots, args.cases)}
        rounds.append(pair)
        for case in pair["new"]:
            o, n = pair["old"][case], pair["new"][case]
            same = o["tokens"] == n["tokens"]
            print(f"round {r}: {case:16s} old {o['ms_per_step']:.3f} ms ({o['loop_cache_copies']} copies)  "
                  f"new {n['ms_per_step']:.3f} ms ({n['loop_cache_copies']} copies)  "
                  f"old/new {o['ms_per_step'] / n['ms_per_step']:.2f}  same tokens: {same}", flush=True)
    for pair in rounds:
        for side in pair.values():
            for row in side.values():
                row["tokens"] = len(row["tokens"])
    with open(args.out, "w") as f:
        json.dump({"rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
