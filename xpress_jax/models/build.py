"""Building every model a config names, in one place with one dtype policy: the target (HF
directory or random), the drafter (checkpoint directory or random), the heads (`methods.HEADS`,
from `DIR/heads/` or fresh) and the trainable bundle. Training, eval, generation, sampling, export
and the tools all build through here."""

from __future__ import annotations

import json
import logging
import os

import ml_collections
from flax import nnx

from xpress_jax.config import dtype
from xpress_jax.errors import CheckpointError, ConfigError
from xpress_jax.methods import HEAD_OF, HEADS, head_kwargs
from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig
from xpress_jax.models.qwen3 import Qwen3, Qwen3Config

log = logging.getLogger(__name__)


# ---- shapes ----

def target_config(config: ml_collections.ConfigDict) -> Qwen3Config:
    """The target's shape: from `target.hf_dir`'s config.json when given, else `target.arch`."""
    if config.target.hf_dir:
        return Qwen3Config.from_dir(config.target.hf_dir)
    return Qwen3Config.from_hf({"model_type": "qwen3", **config.target.arch.to_dict()},
                               source="config.target.arch")


def drafter_config(config: ml_collections.ConfigDict, target: Qwen3Config | None = None) -> DrafterConfig:
    target = target or target_config(config)
    d = config.drafter
    return DrafterConfig.from_target(target, num_layers=d.num_layers, target_layer_ids=tuple(d.target_layer_ids) or None,
                                     block_size=d.block_size, mask_token_id=d.mask_token_id)


# ---- dtypes ----

def trainable_dtypes(config) -> dict:
    """What trains (drafter, heads): compute in `dtype`, float32 master weights (`param_dtype`)."""
    return dict(dtype=dtype(config.dtype), param_dtype=dtype(config.param_dtype))


def target_dtypes(config) -> dict:
    """The frozen target needs no float32 master copy: it is held in target_param_dtype everywhere
    (training, eval, generation), e.g. 16 GB instead of 33 GB for Qwen3-8B."""
    return dict(dtype=dtype(config.dtype), param_dtype=dtype(config.target_param_dtype))


# ---- models ----

def build_target(config, *, mesh=None, abstract: bool = False) -> Qwen3:
    """The target of a config: loaded from `target.hf_dir` (sharded over `mesh` when given), or
    randomly initialised from `seed`; `abstract`: shapes and dtypes only, nothing allocated."""
    kw = target_dtypes(config)
    if config.target.hf_dir and not abstract:
        from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
        return load_qwen3(config.target.hf_dir, mesh=mesh, **kw)
    if not config.target.hf_dir:
        log.info("no target.hf_dir: random target (seed %d)", config.seed)
    make = lambda: Qwen3(target_config(config), rngs=nnx.Rngs(config.seed), **kw)  # noqa: E731
    return nnx.eval_shape(make) if abstract else make()


def new_drafter(config, dcfg: DrafterConfig) -> DFlashDrafter:
    return DFlashDrafter(dcfg, rngs=nnx.Rngs(config.seed + 1), **trainable_dtypes(config))


def new_head(name: str, config, dcfg: DrafterConfig) -> nnx.Module:
    """A freshly initialised head `name` (a key of methods.HEADS) sized by the config."""
    if name not in HEADS:
        raise ConfigError(f"unknown head {name!r}; choose from {', '.join(HEADS)}")
    return HEADS[name].module(rngs=nnx.Rngs(config.seed + 2), **head_kwargs(name, config.heads, dcfg),
                              **trainable_dtypes(config))


def build_drafter(config, target: Qwen3, checkpoint: str = "") -> DFlashDrafter:
    """The drafter from a checkpoint directory (DFlash layout), or random from the config."""
    if checkpoint:
        if not os.path.isfile(os.path.join(checkpoint, "config.json")):
            raise CheckpointError(f"{checkpoint}: no config.json (expected a DFlash drafter directory)")
        from xpress_jax.checkpoints.hf_drafter import load_drafter
        drafter = load_drafter(checkpoint, **trainable_dtypes(config))
    else:
        log.info("no checkpoint: random drafter (seed %d)", config.seed + 1)
        drafter = new_drafter(config, drafter_config(config, target.cfg))
    drafter.cfg.check_target(target.cfg)
    return drafter


def build_head(decoder: str, config, drafter_cfg: DrafterConfig, checkpoint: str = ""):
    """The head `decoder` needs (methods.HEAD_OF), from `checkpoint/heads/NAME.safetensors`, or
    freshly initialised; None for decoders without one."""
    name = HEAD_OF[decoder]
    if name is None:
        return None
    if checkpoint:
        from xpress_jax.checkpoints.heads import load_head
        return load_head(nnx.eval_shape(lambda: new_head(name, config, drafter_cfg)), checkpoint, name)
    log.info("no checkpoint: freshly initialised %s head", name)
    return new_head(name, config, drafter_cfg)


def build_trainable(config, target_cfg: Qwen3Config, *, abstract: bool = False):
    """The drafter and the `train.heads` being trained, randomly initialised (train.init_from
    loads trained weights over them later); `abstract`: shapes only."""
    from xpress_jax.train.state import Trainable
    dcfg = drafter_config(config, target_cfg)
    unknown = [h for h in config.train.heads if h not in HEADS]
    if unknown:
        raise ConfigError(f"unknown heads {unknown} in train.heads; choose from {', '.join(HEADS)}")
    make = lambda: Trainable(new_drafter(config, dcfg),  # noqa: E731
                             {h: new_head(h, config, dcfg) for h in config.train.heads})
    return nnx.eval_shape(make) if abstract else make()


def build_models(config, checkpoint: str = "", heads=("dflash",)) -> tuple[Qwen3, DFlashDrafter, dict]:
    """The target, the drafter of `checkpoint` (random without one) and each named head."""
    target = build_target(config)
    drafter = build_drafter(config, target, checkpoint)
    built = {name: build_head(name, config, drafter.cfg, checkpoint) for name in heads}
    return target, drafter, built


def describe_checkpoint(checkpoint: str) -> dict:
    if not checkpoint:
        return {"checkpoint": None}
    with open(os.path.join(checkpoint, "config.json")) as f:
        return {"checkpoint": checkpoint, "drafter_config": json.load(f)}
