"""Qwen3 weights between an HF directory (config.json + safetensors) and the NNX model."""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax import atomic, sharding
from xpress_jax.checkpoints.keymap import KeyRule, dotted, model_variable
from xpress_jax.checkpoints.safetensors_io import CheckpointError, SafetensorsDir, write_dir
from xpress_jax.models.qwen3 import Qwen3, Qwen3Config

log = logging.getLogger(__name__)

# One Qwen3 decoder layer: (HF name inside the layer, model path inside the layer, in_dims)
_LAYER = (
    ("input_layernorm.weight", "input_layernorm.weight", None),
    ("post_attention_layernorm.weight", "post_attention_layernorm.weight", None),
    ("self_attn.q_proj.weight", "self_attn.q_proj", 1),
    ("self_attn.k_proj.weight", "self_attn.k_proj", 1),
    ("self_attn.v_proj.weight", "self_attn.v_proj", 1),
    ("self_attn.o_proj.weight", "self_attn.o_proj", 2),
    ("self_attn.q_norm.weight", "self_attn.q_norm.weight", None),
    ("self_attn.k_norm.weight", "self_attn.k_norm.weight", None),
    ("mlp.gate_proj.weight", "mlp.gate_proj", 1),
    ("mlp.up_proj.weight", "mlp.up_proj", 1),
    ("mlp.down_proj.weight", "mlp.down_proj", 1),
)


def layer_rules(hf_prefix: str) -> tuple[KeyRule, ...]:
    """Decoder-layer rules under an HF prefix ('model.layers' in Qwen3, 'layers' in a DFlash drafter)."""
    return tuple(KeyRule(f"{hf_prefix}.{{i}}.{hf}", f"layers.{path}", in_dims) for hf, path, in_dims in _LAYER)


QWEN3_RULES: tuple[KeyRule, ...] = (
    KeyRule("model.embed_tokens.weight", "embed_tokens"),
    KeyRule("model.norm.weight", "norm.weight"),
    KeyRule("lm_head.weight", "lm_head", in_dims=1),
) + layer_rules("model.layers")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "generation_config.json")


def qwen3_rules(cfg: Qwen3Config) -> list[KeyRule]:
    """The expanded key map for one config (lm_head only when untied)."""
    rules = [r for rule in QWEN3_RULES for r in rule.expand(cfg.num_hidden_layers)]
    if cfg.tie_word_embeddings:
        rules = [r for r in rules if r.hf != "lm_head.weight"]
    return rules


def abstract_qwen3(cfg: Qwen3Config, *, dtype=jnp.float32, param_dtype=jnp.float32, scan: bool = False) -> Qwen3:
    """The model's structure with ShapeDtypeStructs for values: nothing allocated."""
    return nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0), dtype=dtype, param_dtype=param_dtype, scan=scan))


def load_into(abstract: nnx.Module, rules: list[KeyRule], weights: SafetensorsDir, *, mesh=None,
              sharding_rules=None, ignore: tuple[str, ...] = ()) -> nnx.Module:
    """Fills an abstract module tensor by tensor from `weights`, placing each with its sharding.

    Every checkpoint key must be claimed by a rule (or listed in `ignore`), and every rule must
    find its key with the expected shape and a floating dtype; otherwise CheckpointError.
    """
    graphdef, state = nnx.split(abstract)
    variables = dict(nnx.to_flat_state(state))
    by_key = {r.hf: r for r in rules}
    unexpected = sorted(set(weights.keys()) - set(by_key) - set(ignore))
    if unexpected:
        raise CheckpointError(f"{weights.directory}: unexpected keys {unexpected[:8]}"
                              f"{' ...' if len(unexpected) > 8 else ''} (in {weights.file_of(unexpected[0])})")
    missing = sorted(k for k in by_key if k not in set(weights.keys()))
    if missing:
        raise CheckpointError(f"{weights.directory}: missing keys {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    groups: dict[int, tuple] = {}  # id(variable) -> (variable, [(row or None, rule)])
    for rule in rules:
        var, row = model_variable(variables, rule)
        if var is None:
            raise KeyError(f"key map names model path {rule.path!r} (layer {rule.layer}), which the model lacks")
        groups.setdefault(id(var), (var, []))[1].append((row, rule))
    for var, rows in groups.values():
        stacked = rows[0][0] is not None
        layer_shape = tuple(var.shape[1:] if stacked else var.shape)  # what one HF tensor maps to
        sources = []  # the HF tensors in the model's layout, by row of a stack (one if not stacked)
        for _, rule in sorted(rows, key=lambda r: r[0] or 0):
            where = f"{weights.file_of(rule.hf)}: {rule.hf!r}"
            if weights.shape(rule.hf) != rule.hf_shape(layer_shape):
                raise CheckpointError(f"{where} has shape {weights.shape(rule.hf)}, "
                                      f"the model expects {rule.hf_shape(layer_shape)}")
            if not weights.dtype_name(rule.hf).startswith(("F", "BF")):
                raise CheckpointError(f"{where} has dtype {weights.dtype_name(rule.hf)}, expected a float dtype")
            sources.append(rule.to_model(weights.get(rule.hf), layer_shape))  # a view of the mapped file
        if stacked and sorted(r for r, _ in rows) != list(range(var.shape[0])):
            raise KeyError(f"key map covers layers {sorted(r for r, _ in rows)} of a stack of {var.shape[0]}")
        place = sharding.named_sharding(var.get_metadata().get("axes", ()), tuple(var.shape), mesh, sharding_rules)
        var.set_value(jax.make_array_from_callback(tuple(var.shape), place, functools.partial(
            _read_block, sources=sources, stacked=stacked, dtype=var.dtype)))
    unset = [dotted(p) for p, v in variables.items() if isinstance(v.get_value(), jax.ShapeDtypeStruct)]
    if unset:
        raise KeyError(f"model parameters not covered by the key map: {unset}")
    return nnx.merge(graphdef, state)


def _read_block(index: tuple, *, sources: list, stacked: bool, dtype) -> np.ndarray:
    """One device's block of a parameter, read from the mapped HF tensors: for a layer stack,
    index[0] picks layers and the rest indexes each layer's tensor."""
    if not stacked:
        return np.asarray(sources[0][index], dtype=dtype)
    layers, rest = index[0], index[1:]
    return np.stack([np.asarray(x[rest], dtype=dtype) for x in sources[layers]])


def load_qwen3(hf_dir: str, *, dtype=jnp.float32, param_dtype=jnp.float32, mesh=None,
               sharding_rules=None, scan: bool = False) -> Qwen3:
    """Loads a local HF Qwen3 directory (single or sharded safetensors); `scan`: the layer layout."""
    cfg = Qwen3Config.from_dir(hf_dir)
    weights = SafetensorsDir(hf_dir)
    # Tied checkpoints sometimes carry a redundant lm_head copy; transformers ignores it too.
    ignore = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    model = load_into(abstract_qwen3(cfg, dtype=dtype, param_dtype=param_dtype, scan=scan), qwen3_rules(cfg),
                      weights, mesh=mesh, sharding_rules=sharding_rules, ignore=ignore)
    log.info("loaded Qwen3 (%d layers, hidden %d) from %s", cfg.num_hidden_layers, cfg.hidden_size, hf_dir)
    return model


def _to_host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and jax.process_count() > 1 and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def save_from(module: nnx.Module, rules: list[KeyRule], out_dir: str, *, dtype=None,
              max_shard_bytes: int = 5 * 2**30) -> list[str]:
    """Writes the module's parameters under their HF names, one shard in host memory at a time."""
    variables = dict(nnx.to_flat_state(nnx.state(module, nnx.Param)))
    by_key = {r.hf: (r,) + model_variable(variables, r) for r in rules}  # hf -> (rule, variable, row)
    out_dtype = lambda var: np.dtype(dtype or var.dtype)  # noqa: E731
    sizes = [(k, math.prod(var.shape[1:] if row is not None else var.shape) * out_dtype(var).itemsize)
             for k, (_, var, row) in by_key.items()]

    def fetch(keys):
        for key in keys:
            rule, var, row = by_key[key]
            value = var.get_value()
            host = _to_host(value if row is None else value[row])
            yield key, rule.to_hf(host).astype(out_dtype(var))

    return write_dir(out_dir, sizes, fetch, max_shard_bytes=max_shard_bytes)


def save_qwen3(model: Qwen3, out_dir: str, *, tokenizer_dir: str | None = None, dtype=None,
               max_shard_bytes: int = 5 * 2**30) -> None:
    """Writes an HF directory that transformers.AutoModelForCausalLM.from_pretrained loads."""
    os.makedirs(out_dir, exist_ok=True)
    names = save_from(model, qwen3_rules(model.cfg), out_dir, dtype=dtype, max_shard_bytes=max_shard_bytes)
    hf = model.cfg.to_hf()
    first = next(v for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
    hf["dtype"] = str(np.dtype(dtype or first.dtype))
    atomic.write_json(os.path.join(out_dir, "config.json"), hf)
    if tokenizer_dir:
        for name in TOKENIZER_FILES:
            src = os.path.join(tokenizer_dir, name)
            if os.path.isfile(src) and os.path.abspath(src) != os.path.abspath(os.path.join(out_dir, name)):
                shutil.copy(src, os.path.join(out_dir, name))
    log.info("wrote %s (%d weight files)", out_dir, len(names))
