"""Declarative maps between HF tensor names/layouts and model parameter paths/layouts.

A rule says where an HF tensor lives in the model and how its layout differs. PyTorch Linear
weights are [out, in]; the model keeps [in..., out...] with heads split out, so a Linear becomes
"transpose, then reshape" and its inverse "reshape, then transpose". `in_dims` is the number of
leading model dims that make up HF's `in` dimension (None: same layout, copied).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class KeyRule:
    hf: str  # HF key; "{i}" stands for a layer index
    path: str  # dotted model path, same "{i}"
    in_dims: int | None = None

    def expand(self, num_layers: int) -> list["KeyRule"]:
        if "{i}" not in self.hf:
            return [self]
        return [KeyRule(self.hf.format(i=i), self.path.format(i=i), self.in_dims) for i in range(num_layers)]

    def hf_shape(self, model_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.in_dims is None:
            return tuple(model_shape)
        return (math.prod(model_shape[self.in_dims:]), math.prod(model_shape[:self.in_dims]))

    def to_model(self, x: np.ndarray, model_shape: tuple[int, ...]) -> np.ndarray:
        """HF layout -> model layout (a view where possible)."""
        return x if self.in_dims is None else x.T.reshape(model_shape)

    def to_hf(self, y: np.ndarray) -> np.ndarray:
        """Model layout -> HF layout; the exact inverse of to_model."""
        if self.in_dims is None:
            return y
        return y.reshape(math.prod(y.shape[:self.in_dims]), -1).T


def path_tuple(path: str) -> tuple:
    """'layers.3.self_attn.q_proj' -> ('layers', 3, 'self_attn', 'q_proj') as nnx flat states spell it."""
    return tuple(int(p) if p.isdigit() else p for p in path.split("."))


def dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)
