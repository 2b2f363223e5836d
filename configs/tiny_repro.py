"""The tiny reproduction (python -m xpress_jax.reproduce): a 3.0M-parameter Qwen3 target trained
here from scratch on GSM8K + standard-library code with a 2,048-token BPE, then a 2-layer DFlash
drafter, the causal heads and D-Loop trained for it, all on a 2-core CPU (each stage's wall time
is in benchmarks/tiny/results.json).

Shapes: target 6 layers, width 192; drafter 2 layers; heads of rank 64. The target trains 2,000
steps (about 4.4 epochs, 62-76 minutes here); at 400 steps (20 minutes) its greedy answers loop.
The drafter trains 720 steps (17-22 minutes); at 240 steps (8 minutes) it is under-trained. Stage
budgets are in `reproduce`.
"""

import ml_collections

from xpress_jax.config import dflash_recipe, drafter_section, heads_section, target_arch
from xpress_jax.reproduce.stages import TRAIN_STAGES


def get_config() -> ml_collections.ConfigDict:
    config = dflash_recipe(
        target=target_arch(vocab_size=2048, hidden_size=192, intermediate_size=576, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=48, rms_norm_eps=1e-6,
                           rope_theta=10_000.0, tie_word_embeddings=True, max_position_embeddings=2048),
        # <|mask|> is id 5 of the project's BPE (data/bpe.py SPECIALS)
        drafter=drafter_section(num_layers=2, target_layer_ids=(), block_size=16, mask_token_id=5),
        heads=heads_section(rank=64, gru_hidden=128, proj_dim=128),
        pretrain={"steps": 2000, "batch_size": 16, "lr": 3e-3, "max_len": 256, "save_every": 200},
        train={"steps": 300, "batch_size": 16, "lr": 3e-3, "num_anchors": 24, "anchor_chunk": 24, "log_every": 10,
               "save_every": 100, "remat": False, "out_dir": "runs/repro"},
        data={"max_len": 384},
        mesh_shape=(-1, 1, 1),
        evaluation={"datasets": ("gsm8k", "humaneval", "mt_bench", "alpaca"), "num_prompts": 16,
                    "max_new_tokens": 192, "iteration_sweep": (1, 2, 4, 8, 15), "candidate_k": 8, "time_split": False,
                    # one device: a model this small gains nothing from a copy per device
                    "dloop_branches": (1, 4), "devices": 1},
        dtype="float32", target_param_dtype="float32")
    config.reproduce = ml_collections.ConfigDict({
        "out_dir": "runs/repro",
        # every stage from scratch: no shipped target or drafter, every training stage
        "target_from": "", "dflash_from": "", "train_stages": tuple(TRAIN_STAGES),
        # train questions the target answers greedily (the drafter's data); on the same target 4,096
        # gave DFlash -3.5% to +6.8% tau over 1,024 (benchmarks/tiny/README.md, "The drafter's data")
        "regen_records": 4096,
        "regen_batch_size": 64, "regen_max_new_tokens": 192,
        # the DFlash drafter alone; 720 steps gave +15-32% tau over 240
        # (benchmarks/tiny/README.md, "The drafter's budget")
        "drafter_steps": 720,
        # each run from dflash/ (dflash.more, the same-budget reference; XPress co-adapted, XPress
        # frozen, Markov, GRU, D-Loop) and dloop+xpress (its refiner on the frozen D-Loop drafter)
        "head_steps": 100,
        "temperatures": (0.0, 1.0),
        # each temperature again with the target verifying only the first m drafts of each block
        # (eval.verify_tokens; 0: no such pass), for wall-clock speed: a 16-token verify costs 2.6
        # target-only steps on this CPU, a 5-token one 1.3. m = 4 gave the best projected speedup
        # on held-out prompts (the target's validation chats; benchmarks/tiny/README.md, "Verifying fewer drafts")
        "speed_verify_tokens": 4,
    })
    return config
