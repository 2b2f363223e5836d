"""The official PyTorch `dflash` package and this JAX code, side by side on this CPU: the same
published target and DFlash drafter, the same prompts, greedy, each framework's target-only
baseline and its speculative decoding, in one run.

    python benchmarks/cpu/torch-reference/run.py --out=benchmarks/cpu/torch-reference/run.json

PyTorch runs `dflash.model.dflash_generate` as the official benchmark does (block_size=1 is its
target-only baseline, the drafter's block its speculative decoding; float32, eager, torch's
default threads). Its speedup is reported both as the official benchmark defines it (decode time
per output token, prefill excluded) and in wall time per prompt. JAX runs
`xpress_jax.decoding.speculative.generate` (one compiled program per decoder, compilation
excluded), timed in wall time per prompt, prefill included. Methods are alternated prompt by
prompt so that any load on the machine falls on all of them.
"""

import argparse
import json
import time


def load_torch(run):
    """The run's exported target (transformers) and DFlash drafter (the official class), float32."""
    import torch
    import transformers
    from dflash.model import DFlashDraftModel
    target = transformers.AutoModelForCausalLM.from_pretrained(f"{run}/target", dtype=torch.float32).eval()
    return target, DFlashDraftModel.from_pretrained(f"{run}/dflash/export").float().eval()


def torch_side(target, drafter, max_new, stops):
    import torch
    from dflash import model as dflash_model
    from dflash.model import dflash_generate
    dflash_model._cuda_time = time.perf_counter  # its stats use torch.cuda.synchronize; a clock does here

    def decode(prompt, block):
        t0 = time.perf_counter()
        with torch.inference_mode():
            r = dflash_generate(drafter, target, torch.tensor([prompt]), max_new, stops, temperature=0.0,
                                block_size=block, return_stats=True)
        wall = time.perf_counter() - t0
        return {"tokens": r.output_ids[0, len(prompt):].tolist(), "wall_s": wall,
                "decode_s": r.time_per_output_token * r.num_output_tokens, "steps": len(r.acceptance_lengths)}
    return decode, drafter.block_size, torch.get_num_threads()


def torch_pass_costs(target, drafter, context=200, reps=50):
    """Eager PyTorch's target pass over 1, 5 and 16 new tokens on a `context`-token cache (then
    cropped back), and the drafter's pass over a 16-token block with its logits, each the median of
    `reps` calls: how a one-token step's time compares with a verification's there."""
    import statistics

    import torch
    from dflash.model import _crop_to, _make_cache, extract_context_feature
    ids = torch.randint(10, 2000, (1, context + 16))
    pos = torch.arange(context + 16)[None]

    def median_ms(fn):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return round(statistics.median(times) * 1e3, 3)
    with torch.inference_mode():
        cache = _make_cache(target.config)
        out = target(ids[:, :context], position_ids=pos[:, :context], past_key_values=cache, use_cache=True,
                     output_hidden_states=True)
        costs = {}
        for n in (1, 5, 16):
            def target_pass(n=n):
                target(ids[:, context:context + n], position_ids=pos[:, context:context + n], past_key_values=cache,
                       use_cache=True, output_hidden_states=n > 1)
                _crop_to(cache, context)
            costs[f"target_{n}_tokens_ms"] = median_ms(target_pass)
        dcache = _make_cache(drafter.config)
        hidden = extract_context_feature(out.hidden_states, drafter.target_layer_ids)  # [1, context, taps * H]
        noise = target.get_input_embeddings()(ids[:, context:context + 16])

        def drafter_pass():  # as dflash_generate runs it: 3 new context tokens, the block, its logits
            h = drafter(target_hidden=hidden[:, -3:], noise_embedding=noise, position_ids=pos[:, context - 3:context + 16],
                        past_key_values=dcache, use_cache=True)
            drafter.compute_logits(h[:, 1:], target.lm_head)
            _crop_to(dcache, context - 3)
        # the drafter's context: every token but the newest 3 (a block's keys are cropped off again)
        drafter(target_hidden=hidden[:, :-3], noise_embedding=noise, position_ids=pos[:, :context + 13],
                past_key_values=dcache, use_cache=True)
        _crop_to(dcache, context - 3)
        costs["drafter_16_block_with_logits_ms"] = median_ms(drafter_pass)
    one = costs["target_1_tokens_ms"]
    return {**costs, "context": context,
            "in_target_steps": {k.replace("_ms", ""): round(v / one, 3) for k, v in costs.items()}}


def jax_side(run, prompts, max_new, stops):
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
    from xpress_jax.decoding.settings import DecodeSettings
    from xpress_jax.decoding.speculative import DecodingModels, generate
    target = load_qwen3(f"{run}/target")
    models = {"target": DecodingModels(target), "dflash": DecodingModels(target, load_drafter(f"{run}/dflash/export"))}
    block = models["dflash"].drafter.cfg.block_size
    pad = -(-max(map(len, prompts)) // 64) * 64  # every prompt padded alike: one program per decoder
    max_len = pad + max_new + block

    def decode(prompt, decoder, verify_tokens=0):
        kw = dict(decoder=decoder, max_new_tokens=max_new, stop_ids=stops, max_len=max_len, pad_multiple=pad,
                  settings=DecodeSettings(verify_tokens=verify_tokens) if verify_tokens else None)
        t0 = time.perf_counter()
        out = generate(models["dflash" if decoder != "target" else "target"], [prompt], **kw)
        return {"tokens": out.tokens[0], "wall_s": time.perf_counter() - t0, "steps": int(out.stats["steps"][0])}
    return decode


def measure_set(methods, prompts, ds):
    """Decodes the set's prompts with every method, alternating the order prompt by prompt; returns
    each method's totals, its speedup over its own framework's target-only run, and prints them."""
    rows = {name: [] for name in methods}
    for i, p in enumerate(prompts):
        for name in (list(methods) if i % 2 == 0 else list(reversed(methods))):
            rows[name].append(methods[name](p))
    summary = {}
    for name, rs in rows.items():
        new = sum(len(r["tokens"]) for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        steps = sum(r["steps"] for r in rs)
        # greedy decoding is the target's: each prompt's tokens against JAX target-only's, over the shorter
        same = sum(a["tokens"][:n] == b["tokens"][:n] for a, b in zip(rs, rows["jax/target"])
                   for n in [min(len(a["tokens"]), len(b["tokens"]))])
        summary[name] = {
            "new_tokens": new, "wall_s": round(wall, 3), "tokens_per_s": round(new / wall, 1), "steps": steps,
            # tokens committed per verification step; the prefill's first token has no step (as eval's tau)
            "tau": round((new - len(rs)) / steps, 3), "ms_per_step": round(wall / steps * 1e3, 3),
            "prompts_matching_jax_target": same}
        if "decode_s" in rs[0]:
            summary[name]["decode_s"] = round(sum(r["decode_s"] for r in rs), 3)
    for name, s in summary.items():
        base = summary[name.split("/")[0] + "/target"]
        s["speedup_wall"] = round(s["tokens_per_s"] / base["tokens_per_s"], 3)
        s["step_cost_in_target_steps"] = round(s["ms_per_step"] / base["ms_per_step"], 3)
    # the official benchmark's figure: target-only time per output token over DFlash's, prefill excluded
    t, d = summary["torch/target"], summary["torch/dflash"]
    d["speedup_official_tpot"] = round((t["decode_s"] / t["new_tokens"]) / (d["decode_s"] / d["new_tokens"]), 3)
    print(f"{ds} ({len(prompts)} prompts)")
    for name, s in summary.items():
        extra = f", official tpot speedup {s['speedup_official_tpot']:.2f}x" if "speedup_official_tpot" in s else ""
        print(f"  {name:14s} tau {s['tau']:.2f}  {s['tokens_per_s']:7.1f} tokens/s  {s['ms_per_step']:6.2f} ms/step "
              f"({s['step_cost_in_target_steps']:.2f} target steps)  speedup {s['speedup_wall']:.2f}x{extra}  "
              f"same tokens as jax/target: {s['prompts_matching_jax_target']}/{len(prompts)}", flush=True)
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="runs/repro", help="a reproduction run directory")
    ap.add_argument("--datasets", default="gsm8k,humaneval,mt_bench,alpaca")
    ap.add_argument("--num_prompts", type=int, default=16, help="per data set (the eval's first N questions)")
    ap.add_argument("--max_new_tokens", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="", help="write the figures here as JSON")
    args = ap.parse_args()

    from xpress_jax.data.chat import load_tokenizer, prompt_ids
    from xpress_jax.data.questions import load_questions
    tok = load_tokenizer(f"{args.run}/target")
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    sets = {ds: [prompt_ids(tok, [{"role": "user", "content": q}]) for q in load_questions(ds, args.num_prompts)]
            for ds in args.datasets.split(",")}
    every = [p for ps in sets.values() for p in ps]
    torch_target, torch_drafter = load_torch(args.run)
    torch_decode, block, threads = torch_side(torch_target, torch_drafter, args.max_new_tokens, stops)
    jax_decode = jax_side(args.run, every, args.max_new_tokens, stops)
    methods = {
        "torch/target": lambda p: torch_decode(p, 1),
        "torch/dflash": lambda p: torch_decode(p, block),
        "jax/target": lambda p: jax_decode(p, "target"),
        "jax/dflash": lambda p: jax_decode(p, "dflash"),
        "jax/dflash_v4": lambda p: jax_decode(p, "dflash", verify_tokens=4),
    }
    for fn in methods.values():  # warm-up: compilation (JAX) and first-call allocation (torch)
        fn(every[0])

    import torch
    from xpress_jax.bench.__main__ import machine
    report = {"machine": {**machine(), "torch": torch.__version__, "torch_threads": threads},
              "max_new_tokens": args.max_new_tokens, "rounds": []}
    report["torch_pass_costs"] = torch_pass_costs(torch_target, torch_drafter)
    print("eager PyTorch passes:", report["torch_pass_costs"], flush=True)
    for r in range(args.rounds):
        print(f"\nround {r + 1}")
        report["rounds"].append({ds: measure_set(methods, prompts, ds) for ds, prompts in sets.items()})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
