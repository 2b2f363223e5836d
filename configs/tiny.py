"""A tiny random Qwen3 for this CPU machine: the default of every command, minutes to train.

A 512-token vocabulary: UTF-8 bytes, the chat specials at 256.. (data/byte_tokenizer.py) and the
drafter's mask token at 511. Trains on the GSM8K answers that ship in xpress_jax/assets/data.
"""

import os

import ml_collections

from xpress_jax.assets import data_root
from xpress_jax.config import dflash_recipe, drafter_section, heads_section, target_arch


def get_config() -> ml_collections.ConfigDict:
    config = dflash_recipe(
        target=target_arch(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                           rope_theta=1_000_000.0, tie_word_embeddings=True, max_position_embeddings=4096),
        drafter=drafter_section(num_layers=2, target_layer_ids=(1, 2), block_size=16, mask_token_id=511),
        heads=heads_section(rank=32, gru_hidden=32, proj_dim=32),
        train={"steps": 100, "batch_size": 4, "lr": 3e-3, "num_anchors": 16, "anchor_chunk": 16, "log_every": 10,
               "save_every": 20, "out_dir": "runs/tiny"},
        data={"train_files": (os.path.join(data_root(), "gsm8k", "train.jsonl"),), "max_len": 512},
        mesh_shape=(-1, 1, 1), evaluation={"num_prompts": 4, "max_new_tokens": 24, "devices": 1},
        dtype="float32", target_param_dtype="float32")
    config.sample.max_new_tokens = 32
    return config
