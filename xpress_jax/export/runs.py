"""A run directory's checkpoints as files other frameworks load: a drafter run (`train`) as the
DFlash layout plus heads, a target run (`pretrain`) as an HF Qwen3 directory. The run's own
recorded config says which kind it is and rebuilds its shapes."""

from __future__ import annotations

import json
import os

import ml_collections

from xpress_jax.errors import CheckpointError, InputError

RUN_CONFIG = "config.json"  # what train() records of a drafter run
TARGET_RUN_CONFIG = "run_config.json"  # what pretrain() records of a target run


def read_run_config(run: str) -> tuple[str, ml_collections.ConfigDict]:
    """("drafter" | "target", the config the run was started with)."""
    if not os.path.isdir(run):
        raise InputError(f"--run={run}: no such directory")
    for kind, name in (("target", TARGET_RUN_CONFIG), ("drafter", RUN_CONFIG)):
        path = os.path.join(run, name)
        if os.path.isfile(path) and (kind == "target" or "train" in _json(path)):
            return kind, ml_collections.ConfigDict(_json(path))
    raise InputError(f"--run={run}: not a run directory (no {RUN_CONFIG} of a train run, no {TARGET_RUN_CONFIG} "
                     f"of a pretrain run)")


def _json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def prepare_output(out: str, overwrite: bool) -> None:
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise InputError(f"--out={out} exists and is not empty (pass --overwrite to write into it)")
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".write_test")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        raise InputError(f"--out={out} is not writable ({e.strerror})") from None


def export_drafter_run(run: str, config, out: str, *, step: int | None, dtype_name: str, with_target: bool) -> dict:
    from xpress_jax.config import dtype
    from xpress_jax.train.checkpointer import restore_run_step
    from xpress_jax.train.run import export, host_params
    from xpress_jax.train.setup import Setup
    setup = Setup(config, abstract=True)
    step, state = restore_run_step(run, step, setup.abstract_state)
    export(setup, host_params(state["params"]), out, dtype=dtype(dtype_name))
    written = {"drafter": out, "heads": _head_names(setup)}
    if with_target:
        written["target"] = export_target_of(config, os.path.join(out, "target"), dtype_name)
    return {"step": step, **written}


def _head_names(setup) -> list[str]:
    from xpress_jax.train.state import merge
    return list(merge(setup.graphdef, setup.params).head_names())


def export_target_of(config, out: str, dtype_name: str) -> str:
    """The target a drafter run trained against, as an HF directory with its tokenizer."""
    from xpress_jax.checkpoints.hf_qwen3 import save_qwen3
    from xpress_jax.config import dtype
    from xpress_jax.models.build import build_target
    target = build_target(config)
    save_qwen3(target, out, tokenizer_dir=config.data.tokenizer_dir or config.target.hf_dir, dtype=dtype(dtype_name))
    return out


def export_target_run(run: str, config, out: str, *, step: int | None, dtype_name: str) -> dict:
    from xpress_jax.pretrain.target import export_target
    return export_target(config, run, out, step=step, dtype_name=dtype_name)


def check_has_checkpoints(run: str) -> None:
    """Before anything is created: the run must hold at least one finished Orbax step."""
    directory = os.path.join(run, "checkpoints")
    steps = [d for d in os.listdir(directory) if d.isdigit()] if os.path.isdir(directory) else []
    if not steps:
        raise CheckpointError(f"{run}: no checkpoint in {directory}")
