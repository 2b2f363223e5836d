"""A decode step's cost against prompt length, cache fill and cache size, at the 8B recipe's
lengths (prompts up to 2,000 tokens, 2,048 new tokens) on a tiny-width model: configs/tiny.py's
shapes (4 layers, hidden 64), random weights, batch 1, target-only decoding and DFlash.

Three sweeps, each a mean step over a whole run (`bench.decode.step_seconds`: N tokens minus 1,
same program):
- prompt length at a fixed cache of 4,064 slots (prompt 2,000 + 2,048 new + a block of 16);
- cache fill: 256 and 2,048 new tokens after a 128-token prompt, the same 4,064-slot cache;
- cache size: a 128-token prompt and 256 new tokens in caches of 400 to 4,064 slots.
Run from the repository root:
    python benchmarks/cpu/decode-lengths/measure.py --out=benchmarks/cpu/decode-lengths/lengths.json
"""
import argparse
import json
import os
import time

import jax
import numpy as np

from xpress_jax import atomic, cli
from xpress_jax.bench.decode import step_seconds
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import SpecModels
from xpress_jax.models.build import build_target, drafter_config, new_drafter

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
parser.add_argument("--reps", type=int, default=2)
args = parser.parse_args()
config = cli.load_config("configs/tiny.py")
target = build_target(config)
drafter = new_drafter(config, drafter_config(config, target.cfg))
rng = np.random.default_rng(0)
FULL = 2000 + 2048 + drafter.cfg.block_size  # the recipe's longest prompt, its answer and a block
rows = []


def measure(sweep, prompt_len, new_tokens, max_len):
    prompt = [rng.integers(0, target.cfg.vocab_size, prompt_len).tolist()]
    for decoder, models in (("target", SpecModels(target)), ("dflash", SpecModels(target, drafter))):
        r = step_seconds(models, prompt, decoder, DecodeSettings(), new_tokens=new_tokens, reps=args.reps,
                         max_len=max_len)
        rows.append({"sweep": sweep, "decoder": decoder, "prompt": prompt_len, "new_tokens": new_tokens,
                     "cache_slots": max_len, "ms_per_step": round(r["seconds_per_step"] * 1e3, 3)})
        print(json.dumps(rows[-1]), flush=True)


for prompt_len in (128, 512, 1024, 2000):
    measure("prompt length", prompt_len, 256, FULL)
for new_tokens in (256, 2048):
    measure("cache fill", 128, new_tokens, FULL)
for slots in (400, 1040, 2080, FULL):
    measure("cache size", 128, 256, slots)
atomic.write_json(args.out, {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "cpu_count": os.cpu_count(),
                             "config": "configs/tiny.py", "rows": rows})
