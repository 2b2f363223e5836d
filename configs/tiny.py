"""A tiny random Qwen3 for this CPU machine: the default of every command, seconds to run."""

import ml_collections

from xpress_jax.config import drafter_section, heads_section, target_arch


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.dtype = "float32"
    config.param_dtype = "float32"
    # The real Qwen3 vocabulary size keeps token ids (and the drafter's mask id 151669) meaningful.
    config.target = target_arch(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=True, max_position_embeddings=4096)
    config.drafter = drafter_section(num_layers=2, target_layer_ids=(), block_size=16)
    config.heads = heads_section(rank=32, gru_hidden=32, proj_dim=32)
    config.eval = ml_collections.ConfigDict({
        "datasets": ("gsm8k",), "heads": ("dflash", "markov", "gru", "xpress"), "num_prompts": 4,
        "max_new_tokens": 24, "temperature": 0.0, "batch_size": 1, "seed": 0, "max_iters": 4, "early_stop": True,
        "top_k": 0, "jacobi_k": (1, 2, 4, 8, 15), "out_dir": "runs/eval"})
    config.sample = ml_collections.ConfigDict(
        {"prompt": "Write a haiku about speculative decoding.", "max_new_tokens": 32, "max_len": 512})
    return config
