"""Declarative maps between HF tensor names/layouts and model parameter paths/layouts.

A rule says where an HF tensor lives in the model and how its layout differs. PyTorch Linear
weights are [out, in]; the model keeps [in..., out...] with heads split out, so a Linear becomes
"transpose, then reshape" and its inverse "reshape, then transpose". `in_dims` is the number of
leading model dims that make up HF's `in` dimension (None: same layout, copied).

HF names one tensor per decoder layer (`model.layers.3.self_attn.q_proj.weight`); a layer rule's
expansion gives each HF key its `layer`. The model holds its layers either as a list
(`layers.3.self_attn.q_proj`) or stacked for a scan (`layers.self_attn.q_proj`, [layers, ...]);
`model_variable` finds the parameter, and the index into it, in either layout.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class KeyRule:
    hf: str  # HF key; "{i}" stands for a layer index
    path: str  # dotted model path; for a layer rule, the path inside `layers` of either layout
    in_dims: int | None = None
    layer: int | None = None  # set by `expand`: which layer the HF key holds

    def expand(self, num_layers: int) -> list["KeyRule"]:
        if "{i}" not in self.hf:
            return [self]
        return [dataclasses.replace(self, hf=self.hf.format(i=i), layer=i) for i in range(num_layers)]

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


def model_variable(variables: dict, rule: KeyRule):
    """(the nnx variable a rule maps to, the index of its layer in it or None) from a flat state
    {path tuple: variable}: layer i of a list is its own variable, of a stack a row of one."""
    if rule.layer is None:
        return variables.get(path_tuple(rule.path)), None
    head, rest = path_tuple(rule.path)[:1], path_tuple(rule.path)[1:]
    if head + (rule.layer,) + rest in variables:
        return variables[head + (rule.layer,) + rest], None
    return variables.get(head + rest), rule.layer


def path_tuple(path: str) -> tuple:
    """'layers.self_attn.q_proj' -> ('layers', 'self_attn', 'q_proj') as nnx flat states spell it
    (digits become list indices, as in a module list's path)."""
    return tuple(int(p) if p.isdigit() else p for p in path.split("."))


def dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)
