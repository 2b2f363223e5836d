"""The main job (python -m xpress_jax.reproduce): causal heads trained on the shipped tiny
target's frozen DFlash drafter, then evaluated against target-only decoding and DFlash alone.

It starts from the two checkpoints that ship in xpress_jax/assets/tiny (the 3.0M-parameter Qwen3
target and its 2-layer DFlash drafter, both made by configs/tiny_repro.py), has the target answer
512 of its training questions (the heads' data), trains the XPress refiner and the DSpark Markov
head on the frozen drafter (100 steps each), and evaluates all three drafters against target-only
decoding on 16 GSM8K, HumanEval, MT-Bench and Alpaca questions each, at temperature 0. Measured
time: benchmarks/tiny/heads/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tiny_repro  # noqa: E402

from xpress_jax import assets  # noqa: E402


def get_config():
    config = tiny_repro.get_config()
    config.reproduce.update(out_dir="runs/heads", target_from=assets.TINY_TARGET, dflash_from=assets.TINY_DFLASH,
                            train_stages=("xpress.frozen", "markov"), regen_records=512, temperatures=(0.0,),
                            speed_verify_tokens=0)
    config.train.out_dir = "runs/heads"
    config.eval.update(iteration_sweep=(1, 2, 4, 8), candidate_k=0, dloop_branches=(1,))
    return config
