"""Qwen3-4B target (tied embeddings) with a 5-layer DFlash drafter and the XPress refiner."""

import ml_collections

from xpress_jax.config import dflash_recipe, drafter_section, heads_section, target_arch


def get_config() -> ml_collections.ConfigDict:
    return dflash_recipe(
        target=target_arch(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                           rope_theta=1_000_000.0, tie_word_embeddings=True, max_position_embeddings=40960),
        # target layers (1, 9, 17, 25, 33 for 36 layers) and mask token (151669) derived from the target
        drafter=drafter_section(num_layers=5, block_size=16),
        heads=heads_section(rank=256),
        train={"out_dir": "runs/qwen3_4b"})
