"""Reading ml_collections configs: the target section, dtypes, abstract model construction."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections

from xpress_jax.errors import ConfigError
from xpress_jax.models.drafter import DrafterConfig
from xpress_jax.models.qwen3 import Qwen3Config

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype(name: str):
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def target_config(config: ml_collections.ConfigDict) -> Qwen3Config:
    """The target's shape: from `target.hf_dir`'s config.json when given, else `target.arch`."""
    if config.target.hf_dir:
        return Qwen3Config.from_dir(config.target.hf_dir)
    return Qwen3Config.from_hf({"model_type": "qwen3", **config.target.arch.to_dict()},
                               source="config.target.arch")


def target_arch(**fields) -> ml_collections.ConfigDict:
    """A `target` section: where the checkpoint is (empty: random init) and its HF-named shape."""
    return ml_collections.ConfigDict({"hf_dir": "", "arch": fields})


def drafter_section(num_layers: int = 5, target_layer_ids=(), block_size: int = 16,
                    mask_token_id: int = 151669) -> ml_collections.ConfigDict:
    """A `drafter` section; empty target_layer_ids means DFlash's default spacing."""
    return ml_collections.ConfigDict({"num_layers": num_layers, "target_layer_ids": tuple(target_layer_ids),
                                      "block_size": block_size, "mask_token_id": mask_token_id})


def heads_section(rank: int = 256, gru_hidden: int = 256, proj_dim: int = 256) -> ml_collections.ConfigDict:
    """Sizes of the causal heads (XPress refiner and the Markov / GRU baselines)."""
    return ml_collections.ConfigDict({"rank": rank, "gru_hidden": gru_hidden, "proj_dim": proj_dim})


def drafter_config(config: ml_collections.ConfigDict, target: Qwen3Config | None = None) -> DrafterConfig:
    target = target or target_config(config)
    d = config.drafter
    return DrafterConfig.from_target(target, num_layers=d.num_layers, target_layer_ids=tuple(d.target_layer_ids) or None,
                                     block_size=d.block_size, mask_token_id=d.mask_token_id)


def head_kwargs(name: str, config: ml_collections.ConfigDict, drafter: DrafterConfig) -> dict:
    """Constructor arguments of head `name` for this config."""
    base = {"vocab_size": drafter.vocab_size, "hidden_size": drafter.hidden_size}
    h = config.heads
    if name == "xpress":
        return {**base, "num_positions": drafter.block_size - 1, "rank": h.rank}
    if name == "markov":
        return {**base, "rank": h.rank}
    if name == "gru":
        return {**base, "gru_hidden": h.gru_hidden, "proj_dim": h.proj_dim}
    raise ConfigError(f"unknown head {name!r}; choose one of xpress, markov, gru")
