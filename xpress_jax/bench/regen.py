"""The regeneration suite: continuous batching (`decoding/continuous.py`) against a static batch on
a question set with mixed answer lengths, side by side in one run at each batch size: useful
answer tokens per decode slot (the share of decode work that made tokens) and tokens/s, on this
process's devices. Both are greedy, so both give the same tokens (checked here too)."""

from __future__ import annotations

import numpy as np

from xpress_jax import timing


def suite(target, prompts: list[list[int]], stop_ids, *, max_new_tokens: int, batches: list[int], devices: int,
          reps: int, progress=lambda partial: None) -> dict:
    from xpress_jax.decoding.continuous import serve_greedy
    from xpress_jax.decoding.speculative import SpecModels, generate
    models = SpecModels(target)

    def static(rows: int):
        """Static batches of `rows` prompts: each device's loop decodes its rows of the batch until its
        longest answer ends (a short last batch is padded with copies of its first prompt)."""
        tokens, slots, useful = [], 0, 0
        per_device = rows // devices
        for start in range(0, len(prompts), rows):
            out = generate(models, prompts[start:start + rows], decoder="target", max_new_tokens=max_new_tokens,
                           stop_ids=stop_ids, pad_multiple=64, devices=devices, min_rows=rows)
            tokens += out.tokens
            steps = list(out.stats["steps"]) + [out.stats["steps"][0]] * (rows - len(out.tokens))
            slots += int(sum(max(steps[d:d + per_device]) for d in range(0, rows, per_device))) * per_device
            useful += int(out.stats["committed"].sum())
        return tokens, slots, useful

    def continuous(rows: int):
        out = serve_greedy(target, prompts, rows=rows // devices, max_new_tokens=max_new_tokens, stop_ids=stop_ids,
                           devices=devices)
        return out.tokens, out.slots, out.useful

    result = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "devices": devices, "batches": {}}
    for rows in batches:
        row = {}
        for name, run in (("static", static), ("continuous", continuous)):
            seconds, (tokens, slots, useful) = timing.fastest_seconds(lambda: run(rows), reps)
            row[name] = {"seconds": seconds, "answer_tokens": sum(len(t) for t in tokens), "decode_slots": slots,
                         "useful_per_slot": useful / slots, "tokens_per_s": sum(len(t) for t in tokens) / seconds,
                         "tokens": tokens}
        lengths = [len(t) for t in row["continuous"]["tokens"]]
        row["same_tokens"] = row["static"].pop("tokens") == row["continuous"].pop("tokens")
        row["speedup"] = row["continuous"]["tokens_per_s"] / row["static"]["tokens_per_s"]
        result["batches"][str(rows)] = row
        progress(result)
    result["answer_lengths"] = {"min": int(np.min(lengths)), "median": float(np.median(lengths)),
                                "max": int(np.max(lengths))}
    return result
