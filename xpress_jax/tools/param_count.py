"""Parameter counts per component of a config, computed abstractly (nothing is allocated).

    python -m xpress_jax.tools.param_count --config=configs/qwen3_8b.py
"""

from __future__ import annotations

import json
import math

import jax
from flax import nnx

from xpress_jax import cli
from xpress_jax.config import target_config
from xpress_jax.models.qwen3 import Qwen3


def count(module: nnx.Module) -> int:
    """Number of parameter scalars in a module (abstract or concrete)."""
    return sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(module, nnx.Param)))


def component_counts(config) -> dict[str, int]:
    target = nnx.eval_shape(lambda: Qwen3(target_config(config), rngs=nnx.Rngs(0)))
    return {"target": count(target)}


def main(config):
    print(json.dumps(component_counts(config)))


if __name__ == "__main__":
    cli.run(main)
