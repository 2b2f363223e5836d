"""The training loop, for the drafter (`setup.py`) and the target (`xpress_jax.pretrain`)
alike: resume or start, step, log, checkpoint, stop.

What it owns: the checkpoint policy of a run section (`config.RUN`: save_every, keep,
async_checkpointing), exact resumption (train state and data-iterator position restored from
the newest step that reads), JSONL + TensorBoard logs, the progress bar, SIGTERM (save, then
exit), and the non-finite guard (a step whose loss or gradient is not finite changes nothing;
`max_bad_steps` of them in a row stop the run with the last good checkpoint intact).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Callable, Iterator

import jax
from jax.experimental import multihost_utils
import numpy as np
from tqdm import tqdm

from xpress_jax.errors import CheckpointError, XpressError
from xpress_jax.train.checkpointer import Checkpointer
from xpress_jax.train.distributed import process_sum
from xpress_jax.train.tensorboard import ScalarWriter

log = logging.getLogger("xpress_jax.train")


class TrainingStopped(XpressError):
    """Training stopped on purpose (repeated non-finite steps); the last good checkpoint is intact."""


def checkpointer(section, out_dir: str) -> Checkpointer:
    """The run section's checkpoint policy, in OUT/checkpoints."""
    return Checkpointer(os.path.join(out_dir, "checkpoints"), save_every=section.save_every, keep=section.keep,
                        async_save=section.async_checkpointing)


class MetricsLog:
    """OUT/log.jsonl and OUT/tb (TensorBoard), written by process 0 only."""

    def __init__(self, out_dir: str):
        self.enabled = jax.process_index() == 0
        if not self.enabled:
            return
        os.makedirs(out_dir, exist_ok=True)
        self.jsonl = open(os.path.join(out_dir, "log.jsonl"), "a")
        self.tb = ScalarWriter(os.path.join(out_dir, "tb"))

    def write(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        for k, v in metrics.items():
            if isinstance(v, list):
                for i, x in enumerate(v):
                    self.tb.add_scalar(f"{k}/{i + 1}", x, step)
            elif isinstance(v, (int, float)):
                self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            self.tb.close()


def to_python(metrics: dict) -> dict:
    """Device metrics as JSON-ready numbers (vectors as rounded lists)."""
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        out[k] = v.round(5).tolist() if v.ndim else (bool(v) if v.dtype == bool else round(float(v), 6))
    return out


def console(line: str) -> None:
    if jax.process_index() == 0:
        print(line, file=sys.stderr)


def resume(ckpt: Checkpointer, abstract_state, batches) -> tuple[int, object] | None:
    """(step, state) of the newest checkpoint that restores, with `batches` put back at its
    position; None for a fresh run."""
    restored = ckpt.restore_latest(abstract_state, report=console)
    if restored is None:
        return None
    step, state, positions = restored
    if len(positions) != jax.process_count():
        raise CheckpointError(
            f"checkpoint step {step} in {ckpt.directory} was written by {len(positions)} processes and this run has "
            f"{jax.process_count()}: each process resumes its own shard of the data, so resume with "
            f"{len(positions)} processes (the mesh may differ)")
    batches.set_state(positions[jax.process_index()])
    console(f"resumed at step {step} from {ckpt.directory}")  # the user should know a run continued
    return step, state


def run_loop(step_fn: Callable, state, batches: Iterator[dict], *, section, total_steps: int, start: int,
             ckpt: Checkpointer, out_dir: str, desc: str, count_tokens: Callable[[dict], int],
             postfix: dict[str, str] | None = None, stop_after: int | None = None) -> tuple[object, int, dict]:
    """Runs `state, metrics = step_fn(state, next(batches))` from `start` until `total_steps` (or
    `stop_after` steps in this call). `batches` has get_state/set_state (what checkpoints carry);
    metrics hold at least `loss` and `finite`. `postfix` maps a metric to its name on the progress
    bar. Returns (state, step reached, the last logged metrics with tokens and tokens_per_s)."""
    stop = {"signal": None}
    # Several processes each see a SIGTERM at a step of their own. jax.distributed's preemption
    # service catches it in any of them and makes every process agree on one later step to save
    # (the Orbax save is collective: processes saving different steps would hang or mix steps).
    several = jax.process_count() > 1
    previous = None if several else signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(signal=signum))
    logger = MetricsLog(out_dir)
    end = total_steps if stop_after is None else min(total_steps, start + stop_after)
    bar = tqdm(total=total_steps, initial=start, desc=desc, dynamic_ncols=True, disable=jax.process_index() != 0)
    postfix = postfix or {"loss": "loss"}
    last: dict = {}
    tokens, t0 = 0, time.perf_counter()
    step, bad = start, 0  # bad: non-finite steps in a row
    pending = None  # the last dispatched step's `finite` flag, read one step later so dispatch runs ahead

    def check(finite, at: int) -> int:
        count = 0 if bool(finite) else bad + 1
        if count:
            log.warning("step %d: non-finite loss or gradient, update skipped (%d in a row)", at, count)
            if count >= section.max_bad_steps:
                good = ckpt.latest_step()
                kept = (f"The last good checkpoint (step {good}) is intact in {ckpt.directory}" if good is not None
                        else "No checkpoint had been written yet")
                raise TrainingStopped(f"{count} non-finite steps in a row at step {at}; stopped. {kept}")
        return count

    try:
        while step < end:
            local = next(batches)
            tokens += count_tokens(local)
            state, metrics = step_fn(state, local)
            step += 1
            if pending is not None:  # the previous step has finished (or nearly) while this one runs
                bad = check(pending, step - 1)
            pending = metrics["finite"]
            if step % section.log_every == 0 or step == end:
                last = to_python(metrics)
                last["tokens"] = process_sum(tokens)  # since the last log line, on every host
                last["tokens_per_s"] = round(last["tokens"] / (time.perf_counter() - t0), 1)
                tokens, t0 = 0, time.perf_counter()
                logger.write(step, last)
                bar.set_postfix({name: f"{last[k]:.3f}" for k, name in postfix.items() if k in last})
            bar.update(1)
            if several and multihost_utils.reached_preemption_sync_point(step):  # the same step everywhere
                stop["signal"] = signal.SIGTERM
            stopping = stop["signal"] is not None
            # only here does the loop wait for the current step. A stop saves even after a non-finite
            # step: that step changed nothing, so the state is the last finite one
            if stopping or ((step == total_steps or ckpt.manager.should_save(step)) and bool(pending)):
                ckpt.save(step, state, batches.get_state(), force=stopping)
            if stopping:
                log.warning("SIGTERM at step %d: saving and exiting", step)
                break
        if pending is not None:
            bad = check(pending, step)
        if step == total_steps and ckpt.latest_step() != step and bad == 0:
            ckpt.save(step, state, batches.get_state(), force=True)
    finally:
        bar.close()
        ckpt.close()
        logger.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return state, step, last
