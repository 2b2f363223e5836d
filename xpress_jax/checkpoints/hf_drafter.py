"""DFlash drafter weights in the layout the `dflash` package, SGLang and vLLM load (reference §3):
`config.json` + `model.safetensors`, keys without `model.` prefix, no embedding or LM head."""

from __future__ import annotations

import os

import jax.numpy as jnp
import ml_dtypes
from flax import nnx

from xpress_jax import atomic
from xpress_jax.checkpoints.hf_qwen3 import layer_rules, load_into, save_from
from xpress_jax.checkpoints.keymap import KeyRule
from xpress_jax.checkpoints.safetensors_io import SafetensorsDir
from xpress_jax.errors import CheckpointError, ConfigError, InputError, read_json
from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig

DRAFTER_RULES: tuple[KeyRule, ...] = (
    KeyRule("fc.weight", "fc", in_dims=1),
    KeyRule("hidden_norm.weight", "hidden_norm.weight"),
    KeyRule("norm.weight", "norm.weight"),
) + layer_rules("layers")


def drafter_rules(cfg: DrafterConfig) -> list[KeyRule]:
    return [r for rule in DRAFTER_RULES for r in rule.expand(cfg.num_hidden_layers)]


def check_drafter_dir(path: str, what: str) -> None:
    """A drafter directory named on the command line (`what`: the flag), refused in one line when it
    is missing, is a training run's directory (its drafter is in export/) or holds no drafter."""
    if not os.path.isdir(path):
        raise InputError(f"{what}: directory {path!r} does not exist")
    config_path = os.path.join(path, "config.json")
    is_drafter = os.path.isfile(config_path) and "DFlashDraftModel" in (read_json(config_path).get("architectures")
                                                                       or [])
    exported = os.path.join(path, "export")
    if not is_drafter and os.path.isfile(os.path.join(exported, "config.json")):
        raise InputError(f"{what}: {path} is a training run; its drafter and heads are in {exported} "
                         f"({what}={exported})")
    if not os.path.isfile(config_path):
        raise InputError(f"{what}: {path}: no config.json (expected a DFlash drafter directory)")


def load_drafter(path: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None,
                 scan: bool = False) -> DFlashDrafter:
    """A DFlash drafter directory; `scan`: the layer layout (`layers.layer_stack`)."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise CheckpointError(f"{path}: no config.json")
    hf = read_json(config_path)
    if "DFlashDraftModel" not in (hf.get("architectures") or []):
        raise CheckpointError(f"{config_path}: architectures {hf.get('architectures')} is not DFlashDraftModel")
    try:
        cfg = DrafterConfig.from_hf(hf, source=config_path)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    abstract = nnx.eval_shape(lambda: DFlashDrafter(cfg, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype,
                                                    scan=scan))
    return load_into(abstract, drafter_rules(cfg), SafetensorsDir(path), mesh=mesh)


def save_drafter(drafter: DFlashDrafter, out_dir: str, *, dtype=ml_dtypes.bfloat16) -> None:
    """Writes config.json + a single model.safetensors (bf16 by default, as published drafters are)."""
    os.makedirs(out_dir, exist_ok=True)
    save_from(drafter, drafter_rules(drafter.cfg), out_dir, dtype=dtype, max_shard_bytes=2**62)
    hf = drafter.cfg.to_hf()
    hf["dtype"] = str(jnp.dtype(dtype)) if dtype is not None else "float32"
    atomic.write_json(os.path.join(out_dir, "config.json"), hf)
