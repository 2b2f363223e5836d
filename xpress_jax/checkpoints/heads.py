"""Causal-head weights as safetensors, keyed by the module's own parameter paths, or by the keys
its registry entry names (`HeadSpec.file_keys`: the Markov head's follow SpecForge's DSpark
layout, so its checkpoints interchange with theirs)."""

from __future__ import annotations

import os

from flax import nnx

from xpress_jax import atomic
from xpress_jax.checkpoints.hf_qwen3 import load_into, save_from
from xpress_jax.checkpoints.keymap import KeyRule, dotted
from xpress_jax.checkpoints.safetensors_io import SafetensorsDir, SafetensorsFile
from xpress_jax.errors import CheckpointError
from xpress_jax.methods import HEADS

def head_rules(module: nnx.Module, name: str) -> list[KeyRule]:
    paths = [dotted(p) for p, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))]
    keys = HEADS[name].file_keys
    return [KeyRule(keys.get(p, p), p) for p in paths]


def head_file(directory: str, name: str) -> str:
    return os.path.join(directory, HEADS[name].checkpoint_file(name))


def head_config(head: nnx.Module, name: str) -> dict:
    """A small config.json for one head: its sizes (read off the tensors) and its equations."""
    shapes = {rule.hf: list(v.shape) for rule, (_, v) in
              zip(head_rules(head, name), nnx.to_flat_state(nnx.state(head, nnx.Param)))}
    return {"head": name, "class": type(head).__name__, **HEADS[name].dims(shapes), "tensors": shapes,
            "formula": HEADS[name].formula}


def save_head(head: nnx.Module, directory: str, name: str, dtype=None) -> str:
    """heads/NAME.safetensors and heads/NAME.config.json beside it."""
    path = head_file(directory, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp_dir = path + ".d"
    save_from(head, head_rules(head, name), tmp_dir, dtype=dtype, max_shard_bytes=2**62)
    os.replace(os.path.join(tmp_dir, "model.safetensors"), path)
    os.rmdir(tmp_dir)
    config_path = path.removesuffix(".safetensors") + ".config.json"
    atomic.write_json(config_path, head_config(head, name))
    return path


class _OneFile(SafetensorsDir):
    def __init__(self, path: str):  # noqa: D401 - a SafetensorsDir over a single named file
        f = SafetensorsFile(path)
        self.directory = path
        self._files = {path: f}
        self._where = {k: f for k in f.keys()}


def load_head(abstract: nnx.Module, directory: str, name: str, mesh=None) -> nnx.Module:
    path = head_file(directory, name)
    if not os.path.isfile(path):
        raise CheckpointError(f"no {name} head in the checkpoint: {path} is missing")
    return load_into(abstract, head_rules(abstract, name), _OneFile(path), mesh=mesh)
