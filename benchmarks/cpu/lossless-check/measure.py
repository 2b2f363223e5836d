"""What `--check_lossless` adds to an eval where its reference is the method's own verify pass (bf16,
TF32: everywhere but float32 on a CPU): the whole reference run per method, against the cheap check
that compares with target-only decoding (which the eval runs anyway) and decodes again only the
responses that differ (none here, then a quarter of them made to differ). Side by side in one run, on the shipped tiny target and DFlash drafter
in bf16, 16 GSM8K questions of the shipped set, 128 new tokens, batch 1.

Run from the repository root:
    python benchmarks/cpu/lossless-check/measure.py --out=benchmarks/cpu/lossless-check/results.json
"""
import argparse
import dataclasses
import os
import time

import jax

from xpress_jax import assets, atomic, cli
from xpress_jax.data.questions import load_questions
from xpress_jax.decoding.padding import shared_length
from xpress_jax.decoding.speculative import DecodingModels
from xpress_jax.eval.evaluate import (Method, build_methods, check_lossless_cheaply, encode_prompts, lossless_check,
                                      run_decoder)
from xpress_jax.eval.settings import EvalSettings

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True)
parser.add_argument("--prompts", type=int, default=16)
parser.add_argument("--max_new_tokens", type=int, default=128)
args = parser.parse_args()

config = cli.load_config("configs/tiny_heads.py")
config.target.hf_dir = assets.TINY_TARGET
config.target_param_dtype = config.dtype = "bfloat16"
s = dataclasses.replace(EvalSettings.from_config(config.eval), max_new_tokens=args.max_new_tokens, batch_size=1,
                        temperature=0.0, lossless_reference="verify_pass", drafter_dtype="bfloat16")
method = Method("dflash", "dflash", assets.TINY_DFLASH)
target, models = build_methods(config, [method], s.drafter_dtype)
spec = models["dflash"]
prompts, _, stops = encode_prompts(config, load_questions("gsm8k", args.prompts), s.max_prompt_tokens)
pad = shared_length([len(p) for p in prompts])
base = run_decoder(DecodingModels(target), prompts, "target", s, stops, pad, "target")
mine = run_decoder(spec, prompts, "dflash", s, stops, pad, "dflash")

t0 = time.perf_counter()  # the whole reference, its compile included: every response again, drafts refused
reference = run_decoder(spec, prompts, "dflash", s, stops, pad, "reference", reject_drafts=True, prefill_s=0.0)
whole = lossless_check(spec.target, prompts, mine.tokens, reference.tokens)
whole_s = time.perf_counter() - t0
t0 = time.perf_counter()  # only the responses that differ from target-only decoding
cheap = check_lossless_cheaply(method, spec, prompts, mine, base, s, stops, pad, "gsm8k")
cheap_s = time.perf_counter() - t0
# as if a quarter of the answers had split a near-tie the other way in target-only decoding: those
# four are decoded again with the reference (its compile included), which clears them
flipped = dataclasses.replace(base, tokens=[t[:-1] + [(t[-1] + 1) % 2048] if i < 4 else t
                                            for i, t in enumerate(base.tokens)])
t0 = time.perf_counter()
quarter = check_lossless_cheaply(method, spec, prompts, mine, flipped, s, stops, pad, "gsm8k")
quarter_s = time.perf_counter() - t0

result = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "cpu_count": os.cpu_count(),
          "dtype": "bfloat16", "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
          "decode_s": {"target_only": round(base.seconds, 2), "dflash": round(mine.seconds, 2)},
          "whole_reference": {"seconds": round(whole_s, 2), "mismatches": whole["mismatches"]},
          "differing_only": {"seconds": round(cheap_s, 2), "mismatches": cheap["mismatches"],
                             "reference_reruns": cheap["reference_reruns"],
                             "differ_from_target_only": cheap["against_target_only"]["mismatches"]},
          "a_quarter_differing": {"seconds": round(quarter_s, 2), "mismatches": quarter["mismatches"],
                                  "reference_reruns": quarter["reference_reruns"]}}
atomic.write_json(args.out, result)
print(result)
