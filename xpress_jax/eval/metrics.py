"""One method's figures from its decode statistics: tau over steps and per prompt, acceptance per
position, repetition (its own and its drafter's one-pass block's), tokens/s and speedup, D-Loop's
kept prefixes, and tau ratios against a reference with 95% paired-bootstrap intervals."""

from __future__ import annotations

import numpy as np

from xpress_jax.report.significance import paired_tau_ratio


def loop_summary(stats, steps: int) -> dict:
    """D-Loop's prefixes: the mean pass-1 prefix length the verified branch kept, and the share of
    steps where it kept none (an empty prefix reruns pass 1's input, so pass 2 changes nothing)."""
    if not steps:
        return {}
    return {"mean_prefix_kept": round(float(stats["prefix_kept"].sum()) / steps, 3),
            "empty_prefix_share": round(float(stats["empty_prefix"].sum()) / steps, 4)}


def per_token_seconds(decoded) -> np.ndarray:
    """[n_responses] decode seconds per output token of each response (the DFlash harness's TPOT)."""
    return decoded.decode_s / np.maximum([len(t) for t in decoded.tokens], 1)


def summarise(decoded, baseline, drafted: int | None = None, loop: bool = False) -> dict:
    """One decoder's row from its responses (`evaluate.Decoded`) and target-only decoding's of the
    same questions; `drafted` is the draft positions per step that were verified (and whose
    repetition is counted): B-1, or eval.verify_tokens."""
    tokens, stats = decoded.tokens, decoded.stats
    new = sum(len(t) for t in tokens)
    steps = int(stats["steps"].sum())
    tps = new / decoded.seconds if decoded.seconds else float("nan")
    baseline_tps = sum(len(t) for t in baseline.tokens) / baseline.seconds if baseline.seconds else float("nan")
    per_prompt = stats["committed"] / np.maximum(stats["steps"], 1)
    drafted_pairs = steps * (drafted - 1) if drafted and drafted > 1 else 0
    tpot, base_tpot = per_token_seconds(decoded), per_token_seconds(baseline)
    return {
        # mean over all verification steps of all responses (tokens committed per target pass, pooled)
        "tau": float(stats["committed"].sum() / steps) if steps else float("nan"),
        # mean over responses of each response's tau: the DFlash harness's figure (bonus token included)
        "tau_per_prompt_mean": round(float(per_prompt.mean()), 4),
        # the same without the bonus token: accepted drafts per target pass (XPress's tau)
        "tau_no_bonus_per_prompt_mean": round(float(per_prompt.mean()) - 1.0, 4),  # (1/n) sum (c - s) / s
        "accept_per_position": (stats["accepted_at"].sum(0) / steps).round(4).tolist() if steps else [],
        # end to end (prefill included), pooled over responses
        "tokens_per_s": round(tps, 2), "speedup": round(tps / baseline_tps, 3),
        # the harness's speedup: target-only's mean decode seconds per output token over this decoder's
        "speedup_harness": round(float(base_tpot.mean() / tpot.mean()), 3) if tpot.mean() > 0 else None,
        "n_prompts": len(tokens), "new_tokens": new, "steps": steps,
        "mean_iterations": round(float(stats["iterations"].sum()) / steps, 3) if steps else 0.0,
        # drafted positions whose token repeats the previous drafted token (D-Loop's repetition trap)
        "repetition_rate": round(float(stats["draft_repeats"].sum()) / drafted_pairs, 4) if drafted_pairs else None,
        # the same on the drafter's own one-pass argmax block at the same steps: what the head or
        # D-Loop's second pass started from (D-Loop's Table 2 compares these two)
        "drafter_repetition_rate": (round(float(stats["drafter_repeats"].sum()) / drafted_pairs, 4)
                                    if drafted_pairs else None),
        **(loop_summary(stats, steps) if loop else {}),
        # each response's committed tokens, target passes and decode seconds per token: what the
        # paired comparisons resample
        "per_prompt": {"committed": stats["committed"].astype(int).tolist(),
                       "steps": stats["steps"].astype(int).tolist(),
                       "decode_s_per_token": [round(float(x), 7) for x in tpot]},
    }


def tau_ratio(row: dict, ref_row: dict) -> dict:
    """tau(row) / tau(ref_row) with its 95% paired-bootstrap interval over the rows' prompts."""
    a, b = row["per_prompt"], ref_row["per_prompt"]
    return paired_tau_ratio(a["committed"], a["steps"], b["committed"], b["steps"])


def ratios_against(rows: dict, ref: str) -> dict:
    """{method: tau_ratio against rows[ref]} for every method of one dataset."""
    return {label: tau_ratio(r, rows[ref]) for label, r in rows.items() if label not in ("target", ref)}


def speedup_interval(row: dict, target_row: dict) -> dict:
    """The harness's speedup (target-only's mean seconds per token over the method's) with its 95%
    paired-bootstrap interval over the responses."""
    a, b = np.asarray(target_row["per_prompt"]["decode_s_per_token"]), np.asarray(row["per_prompt"]["decode_s_per_token"])
    ones = np.ones_like(a)
    return paired_tau_ratio(a, ones, b, ones)  # (sum a / n) / (sum b / n): a ratio of means


def compare_to_reference(rows: dict) -> None:
    """Adds `tau_vs_reference` to every method of one dataset: its tau over the reference's (dflash
    where measured, else the first method) with a 95% paired-bootstrap interval over prompts; and
    `speedup_harness_ci95`, the interval of its harness speedup over target-only's responses."""
    methods = [label for label in rows if label != "target"]
    for label in methods:
        if rows[label].get("speedup_harness") and "target" in rows:
            rows[label]["speedup_harness_ci95"] = speedup_interval(rows[label], rows["target"])["ci95"]
    if len(methods) < 2:
        return
    ref = "dflash" if "dflash" in rows else methods[0]
    for label, ratio in ratios_against(rows, ref).items():
        rows[label]["tau_vs_reference"] = {"reference": ref, **ratio}
