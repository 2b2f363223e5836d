"""A tiny random Qwen3 for this CPU machine: the default of every command, seconds to run."""

import os

import ml_collections

from xpress_jax.config import drafter_section, heads_section, target_arch


DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.dtype = "float32"
    config.param_dtype = "float32"
    config.target_param_dtype = "float32"
    # A 512-token vocabulary: bytes, the chat specials at 256.. (data/byte_tokenizer.py), mask id 511.
    config.target = target_arch(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        rope_theta=1_000_000.0, tie_word_embeddings=True, max_position_embeddings=4096)
    config.drafter = drafter_section(num_layers=2, target_layer_ids=(1, 2), block_size=16, mask_token_id=511)
    config.heads = heads_section(rank=32, gru_hidden=32, proj_dim=32)
    config.eval = ml_collections.ConfigDict({
        "datasets": ("gsm8k",), "heads": ("dflash", "markov", "gru", "xpress"), "num_prompts": 4,
        "max_new_tokens": 24, "temperature": 0.0, "batch_size": 1, "seed": 0, "max_iters": 4, "early_stop": True,
        "top_k": 0, "jacobi_k": (1, 2, 4, 8, 15), "out_dir": "runs/eval"})
    config.train = ml_collections.ConfigDict({
        "steps": 100, "epochs": 6, "batch_size": 4, "lr": 0.003, "warmup_fraction": 0.04, "final_lr_fraction": 0.0,
        "grad_clip": 1.0, "b1": 0.9, "b2": 0.95, "weight_decay": 0.0, "trainable": "all", "heads": ("xpress",),
        "num_anchors": 16, "anchor_chunk": 16, "remat": True, "log_every": 10, "save_every": 20,
        "keep": 3, "async_checkpointing": True, "max_bad_steps": 5, "distributed": False, "out_dir": "runs/tiny",
        "loss": {"gamma": 7.0, "dflash_ce": 1.0, "tv": 1.0, "xpress_teacher_forced": 1.0, "xpress_anchor": 1.0,
                 "xpress_consistency": 1.0, "markov": 1.0, "gru": 1.0, "dloop": 0.0, "dloop_beta": 0.8,
                 "dloop_tau_s": 7.0}})
    config.data = ml_collections.ConfigDict({"train_files": (os.path.join(DATA, "gsm8k", "train.jsonl"),), "tokenizer_dir": "", "max_len": 512})
    config.mesh = ml_collections.ConfigDict({"shape": (-1, 1, 1)})  # (data, fsdp, tensor); -1 takes the rest
    config.sample = ml_collections.ConfigDict(
        {"prompt": "Write a haiku about speculative decoding.", "max_new_tokens": 32, "max_len": 512})
    return config
