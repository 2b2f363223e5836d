"""The two papers' evaluation protocol, layered on a target config: `--config=configs/paper_eval.py`
(Qwen3-8B, configs/qwen3_8b.py) or `--config=configs/paper_eval.py:qwen3_4b` (any configs/NAME.py).

- the eight benchmarks, each read from its publisher's test split under `bench/NAME/`
  (docs/evaluation.md, "The papers' benchmarks"; override `eval.datasets` for another place), as many
  questions as the DFlash harness draws, chosen as it chooses them (`num_prompts=0`: GSM8K 128,
  MATH-500 128, AIME 2025 30, HumanEval 164, MBPP 128, LiveCodeBench 128, MT-Bench 80 with both
  turns, Alpaca 128);
- batch 1, 2,048 new tokens, prompts up to 2,048 tokens, the Qwen3 chat template with thinking off
  (how every prompt is rendered, `data/chat.py`);
- temperature 0 here, checked lossless with `--check_lossless`; the temperature-1 pass is the same
  config with `--config.eval.temperature=1.0` (the README's commands run both), with the harness's
  acceptance rule: argmax drafts kept while they equal the target's sampled tokens;
- every decoder the papers compare: DFlash, Markov, GRU and XPress (4 Jacobi iterations, and its tau
  at K = 1, 2, 4, 8), and D-Loop at K = 1 and 4 branches; a D-Loop drafter is its own checkpoint, so
  the methods come as `--checkpoints=dflash=DIR,markov=DIR,gru=DIR,xpress=DIR,dloop=DLOOP_DIR`.

results.md sets the papers' published figures beside the run's when the target is Qwen3-8B or
Qwen3-4B (`report/published.py`).
"""

import importlib
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from xpress_jax.data.questions import PUBLISHED  # noqa: E402


def get_config(target: str = "qwen3_8b") -> ml_collections.ConfigDict:
    config = importlib.import_module(target).get_config()
    config.eval.update(
        datasets=tuple(f"{name}=bench/{name}" for name in PUBLISHED),
        decoders=("dflash", "markov", "gru", "xpress", "dloop"),
        num_prompts=0, acceptance="match", batch_size=1, max_new_tokens=2048, max_prompt_tokens=2048, temperature=0.0,
        max_iters=4, early_stop=True, top_k=0, iteration_sweep=(1, 2, 4, 8), dloop_branches=(1, 4),
        verify_tokens=0, lossless_reference="auto", out_dir="runs/paper_eval")
    return config
