"""Qwen3-8B target. Point `--config.target.hf_dir` at a local HF checkpoint directory."""

import ml_collections

from xpress_jax.config import drafter_section, heads_section, target_arch


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.dtype = "bfloat16"  # compute
    config.param_dtype = "float32"  # master weights
    config.target = target_arch(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=False, max_position_embeddings=40960)
    config.drafter = drafter_section(num_layers=5, target_layer_ids=(1, 9, 17, 25, 33), block_size=16)
    config.heads = heads_section(rank=256)
    config.eval = ml_collections.ConfigDict({
        "datasets": ("gsm8k",), "heads": ("dflash", "markov", "gru", "xpress"), "num_prompts": 80,
        "max_new_tokens": 2048, "temperature": 0.0, "batch_size": 1, "seed": 0, "max_iters": 4, "early_stop": True,
        "top_k": 0, "jacobi_k": (1, 2, 4, 8, 15), "out_dir": "runs/eval"})
    config.sample = ml_collections.ConfigDict(
        {"prompt": "Write a haiku about speculative decoding.", "max_new_tokens": 64, "max_len": 4096})
    return config
