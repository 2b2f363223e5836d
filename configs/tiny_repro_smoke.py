"""The reproduction's pipeline at smoke size (a few minutes on 2 cores): every stage runs and
hands the next one what it needs; the numbers mean nothing. CI runs it (tests/test_reproduce.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tiny_repro  # noqa: E402


def get_config():
    config = tiny_repro.get_config()
    # two target layers and a one-layer drafter: every code path of the full shapes, and compiling
    # (most of a smoke run) a third faster than at three and two
    config.target.arch.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=32)
    config.drafter.num_layers = 1
    config.pretrain.update(steps=6, batch_size=8, max_len=128, vocab_size=2048, code_functions=200,
                           save_every=3, report_prompts=4, report_max_new_tokens=24)
    config.train.update(batch_size=4, num_anchors=8, anchor_chunk=8, log_every=2, save_every=4)
    config.data.max_len = 192
    config.heads.update(rank=8, gru_hidden=16, proj_dim=16)
    config.eval.update(datasets=("gsm8k",), num_prompts=2, max_new_tokens=24, iteration_sweep=(1, 4),
                       time_split=False, max_prompt_tokens=512, candidate_k=4,
                       dloop_branches=(1, 2))
    # no speed passes: their settings are checked without running them (tests/test_reproduce.py) and
    # decoding with the first m drafts verified in tests/test_verify_tokens.py
    config.reproduce.update(regen_records=16, regen_batch_size=8, regen_max_new_tokens=48, drafter_steps=4,
                            head_steps=2, speed_verify_tokens=0)
    return config
