"""Building the models a config names: target (HF directory or random), drafter and heads
(a checkpoint directory or random initialisation)."""

from __future__ import annotations

import json
import logging
import os

from flax import nnx

from xpress_jax.config import drafter_config, dtype, head_kwargs, target_config
from xpress_jax.decoding.speculative import HEAD_OF, SpecModels
from xpress_jax.errors import CheckpointError
from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig
from xpress_jax.models.heads import HEADS
from xpress_jax.models.qwen3 import Qwen3

log = logging.getLogger(__name__)


def _dtypes(config):
    return dict(dtype=dtype(config.dtype), param_dtype=dtype(config.param_dtype))


def target_dtypes(config) -> dict:
    """The frozen target needs no float32 master copy: it is held in target_param_dtype everywhere
    (training, eval, generation), e.g. 16 GB instead of 33 GB for Qwen3-8B."""
    return dict(dtype=dtype(config.dtype), param_dtype=dtype(config.target_param_dtype))


def build_target(config) -> Qwen3:
    """The target of a config: loaded from `target.hf_dir`, or randomly initialised from `seed`."""
    if config.target.hf_dir:
        from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
        return load_qwen3(config.target.hf_dir, **target_dtypes(config))
    log.info("no target.hf_dir: random target (seed %d)", config.seed)
    return Qwen3(target_config(config), rngs=nnx.Rngs(config.seed), **target_dtypes(config))


def build_drafter(config, target: Qwen3, checkpoint: str = "") -> DFlashDrafter:
    """The drafter from a checkpoint directory (DFlash layout), or random from the config."""
    if checkpoint:
        if not os.path.isfile(os.path.join(checkpoint, "config.json")):
            raise CheckpointError(f"{checkpoint}: no config.json (expected a DFlash drafter directory)")
        from xpress_jax.checkpoints.hf_drafter import load_drafter
        drafter = load_drafter(checkpoint, **_dtypes(config))
    else:
        log.info("no checkpoint: random drafter (seed %d)", config.seed + 1)
        drafter = DFlashDrafter(drafter_config(config, target.cfg), rngs=nnx.Rngs(config.seed + 1), **_dtypes(config))
    drafter.cfg.check_target(target.cfg)
    return drafter


def build_head(decoder: str, config, drafter_cfg: DrafterConfig, checkpoint: str = ""):
    """The head `decoder` needs (speculative.HEAD_OF), from `checkpoint/heads/NAME.safetensors`, or
    freshly initialised; None for decoders without one."""
    name = HEAD_OF[decoder]
    if name is None:
        return None
    kwargs = head_kwargs(name, config, drafter_cfg)
    make = lambda: HEADS[name](rngs=nnx.Rngs(config.seed + 2), **kwargs, **_dtypes(config))  # noqa: E731
    if checkpoint:
        from xpress_jax.checkpoints.heads import load_head
        return load_head(nnx.eval_shape(make), checkpoint, name)
    log.info("no checkpoint: freshly initialised %s head", name)
    return make()


def build_models(config, checkpoint: str = "", heads=("dflash",)) -> tuple[Qwen3, DFlashDrafter, dict]:
    target = build_target(config)
    drafter = build_drafter(config, target, checkpoint)
    built = {name: build_head(name, config, drafter.cfg, checkpoint) for name in heads}
    return target, drafter, built


def spec_models(target, drafter, heads: dict, name: str) -> SpecModels:
    if name == "target":
        return SpecModels(target)
    return SpecModels(target, drafter, heads.get(name))


def describe_checkpoint(checkpoint: str) -> dict:
    if not checkpoint:
        return {"checkpoint": None}
    with open(os.path.join(checkpoint, "config.json")) as f:
        return {"checkpoint": checkpoint, "drafter_config": json.load(f)}
