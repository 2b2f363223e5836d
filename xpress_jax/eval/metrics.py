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


def summarise(tokens, stats, seconds, baseline_tps, drafted: int | None = None, loop: bool = False) -> dict:
    """One method's row; `drafted` is the draft positions per step that were verified (and whose
    repetition is counted): B-1, or eval.verify_tokens."""
    new = sum(len(t) for t in tokens)
    steps = int(stats["steps"].sum())
    tps = new / seconds if seconds else float("nan")
    per_prompt = stats["committed"] / np.maximum(stats["steps"], 1)
    drafted_pairs = steps * (drafted - 1) if drafted and drafted > 1 else 0
    return {
        # mean over all verification steps of all prompts (tokens committed per target pass)
        "tau": float(stats["committed"].sum() / steps) if steps else float("nan"),
        # mean over prompts of each prompt's tau, as the official DFlash benchmark reports it
        "tau_per_prompt_mean": round(float(per_prompt.mean()), 4),
        "accept_per_position": (stats["accepted_at"].sum(0) / steps).round(4).tolist() if steps else [],
        "tokens_per_s": round(tps, 2), "speedup": round(tps / baseline_tps, 3) if baseline_tps else None,
        "n_prompts": len(tokens), "new_tokens": new, "steps": steps,
        "mean_iterations": round(float(stats["iterations"].sum()) / steps, 3) if steps else 0.0,
        # drafted positions whose token repeats the previous drafted token (D-Loop's repetition trap)
        "repetition_rate": round(float(stats["draft_repeats"].sum()) / drafted_pairs, 4) if drafted_pairs else None,
        # the same on the drafter's own one-pass argmax block at the same steps: what the head or
        # D-Loop's second pass started from (D-Loop's Table 2 compares these two)
        "drafter_repetition_rate": (round(float(stats["drafter_repeats"].sum()) / drafted_pairs, 4)
                                    if drafted_pairs else None),
        **(loop_summary(stats, steps) if loop else {}),
        # each prompt's committed tokens and target passes: what the paired comparisons resample
        "per_prompt": {"committed": stats["committed"].astype(int).tolist(),
                       "steps": stats["steps"].astype(int).tolist()},
    }


def tau_ratio(row: dict, ref_row: dict) -> dict:
    """tau(row) / tau(ref_row) with its 95% paired-bootstrap interval over the rows' prompts."""
    a, b = row["per_prompt"], ref_row["per_prompt"]
    return paired_tau_ratio(a["committed"], a["steps"], b["committed"], b["steps"])


def ratios_against(rows: dict, ref: str) -> dict:
    """{method: tau_ratio against rows[ref]} for every method of one dataset."""
    return {label: tau_ratio(r, rows[ref]) for label, r in rows.items() if label not in ("target", ref)}


def compare_to_reference(rows: dict) -> None:
    """Adds `tau_vs_reference` to every method of one dataset: its tau over the reference's (dflash
    where measured, else the first method) with a 95% paired-bootstrap interval over prompts."""
    methods = [label for label in rows if label != "target"]
    if len(methods) < 2:
        return
    ref = "dflash" if "dflash" in rows else methods[0]
    for label, ratio in ratios_against(rows, ref).items():
        rows[label]["tau_vs_reference"] = {"reference": ref, **ratio}
