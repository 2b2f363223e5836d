"""A decode step's cost against prompt length, cache fill and cache size, at the 8B recipe's
lengths (prompts up to 2,000 tokens, 2,048 new tokens) on a tiny-width model: configs/tiny.py's
shapes (4 layers, hidden 64), random weights, batch 1, target-only decoding and DFlash.

Four sweeps, each a mean step over a whole run (`bench.decode.step_seconds`: N tokens minus 1,
same program):
- prompt length at a fixed cache of 4,064 slots (prompt 2,000 + 2,048 new + a block of 16);
- cache fill: 256 and 2,048 new tokens after a 128-token prompt, the same 4,064-slot cache;
- cache size: a 128-token prompt and 256 new tokens in caches of 400 to 4,064 slots;
- cache size at 500 held: a 436-token prompt and 128 new tokens (436 to 564 held, 500 on average)
  in caches of 580 (just enough) to 4,096 slots.
Each run twice, side by side: attention reading only the filled slots (the code's default,
`layers.RowOrder.attend_filled`) and reading every slot (`layers.read_every_slot`), with the
answer's tokens compared between the two and across cache sizes (they must be identical).
Run from the repository root (the 500-held sweep alone at more repetitions: --sweeps=held --reps=6):
    python benchmarks/cpu/decode-lengths/measure.py --out=benchmarks/cpu/decode-lengths/lengths.json
"""
import argparse
import contextlib
import json
import os
import time

import jax
import numpy as np

from xpress_jax import atomic, cli
from xpress_jax.bench.decode import step_seconds
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodingModels, generate
from xpress_jax.models.layers import read_every_slot
from xpress_jax.models.build import build_target, drafter_config, new_drafter

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
parser.add_argument("--reps", type=int, default=2)
parser.add_argument("--sweeps", default="prompt,fill,size,held", help="which sweeps (comma-separated)")
args = parser.parse_args()
config = cli.load_config("configs/tiny.py")
target = build_target(config)
drafter = new_drafter(config, drafter_config(config, target.cfg))
rng = np.random.default_rng(0)
FULL = 2000 + 2048 + drafter.cfg.block_size  # the recipe's longest prompt, its answer and a block
rows = []


prompts = {}
answers = {}  # (prompt length, new tokens, decoder) -> the tokens of every run


def measure(sweep, prompt_len, new_tokens, max_len):
    prompt = prompts.setdefault(prompt_len, [rng.integers(0, target.cfg.vocab_size, prompt_len).tolist()])
    for decoder, models in (("target", DecodingModels(target)), ("dflash", DecodingModels(target, drafter))):
        row = {"sweep": sweep, "decoder": decoder, "prompt": prompt_len, "new_tokens": new_tokens,
               "cache_slots": max_len}
        for read, context in (("filled", contextlib.nullcontext), ("every slot", read_every_slot)):
            jax.clear_caches()  # a program traced under the other read is cached by its shapes alone
            with context():
                r = step_seconds(models, prompt, decoder, DecodeSettings(), new_tokens=new_tokens, reps=args.reps,
                                 max_len=max_len)
                tokens = generate(models, prompt, decoder=decoder, max_new_tokens=new_tokens, max_len=max_len).tokens
            answers.setdefault((prompt_len, new_tokens, decoder), []).append(tokens)
            row[f"ms_per_step_{'filled' if read == 'filled' else 'every_slot'}"] = round(r["seconds_per_step"] * 1e3, 3)
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)


sweeps = args.sweeps.split(",")
for prompt_len in (128, 512, 1024, 2000) if "prompt" in sweeps else ():
    measure("prompt length", prompt_len, 256, FULL)
for new_tokens in (256, 2048) if "fill" in sweeps else ():
    measure("cache fill", 128, new_tokens, FULL)
for slots in (400, 1040, 2080, FULL) if "size" in sweeps else ():
    measure("cache size", 128, 256, slots)
for slots in (580, 1040, 2080, 4096) if "held" in sweeps else ():
    measure("cache size, 500 held", 436, 128, slots)
identical = all(all(t == runs[0] for t in runs) for runs in answers.values())
held = {(r["decoder"], r["cache_slots"]): r for r in rows if r["sweep"] == "cache size, 500 held"}
ratios = {f"{d} {read}": round(held[d, 4096][f"ms_per_step_{read}"] / held[d, 580][f"ms_per_step_{read}"], 2)
          for d in ("target", "dflash") for read in ("filled", "every_slot")} if held else {}
print(json.dumps({"tokens_identical": identical, "4096_over_580_slots_at_500_held": ratios}))
atomic.write_json(args.out, {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "cpu_count": os.cpu_count(),
                             "config": "configs/tiny.py", "rows": rows, "tokens_identical": identical,
                             "4096_over_580_slots_at_500_held": ratios})
