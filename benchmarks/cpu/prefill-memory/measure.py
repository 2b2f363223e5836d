"""Compiled memory of the target's prefill at Qwen3-8B shapes (abstract bf16 weights, nothing
allocated): regeneration's case, batch 32 and 2,048-token prompts, whole against chunked.

    python benchmarks/cpu/prefill-memory/measure.py --out=benchmarks/cpu/prefill-memory/prefill.json
"""

import argparse
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from xpress_jax import atomic
from xpress_jax.cli import config_path, with_overrides
from xpress_jax.decoding.speculative import prefill
from xpress_jax.models.build import build_target


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=config_path("qwen3_8b.py"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--max_new_tokens", type=int, default=1024)
    ap.add_argument("--chunks", default="0,1024,512,256")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    target = build_target(with_overrides(args.config), abstract=True)
    graphdef, state = nnx.split(target)
    ids = jax.ShapeDtypeStruct((args.batch, args.prompt), jnp.int32)
    lengths = jax.ShapeDtypeStruct((args.batch,), jnp.int32)
    max_len = args.prompt + args.max_new_tokens + 16
    gib = lambda b: round(b / 2**30, 2)  # noqa: E731
    rows = {}
    for chunk in (int(c) for c in args.chunks.split(",")):
        fn = jax.jit(lambda s, i, n, c=chunk: prefill(nnx.merge(graphdef, s), None, i, n, max_len, c))
        t0 = time.perf_counter()
        mem = fn.lower(state, ids, lengths).compile().memory_analysis()
        rows[str(chunk)] = {"arguments_gib": gib(mem.argument_size_in_bytes), "outputs_gib": gib(mem.output_size_in_bytes),
                            "temporaries_gib": gib(mem.temp_size_in_bytes),
                            "peak_gib": gib(mem.argument_size_in_bytes + mem.output_size_in_bytes
                                            + mem.temp_size_in_bytes),
                            "compile_s": round(time.perf_counter() - t0, 1)}
        print(chunk, rows[str(chunk)], flush=True)
    report = {"date": time.strftime("%Y-%m-%d"), "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "config": os.path.basename(args.config), "batch": args.batch, "prompt": args.prompt,
              "cache_slots": max_len, "by_chunk": rows}
    if args.out:
        atomic.write_json(args.out, report)


if __name__ == "__main__":
    main()
