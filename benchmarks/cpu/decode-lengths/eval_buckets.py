"""Target-only decoding in eval on two prompt sets that differ only in their longest prompt: 470
tokens (its programs pad prompts to 512) and 515 (padded to 1,024, so its cache has twice the
slots). configs/tiny.py's shapes, random weights, 8 prompts of random ids, 256 new tokens each,
batch 1, eval's own decoding path (`eval.evaluate.run_decoder`: the padding rule, the timed calls).
Both reads side by side: the cache read as far as filled (the default) and every slot.
    python benchmarks/cpu/decode-lengths/eval_buckets.py --out=benchmarks/cpu/decode-lengths/eval_buckets.json
"""
import argparse
import contextlib
import dataclasses
import json
import time

import jax
import numpy as np

from xpress_jax import atomic, cli
from xpress_jax.decoding.padding import shared_length
from xpress_jax.decoding.speculative import DecodingModels
from xpress_jax.eval.evaluate import run_decoder
from xpress_jax.eval.settings import EvalSettings
from xpress_jax.models.build import build_target
from xpress_jax.models.layers import read_every_slot

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
args = parser.parse_args()
config = cli.load_config("configs/tiny.py")
target = DecodingModels(build_target(config))
s = dataclasses.replace(EvalSettings.from_config(config.eval), max_new_tokens=256, batch_size=1, temperature=0.0)
rng = np.random.default_rng(0)
lengths = rng.integers(100, 460, 7).tolist()
sets = {longest: [rng.integers(0, 300, n).tolist() for n in lengths + [longest]] for longest in (470, 515)}
rows = {}
for read, context in (("filled", contextlib.nullcontext), ("every_slot", read_every_slot)):
    for longest, prompts in sets.items():
        jax.clear_caches()
        with context():
            pad = shared_length([len(p) for p in prompts], s.prefill_chunk)
            out = run_decoder(target, prompts, "target", s, [], pad, f"{read} {longest}", progress=False)
        tokens = sum(len(t) for t in out.tokens)
        rows[f"{read} {longest}"] = {"padded_prompt": pad, "tokens": tokens,
                                      "tokens_per_s": round(tokens / out.seconds, 1)}
        print(json.dumps({f"{read} {longest}": rows[f"{read} {longest}"]}), flush=True)
ratios = {read: round(rows[f"{read} 515"]["tokens_per_s"] / rows[f"{read} 470"]["tokens_per_s"], 2)
          for read in ("filled", "every_slot")}
print(json.dumps({"515_over_470_tokens_per_s": ratios}))
atomic.write_json(args.out, {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "config": "configs/tiny.py",
                             "rows": rows, "515_over_470_tokens_per_s": ratios})
