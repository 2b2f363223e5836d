"""Benchmarks, reported as ratios measured side by side in one run (never as test assertions).

    python -m xpress_jax.bench heads [--out=benchmarks/cpu]

`heads`: the cost of turning the drafter's outputs into a block at Qwen3-8B shapes (vocabulary
151,936, hidden 4,096, rank 256, block 16), per call and relative to the Markov head's serial
decode: Markov and GRU (15 dependent steps), XPress with K Jacobi iterations, and XPress in
candidate mode (top-k). Also how often candidate mode picks what the full vocabulary picks.
Random weights (untrained): the timings are real, the agreement rates only illustrate the
measurement; rerun with trained heads for meaningful agreement.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

flags.DEFINE_string("out", "benchmarks/cpu", "Directory for the JSON result.")
flags.DEFINE_integer("reps", 5, "Timed repetitions per variant (median reported).")
flags.DEFINE_integer("batch", 1, "Sequences per call.")
flags.DEFINE_integer("vocab", 151936, "Vocabulary size.")
flags.DEFINE_integer("hidden", 4096, "Drafter hidden size.")
FLAGS = flags.FLAGS


def _time(fn, reps):
    jax.block_until_ready(fn())  # compile
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


def bench_heads(reps: int, batch: int, vocab: int, hidden: int) -> dict:
    from xpress_jax.decoding.jacobi import candidate_agreement
    from xpress_jax.decoding.refine import refine_block
    from xpress_jax.decoding.settings import DecodeSettings
    from xpress_jax.models.heads import GRUHead, MarkovHead, XPressRefiner
    n, rank = 15, 256
    keys = jax.random.split(jax.random.key(0), 4)
    s = 3.0 * jax.random.normal(keys[0], (batch, n, vocab))
    h = jax.random.normal(keys[1], (batch, n, hidden))
    anchor = jax.random.randint(keys[2], (batch,), 0, vocab)
    table = 0.02 * jax.random.normal(keys[3], (vocab, hidden))
    embed = lambda ids: jnp.take(table, ids, axis=0)  # noqa: E731
    heads = {"markov": MarkovHead(vocab_size=vocab, rank=rank, rngs=nnx.Rngs(1)),
             "gru": GRUHead(vocab_size=vocab, hidden_size=hidden, rngs=nnx.Rngs(2)),
             "xpress": XPressRefiner(vocab_size=vocab, hidden_size=hidden, num_positions=n, rank=rank, rngs=nnx.Rngs(3))}
    x = heads["xpress"]  # give the refiner a non-zero readout so iterations do real work
    x.W_r.set_value(0.05 * jax.random.normal(jax.random.key(9), x.W_r.shape))

    def runner(name, **knobs):
        head, settings = heads.get(name), DecodeSettings(**knobs)
        return jax.jit(lambda s, h, a: refine_block(name, head, s, h, a, embed, settings=settings))

    variants = {"markov": runner("markov"), "gru": runner("gru")}
    for k in (1, 2, 4, 6, 8):
        variants[f"xpress_K{k}"] = runner("xpress", max_iters=k, early_stop=False)
    variants["xpress_K4_early_stop"] = runner("xpress", max_iters=4, early_stop=True)
    for top_k in (8, 32):
        variants[f"xpress_K4_top{top_k}"] = runner("xpress", max_iters=4, early_stop=False, top_k=top_k)
    seconds = {name: _time(lambda f=f: f(s, h, anchor).tokens, reps) for name, f in variants.items()}
    full = variants["xpress_K4"](s, h, anchor).tokens
    agreement = {f"top{k}": float(candidate_agreement(full, variants[f"xpress_K4_top{k}"](s, h, anchor).tokens))
                 for k in (8, 32)}
    base = seconds["markov"]
    return {"seconds_per_call": {k: round(v, 6) for k, v in seconds.items()},
            "ratio_to_markov": {k: round(v / base, 3) for k, v in seconds.items()},
            "candidate_agreement_with_full_vocab_K4": agreement,
            "shapes": {"batch": batch, "positions": n, "vocab": vocab, "hidden": hidden, "rank": rank}}


def main(argv):
    if len(argv) != 2 or argv[1] not in ("heads",):
        raise app.UsageError("usage: python -m xpress_jax.bench heads [--out=DIR]")
    result = {"benchmark": argv[1], "date": datetime.date.today().isoformat(),
              "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              **bench_heads(FLAGS.reps, FLAGS.batch, FLAGS.vocab, FLAGS.hidden)}
    os.makedirs(FLAGS.out, exist_ok=True)
    path = os.path.join(FLAGS.out, f"{argv[1]}-{result['date']}-{result['device'].replace(' ', '_')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
    sys.stderr.write(f"wrote {path}\n")


if __name__ == "__main__":
    app.run(main)
