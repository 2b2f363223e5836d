"""Parameter counts per component of a config, computed abstractly (nothing is allocated).

    python -m xpress_jax.tools.param_count --config=configs/qwen3_8b.py
"""

from __future__ import annotations

import json
import math

import jax
from flax import nnx

from absl import flags

from xpress_jax import cli
from xpress_jax.models.build import drafter_config, new_drafter, new_head, target_config
from xpress_jax.models.qwen3 import Qwen3


FLAGS = flags.FlagValues()  # no flags beyond --config


def count(module: nnx.Module) -> int:
    """Number of parameter scalars in a module (abstract or concrete)."""
    return sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(module, nnx.Param)))


def component_counts(config) -> dict[str, int]:
    """target, drafter, each head, and xpress_core (the refiner minus its two vocabulary maps)."""
    target_cfg = target_config(config)
    drafter_cfg = drafter_config(config, target_cfg)
    head = lambda name: nnx.eval_shape(lambda: new_head(name, config, drafter_cfg))  # noqa: E731
    refiner = head("xpress")
    return {
        "target": count(nnx.eval_shape(lambda: Qwen3(target_cfg, rngs=nnx.Rngs(0)))),
        "drafter": count(nnx.eval_shape(lambda: new_drafter(config, drafter_cfg))),
        "xpress_refiner": count(refiner),
        "xpress_core": count(refiner) - math.prod(refiner.W_e.shape) - math.prod(refiner.W_r.shape),
        "markov_head": count(head("markov")),
        "gru_head": count(head("gru")),
    }


def main(config):
    print(json.dumps(component_counts(config)))


if __name__ == "__main__":
    cli.run(main, FLAGS)
