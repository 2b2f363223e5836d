"""The attention-layout change of 2026-12-02, measured side by side in one process: the formulation
before it (written out below) against the package's current `attend`, `Attention.output` and tied
`Qwen3.logits`, on the real decode loop (`decoding.speculative.generate`) and on the pretraining
step's forward and backward pass. Run from the repository root, with nothing else on the CPU:

    python benchmarks/cpu/attention-layout/ab.py --run_dir=runs/repro

It needs the published run's `target/` and `dflash/export/` (random prompts of 300 tokens, 128 new
tokens). Output: one line per case with both timings, their ratio and whether the tokens agree.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import xpress_jax.models.drafter as drafter_module
import xpress_jax.models.layers as layers
import xpress_jax.models.qwen3 as qwen3
from xpress_jax.checkpoints.hf_drafter import load_drafter
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.decoding import speculative
from xpress_jax.train import state as st
from xpress_jax.pretrain.target import next_token_loss


def attend_before(q, k, v, mask):
    batch, q_len, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(batch, q_len, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32) * (head_dim**-0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, layers._MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bksd->btkgd", probs, v).reshape(batch, q_len, heads, head_dim)


def output_before(self, attn):
    return jnp.einsum("bsnd,ndh->bsh", attn, self.o_proj[...].astype(self.dtype))


def logits_before(self, h):
    w = self.embed_tokens[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]
    return jnp.einsum("bsh,hv->bsv", h, w.astype(self.dtype), preferred_element_type=jnp.float32)


CURRENT = dict(attend=qwen3.attend, output=layers.Attention.output, logits=qwen3.Qwen3.logits)


def use(before: bool) -> None:
    qwen3.attend = drafter_module.attend = attend_before if before else CURRENT["attend"]
    layers.Attention.output = output_before if before else CURRENT["output"]
    qwen3.Qwen3.logits = logits_before if before else CURRENT["logits"]


def decode_case(models, prompts, decoder, rounds=3):
    """Median over rounds of the best of two timed runs, ms per verification step, per formulation."""
    times, tokens = {True: [], False: []}, {}
    for _ in range(rounds):
        for before in (True, False):
            use(before)
            speculative._decode.clear_cache()  # retrace the model under this formulation
            speculative.generate(models, prompts, decoder=decoder, max_new_tokens=128)
            best = float("inf")
            for _ in range(2):
                t0 = time.perf_counter()
                out = speculative.generate(models, prompts, decoder=decoder, max_new_tokens=128)
                best = min(best, (time.perf_counter() - t0) / int(out.stats["steps"].max()))
            times[before].append(best * 1e3)
            tokens[before] = out.tokens
    return float(np.median(times[True])), float(np.median(times[False])), tokens[True] == tokens[False]


def pretrain_case(target_dir, rounds=5):
    cfg = qwen3.Qwen3Config.from_dir(target_dir)
    params_graph, params = st.split_params(qwen3.Qwen3(cfg, rngs=nnx.Rngs(0)))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (16, 257)), jnp.int32)
    mask = jnp.ones_like(ids, bool)
    compiled = {}
    for before in (True, False):
        use(before)
        step = jax.jit(jax.value_and_grad(lambda p: next_token_loss(st.merge(params_graph, p), ids, mask)[0]))
        compiled[before] = step.lower(params).compile()
        jax.block_until_ready(compiled[before](params))
    times = {True: [], False: []}
    for _ in range(rounds):
        for before, fn in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params))
            times[before].append((time.perf_counter() - t0) * 1e3)
    losses = {b: float(fn(params)[0]) for b, fn in compiled.items()}
    return float(np.median(times[True])), float(np.median(times[False])), abs(losses[True] - losses[False]) < 1e-4


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run_dir", default="runs/repro")
    parser.add_argument("--context", type=int, default=300, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two formulations")
    parser.add_argument("--cases", default="target@1,dflash@1,target@64,pretrain",
                        help="DECODER@BATCH decode cases and/or pretrain")
    parser.add_argument("--out", default="", help="also write the rows as JSON here")
    args = parser.parse_args()
    target = load_qwen3(f"{args.run_dir}/target")
    drafter = load_drafter(f"{args.run_dir}/dflash/export")
    rng = np.random.default_rng(0)
    rows = []
    for case in args.cases.split(","):
        if case == "pretrain":
            before, after, same = pretrain_case(f"{args.run_dir}/target", rounds=args.rounds + 2)
            rows.append({"case": "pretrain step fwd+bwd, 16 x 256 tokens", "unit": "ms", "before": before,
                         "after": after, "before_over_after": before / after, "same_output": same})
            continue
        decoder, batch = case.split("@")
        prompts = [[int(x) for x in rng.integers(10, 2000, args.context)] for _ in range(int(batch))]
        models = speculative.DecodingModels(target, drafter if decoder != "target" else None)
        before, after, same = decode_case(models, prompts, decoder, rounds=args.rounds)
        rows.append({"case": f"decode {decoder}, batch {batch}, {args.context} context", "unit": "ms/step",
                     "before": before, "after": after, "before_over_after": before / after, "same_output": same})
    for r in rows:
        print(f"{r['case']:<44} before {r['before']:8.2f} {r['unit']}  after {r['after']:8.2f}  "
              f"before/after {r['before_over_after']:.2f}  same output: {r['same_output']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": jax.devices()[0].platform,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
