"""The regeneration suite: continuous batching (`decoding/continuous.py`) against a static batch on
a question set with mixed answer lengths, side by side in one run at each batch size: useful
answer tokens per decode slot (the share of decode work that made tokens) and tokens/s, on this
process's devices. Continuous batching runs twice: admitting each prompt at its own bucket
(`continuous`, what regeneration runs) and at the queue's longest bucket (`continuous_queue_bucket`),
each with the share of its wall time spent admitting (its prompts' prefills, each timed alone at
its padded length, over the run's seconds per device). All are greedy, so all give the same
tokens (checked here too)."""

from __future__ import annotations

import numpy as np

from xpress_jax import timing


def suite(target, prompts: list[list[int]], stop_ids, *, max_new_tokens: int, batches: list[int], devices: int,
          reps: int, progress=lambda partial: None) -> dict:
    from xpress_jax.decoding.continuous import OWN_BUCKET, QUEUE_BUCKET, admission_buckets, serve_greedy
    from xpress_jax.decoding.speculative import DecodingModels, generate
    models = DecodingModels(target)
    lengths = [len(p) for p in prompts]
    admitted = {}  # per way of admitting: the prompts prefilled at each padded length
    for admit_at in (OWN_BUCKET, QUEUE_BUCKET):
        buckets, bucket_of = admission_buckets(lengths, admit_at)
        admitted[admit_at] = {str(b): bucket_of.count(i) for i, b in enumerate(buckets) if i in bucket_of}
    padded = sorted({int(b) for counts in admitted.values() for b in counts})
    prefill_seconds = _prefill_seconds(target, padded, max_new_tokens, reps)  # per padded length
    admission_seconds = {way: sum(n * prefill_seconds[int(b)] for b, n in counts.items())
                         for way, counts in admitted.items()}

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

    def continuous(admit_at: str):
        def run(rows: int):
            out = serve_greedy(target, prompts, rows=rows // devices, max_new_tokens=max_new_tokens,
                               stop_ids=stop_ids, devices=devices, admit_at=admit_at)
            return out.tokens, out.slots, out.useful
        return run

    result = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "devices": devices,
              "prompt_lengths": {"min": min(lengths), "median": float(np.median(lengths)), "max": max(lengths)},
              "prefill_seconds": {str(k): v for k, v in sorted(prefill_seconds.items())},
              "admitted_at": admitted, "batches": {}}
    ways = (("static", static, None), ("continuous_queue_bucket", continuous(QUEUE_BUCKET), QUEUE_BUCKET),
            ("continuous", continuous(OWN_BUCKET), OWN_BUCKET))
    for rows in batches:
        row = {}
        for name, run, admit_at in ways:
            seconds, (tokens, slots, useful) = timing.fastest_seconds(lambda: run(rows), reps)
            row[name] = {"seconds": seconds, "answer_tokens": sum(len(t) for t in tokens), "decode_slots": slots,
                         "useful_per_slot": useful / slots, "tokens_per_s": sum(len(t) for t in tokens) / seconds,
                         "tokens": tokens}
            if admit_at:  # the devices admit their shares side by side
                row[name]["admission_share"] = min(admission_seconds[admit_at] / devices / seconds, 1.0)
        answers = [len(t) for t in row["continuous"]["tokens"]]
        tokens = [row[name].pop("tokens") for name, _, _ in ways]
        row["same_tokens"] = all(t == tokens[0] for t in tokens)
        row["speedup"] = row["continuous"]["tokens_per_s"] / row["static"]["tokens_per_s"]
        row["own_bucket_speedup"] = row["continuous"]["tokens_per_s"] / row["continuous_queue_bucket"]["tokens_per_s"]
        result["batches"][str(rows)] = row
        progress(result)
    result["answer_lengths"] = {"min": int(np.min(answers)), "median": float(np.median(answers)),
                                "max": int(np.max(answers))}
    return result


def _prefill_seconds(target, padded: list[int], max_new_tokens: int, reps: int) -> dict[int, float]:
    """The fastest time of one admission's prefill ([1, length] tokens, as `serve_greedy` runs it)
    at each of the `padded` lengths."""
    import jax
    import jax.numpy as jnp

    from xpress_jax.decoding.speculative import prefill
    max_len = max(padded) + max_new_tokens + 1  # the serving loop's cache
    run = jax.jit(lambda ids, n: prefill(target, None, ids, n, max_len, 512)[0])
    seconds = {}
    for length in padded:
        ids, n = jnp.zeros((1, length), jnp.int32), jnp.full((1,), length, jnp.int32)
        jax.block_until_ready(run(ids, n))  # compiled outside the timing
        seconds[length] = timing.fastest_seconds(lambda: jax.block_until_ready(run(ids, n)), max(reps, 3))[0]
    return seconds
