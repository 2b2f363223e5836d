"""Reading ml_collections configs: the target section, dtypes, abstract model construction."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections

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
