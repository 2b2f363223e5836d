"""Orbax checkpoints of the train state plus the data iterator's state.

Saves are asynchronous, every `save_every` steps, keeping the last `keep`. Orbax writes each
step into a temporary directory and renames it when complete, so a save cut off mid-write is
never listed as the latest step. Restore takes abstract arrays with the *current* mesh's
shardings, so a run can resume on a different mesh.
"""

from __future__ import annotations

import logging
import os

import jax
import orbax.checkpoint as ocp

from xpress_jax.errors import CheckpointError

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str, *, save_every: int, keep: int, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=save_every,
                                               enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_state: dict, *, force: bool = False) -> bool:
        # The JSON item carries the parameter shapes, so a restore can check them before reading arrays.
        meta = {"iterator": data_state, "param_shapes": {k: list(v.shape) for k, v in state["params"].items()}}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(meta))
        return self.manager.save(step, args=args, force=force)

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
        meta = self.manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
        self._check_shapes(step, meta, abstract_state)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
        restored = self.manager.restore(step, args=args)
        log.info("restored step %d from %s", step, self.directory)
        return restored["state"], restored["data"]["iterator"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()



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
