"""The learning-rate schedule of a run, recorded in OUT/schedule.json so that a run whose length
is raised continues its schedule instead of restarting it.

A run starts with one segment, warmup + cosine over train.steps (`state.make_schedule`). Raising
train.steps (or the epochs) on a run with checkpoints is refused unless train.continue_schedule
is set; then a segment is added at the newest checkpoint's step k: a cosine from the schedule's
value at k, lr_k, down to train.lr * train.final_lr_fraction at the new last step. The learning
rate is continuous at k, and every later resume rebuilds the same segments from the record.
"""

from __future__ import annotations

import json
import math
import os

import jax.numpy as jnp
import optax

from xpress_jax import atomic
from xpress_jax.errors import ConfigError, read_json
from xpress_jax.train.state import make_schedule

RECORD = "schedule.json"
LENGTH_FIELDS = ("train.steps", "train.epochs")  # what sets the schedule's length


def continued_cosine(from_lr: float, end_lr: float, steps: int):
    """lr(c) for c = 0..steps: from_lr at 0, cosine down to end_lr at `steps`, end_lr after."""
    def lr(count):
        t = jnp.minimum(count, steps) / steps
        return end_lr + (from_lr - end_lr) * 0.5 * (1.0 + jnp.cos(math.pi * t))
    return lr


def build(section, segments: list[dict]):
    """The optax schedule of recorded segments (each {"from_step", "to_step", "kind", ...})."""
    parts = []
    for seg in segments:
        if seg["kind"] == "warmup_cosine":
            parts.append(make_schedule(section, seg["to_step"]))
        else:
            parts.append(continued_cosine(seg["from_lr"], section.lr * section.final_lr_fraction,
                                          seg["to_step"] - seg["from_step"]))
    if len(parts) == 1:
        return parts[0]
    return optax.join_schedules(parts, [seg["from_step"] for seg in segments[1:]])


def read(out_dir: str) -> list[dict] | None:
    path = os.path.join(out_dir, RECORD)
    return read_json(path, ConfigError)["segments"] if os.path.isfile(path) else None


def save(out_dir: str, segments: list[dict]) -> None:
    atomic.write_text(os.path.join(out_dir, RECORD), json.dumps({"segments": segments}, indent=2))


def plan(config, out_dir: str, total: int, recorded_total: int | None, newest_step: int | None) -> list[dict]:
    """The run's segments for `total` steps: a fresh run's one segment; a resumed run's recorded
    ones (or, from a run without the record, one over `recorded_total`, the length its config.json
    gives), with a continuation added when the length changed and train.continue_schedule allows."""
    t = config.train
    if newest_step is None:
        return [{"from_step": 0, "to_step": total, "kind": "warmup_cosine"}]
    segments = read(out_dir) or [{"from_step": 0, "to_step": recorded_total or total, "kind": "warmup_cosine"}]
    if segments[-1]["to_step"] == total:
        return segments
    old = segments[-1]["to_step"]
    if not t.continue_schedule:
        raise ConfigError(f"{out_dir}: its learning-rate schedule ends at step {old}, and this config runs "
                          f"{total} steps; --config.train.continue_schedule=true continues the schedule from "
                          f"step {newest_step} (the newest checkpoint) to step {total}, or use another train.out_dir")
    if total <= newest_step:
        raise ConfigError(f"train.steps={total}: {out_dir} is at step {newest_step} already")
    from_lr = float(build(t, segments)(newest_step))
    if from_lr <= 0.0:
        raise ConfigError(f"{out_dir}: its schedule has reached lr 0 at step {newest_step} "
                          f"(train.final_lr_fraction=0), so a continued schedule would not train; start a new run "
                          f"from its export (train.init_from={os.path.join(out_dir, 'export')})")
    kept = [s for s in segments if s["from_step"] < newest_step]
    return kept + [{"from_step": newest_step, "to_step": total, "kind": "cosine_from", "from_lr": from_lr}]
