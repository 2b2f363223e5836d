"""Orbax checkpoints of the train state plus every process's data-iterator state.

Saves are asynchronous, every `save_every` steps, keeping the last `keep`. Orbax writes each
step into a temporary directory and renames it when complete, so a save cut off mid-write is
never listed as the latest step. Restore takes abstract arrays with the *current* mesh's
shardings, so a run can resume on a different mesh.
"""

from __future__ import annotations

import logging
import os
import shutil

import jax
import orbax.checkpoint as ocp

from xpress_jax.errors import CheckpointError
from xpress_jax.train.distributed import gather_json

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str, *, save_every: int, keep: int, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        _remove_unfinished_saves(self.directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=save_every,
                                               enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))
        self._in_flight: int | None = None  # the step an asynchronous save is still writing

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def _failed(self, step: int, error: Exception) -> CheckpointError:
        good = [s for s in self.manager.all_steps() if s != step]
        last = f"the last good checkpoint is step {max(good)}" if good else "no earlier checkpoint exists"
        return CheckpointError(f"saving step {step} to {self.directory} failed ({type(error).__name__}: {error}); "
                               f"{last}")

    def save(self, step: int, state, data_state: dict, *, force: bool = False) -> bool:
        """Starts saving `step` (asynchronously when configured); every process calls it with its own
        `data_state`. A failure (a full disk) is reported naming the step that failed, here or, for
        an asynchronous save, at the next save or close."""
        self._finish_in_flight()
        # Orbax writes a JSON item from process 0 only, and each process's shard of the data has its
        # own position, so the item holds all of them, in process order. It also carries the
        # parameter shapes, so a restore can check them before reading arrays.
        meta = {"iterators": gather_json(data_state),
                "param_shapes": {k: list(v.shape) for k, v in state["params"].items()}}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(meta))
        try:
            started = self.manager.save(step, args=args, force=force)
        except Exception as e:  # noqa: BLE001 - Orbax and the file system raise many types
            raise self._failed(step, e) from e
        if started:
            self._in_flight = step
        return started

    def _finish_in_flight(self) -> None:
        if self._in_flight is None:
            return
        step, self._in_flight = self._in_flight, None
        try:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()
        except Exception as e:  # noqa: BLE001
            raise self._failed(step, e) from e

    def _check_shapes(self, step: int, meta: dict, abstract_state) -> None:
        """A clear error for a checkpoint of another model shape (rather than one from deep inside)."""
        have = {k: tuple(v) for k, v in meta["param_shapes"].items()}
        want = {k: tuple(v.shape) for k, v in abstract_state["params"].items()}
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        if missing or extra or wrong:
            detail = [f"{k}: checkpoint {have[k]} vs model {want[k]}" for k in wrong[:5]]
            raise CheckpointError(
                f"checkpoint {self.directory} step {step} does not match this model: "
                f"{len(wrong)} shape mismatches {detail}, missing {missing[:5]}, unexpected {extra[:5]}")

    def restore(self, step: int, abstract_state):
        """(state, every process's data-iterator state, in process order) at `step`."""
        meta = self.manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
        self._check_shapes(step, meta, abstract_state)
        if "iterators" not in meta:  # a CheckpointError stands: the step is not moved aside as corrupt
            raise CheckpointError(f"checkpoint {self.directory} step {step} lacks the per-process data positions "
                                  "this version resumes from; start a new train.out_dir (train.init_from can "
                                  "take an export)")
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
        restored = self.manager.restore(step, args=args)
        log.info("restored step %d from %s", step, self.directory)
        return restored["state"], restored["data"]["iterators"]

    def restore_latest(self, abstract_state, report=None):
        """(step, state, iterator states) of the newest step that restores, or None without steps.

        A step that fails to read (truncated arrays, a damaged iterator state) is moved aside to
        `<directory>.corrupt/<step>` for inspection, `report` (one line) says so, and the next
        older step is tried. A checkpoint of another model shape is not "corrupt": that error stands.
        """
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                state, data = self.restore(step, abstract_state)
                return step, state, data
            except CheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 - any read failure of this step: try an older one
                aside = os.path.join(self.directory + ".corrupt", str(step))
                log.warning("checkpoint step %d does not restore (%s: %s)", step, type(e).__name__, e)
                if jax.process_index() == 0:
                    os.makedirs(os.path.dirname(aside), exist_ok=True)
                    shutil.move(os.path.join(self.directory, str(step)), aside)
                self.manager.reload()
                if report:
                    report(f"checkpoint step {step} in {self.directory} does not restore ({type(e).__name__}); "
                           f"moved it to {aside} and trying the previous step")
        return None

    def wait(self) -> None:
        self._finish_in_flight()

    def close(self) -> None:
        try:
            self._finish_in_flight()
        finally:
            self.manager.close()



def _remove_unfinished_saves(directory: str) -> None:
    """Orbax writes a step into `<step>.orbax-checkpoint-tmp-*` and renames it when complete; a
    leftover one is a save that was cut off and is never read."""
    if not os.path.isdir(directory) or jax.process_index() != 0:
        return
    for name in os.listdir(directory):
        if ".orbax-checkpoint-tmp" in name:
            log.info("removing an unfinished save: %s", name)
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def restore_run_step(run: str, step: int | None, abstract_state) -> tuple[int, dict]:
    """(step, state) of a run's Orbax checkpoint at `step` (None: the latest), or a clear error
    naming the steps that exist."""
    ckpt = Checkpointer(os.path.join(run, "checkpoints"), save_every=1, keep=1_000_000, async_save=False)
    try:
        steps = sorted(ckpt.manager.all_steps())
        if not steps:
            raise CheckpointError(f"{run}: no checkpoint in {ckpt.directory}")
        if step is None:
            step = steps[-1]
        elif step not in steps:
            raise CheckpointError(f"{run}: no checkpoint at step {step}; steps there: {steps}")
        state, _ = ckpt.restore(step, abstract_state)
    finally:
        ckpt.close()
    return step, state
