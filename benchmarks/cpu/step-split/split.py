"""What a speculative step is made of on this CPU, each part timed inside its own jitted
`fori_loop` (so no dispatch or host sync is counted), with the published run's target and DFlash
drafter, 100 committed tokens, batch 1:

- the target's pass over q tokens on top of the cache (q = 1 is a target-only step; q = m + 1 is
  the verification of m drafts), its cache written in place;
- the drafter's pass over its 16-token block, with and without the LM head over 4 drafts, and
  with bfloat16 weights and compute;
- the drafter's context extension by 5 committed tokens;
- the target's own MLP (layer 0's trained weights), and its gate_proj alone, on r rows, float32
  and bfloat16: how matmul time grows with the rows, which decides whether a pass over 5 tokens
  can cost about as much as a pass over one.

    python benchmarks/cpu/step-split/split.py --out=benchmarks/cpu/step-split/split.json

Every figure is the fastest of 5 runs of a loop of 200 iterations, in microseconds per iteration;
`x_target_step` divides by the q = 1 pass measured in the same run.
"""

import argparse
import json
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax.timing import fastest_seconds
from xpress_jax.checkpoints.hf_drafter import load_drafter
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.decoding.speculative import DecodingModels, draft_block, prefill, verify_block
from xpress_jax.models.drafter import block_inputs

ITERS = 200


def per_iteration_us(fn, *args, reps=5):
    seconds, _ = fastest_seconds(lambda: jax.block_until_ready(fn(*args)), reps)  # after a warm-up call
    return seconds / ITERS * 1e6


def phase_costs(models, slots, only=None):
    """{part: us per iteration} (the parts named in `only`, default all); each part's body feeds a
    token back into the next iteration."""
    graphdef, state = nnx.split(models)
    target, drafter = models.target, models.drafter
    taps = drafter.cfg.target_layer_ids
    prompt = jnp.asarray(np.random.default_rng(0).integers(10, 2000, (1, 100)), jnp.int32)
    out, ctx = jax.jit(lambda st: prefill(*_pair(graphdef, st), prompt, jnp.array([100]), slots))(state)

    def target_pass(q):
        def body(m, cache, ctx, last):
            o = verify_block(m.target, cache, last, jnp.broadcast_to(last[:, None], (1, q - 1)), taps if q > 1 else ())
            return o.cache.rollback(cache.lengths), ctx, jnp.argmax(o.logits[:, -1], -1).astype(jnp.int32)
        return body

    def drafter_block(m, cache, ctx, last):
        hidden = m.drafter(m.target.embed(block_inputs(last, drafter.cfg.block_size, drafter.cfg.mask_token_id)), ctx)
        return cache, ctx, jnp.argmax(hidden[:, -1, :8], -1).astype(jnp.int32)

    def drafter_block_lm4(m, cache, ctx, last):
        s, _ = draft_block(m.target, m.drafter, ctx, last, 4)  # [batch, 4, vocab]
        return cache, ctx, jnp.argmax(s[:, -1], -1).astype(jnp.int32)

    def extend_context(m, cache, ctx, last):
        features = jnp.zeros((1, 5, len(taps), target.cfg.hidden_size)) + last[0].astype(jnp.float32)
        grown = m.drafter.extend_context(ctx, features, num_new=jnp.array([5]))
        return cache, grown.rollback(ctx.lengths), last + 1

    parts = {f"target_pass_q{q}": target_pass(q) for q in (1, 2, 3, 5, 9, 16)}
    parts.update(drafter_block=drafter_block, drafter_block_lm_head_4=drafter_block_lm4,
                 extend_context_5=extend_context)
    costs = {}
    for name, body in parts.items():
        if only is not None and name not in only:
            continue
        @jax.jit
        def looped(st, cache, ctx, body=body):
            m = nnx.merge(graphdef, st)
            return jax.lax.fori_loop(0, ITERS, lambda i, c: body(m, *c), (cache, ctx, jnp.array([7], jnp.int32)))
        costs[name] = round(per_iteration_us(looped, state, out.cache, ctx), 1)
    return costs


def _pair(graphdef, state):
    m = nnx.merge(graphdef, state)
    return m.target, m.drafter


def matmul_rows(target, rows=(1, 2, 5, 16)):
    """The target's layer-0 MLP, and its gate_proj alone, on r rows, with float32 and bfloat16
    weights: {"mlp_float32": {r: us}, "gate_proj_float32": ..., ...}."""
    mlp = target.layers[0].mlp
    hidden = target.cfg.hidden_size
    x0 = np.random.default_rng(1).normal(size=(max(rows), hidden)).astype(np.float32)
    result = {}
    for dt in (jnp.float32, jnp.bfloat16):
        w_gate, w_up, w_down = (w[...].astype(dt) for w in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))

        def whole_mlp(x, dt=dt, w_gate=w_gate, w_up=w_up, w_down=w_down):
            h = x.astype(dt)
            act = jax.nn.silu(jnp.dot(h, w_gate, preferred_element_type=jnp.float32))
            act = act * jnp.dot(h, w_up, preferred_element_type=jnp.float32)
            return jnp.dot(act.astype(dt), w_down, preferred_element_type=jnp.float32)

        def gate_alone(x, dt=dt, w_gate=w_gate):
            y = jnp.dot(x.astype(dt), w_gate, preferred_element_type=jnp.float32)  # [rows, intermediate]
            return y.reshape(x.shape[0], -1, hidden).sum(1)  # every column used, so none is pruned

        for name, fn in (("mlp", whole_mlp), ("gate_proj", gate_alone)):
            looped = jax.jit(lambda x, fn=fn: jax.lax.fori_loop(0, ITERS, lambda i, x: x + 1e-3 * fn(x), x))
            result[f"{name}_{jnp.dtype(dt).name}"] = {
                r: round(per_iteration_us(looped, jnp.asarray(x0[:r])), 1) for r in rows}
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="runs/repro", help="a reproduction run directory")
    ap.add_argument("--slots", default="320,640", help="cache slots, comma-separated")
    ap.add_argument("--out", default="", help="write the figures here as JSON")
    args = ap.parse_args()
    target = load_qwen3(f"{args.run}/target")
    models = DecodingModels(target, load_drafter(f"{args.run}/dflash/export"))
    report = {"date": time.strftime("%Y-%m-%d"), "device": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "jax": jax.__version__,
              "iterations_per_loop": ITERS, "parts_us": {}, "matmul_rows_us": matmul_rows(target)}
    for slots in (int(s) for s in args.slots.split(",")):
        costs = phase_costs(models, slots)
        step = costs["target_pass_q1"]
        # the drafter with bfloat16 weights and compute (its export is stored in bfloat16)
        bf16 = DecodingModels(target, load_drafter(f"{args.run}/dflash/export", dtype=jnp.bfloat16,
                                               param_dtype=jnp.bfloat16))
        costs["drafter_block_bfloat16"] = phase_costs(bf16, slots, only={"drafter_block"})["drafter_block"]
        report["parts_us"][slots] = {k: {"us": v, "x_target_step": round(v / step, 2)} for k, v in costs.items()}
        for k, v in costs.items():
            print(f"{slots} slots  {k:26s} {v:8.1f} us  {v / step:5.2f} target steps", flush=True)
    for what, row in report["matmul_rows_us"].items():
        print(f"{what:19s} " + "  ".join(f"{r} rows {us:.1f} us ({us / row[1]:.2f}x)" for r, us in row.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
