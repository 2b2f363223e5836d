"""Config recipe data: the sections every config file assembles (target, drafter, heads) and the
published DFlash recipe's defaults. Building models from a config lives in `models/build.py`."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections

from xpress_jax.methods import head_loss_weights, head_size_defaults
from xpress_jax.models.drafter import DFLASH_BLOCK_SIZE, DFLASH_DRAFT_LAYERS


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
LOSSLESS_REFERENCES = ("auto", "target_only", "verify_pass")  # eval.lossless_reference


def dtype(name: str):
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def target_arch(**fields) -> ml_collections.ConfigDict:
    """A `target` section: where the checkpoint is (empty: random init) and its HF-named shape."""
    return ml_collections.ConfigDict({"hf_dir": "", "arch": fields})


MASK_FROM_TOKENIZER = -1  # drafter.mask_token_id: the target tokenizer's <|mask|>, else its first unused id


def drafter_section(num_layers: int = DFLASH_DRAFT_LAYERS, target_layer_ids=(), block_size: int = DFLASH_BLOCK_SIZE,
                    mask_token_id: int = MASK_FROM_TOKENIZER) -> ml_collections.ConfigDict:
    """A `drafter` section. What depends on the target is derived from it unless given: empty
    target_layer_ids means DFlash's spacing over the target's layers, and MASK_FROM_TOKENIZER the
    mask token of the target's tokenizer (build.mask_token)."""
    return ml_collections.ConfigDict({"num_layers": num_layers, "target_layer_ids": tuple(target_layer_ids),
                                      "block_size": block_size, "mask_token_id": mask_token_id})


def heads_section(**sizes: int) -> ml_collections.ConfigDict:
    """Sizes of the causal heads: every registered head's (`methods.HEADS`), at their defaults
    unless given here."""
    fields = head_size_defaults()
    unknown = sorted(set(sizes) - set(fields))
    if unknown:
        raise ValueError(f"heads_section: unknown sizes {unknown}; the registered heads have {sorted(fields)}")
    return ml_collections.ConfigDict({**fields, **sizes})


def run_section(*layers: dict | None) -> dict:
    """What every training run reads (`train` and `pretrain` alike): steps and batch, the optimizer
    (AdamW with warmup + cosine and global-norm clipping), logging and the checkpoint policy, here
    once; each section's own fields and a config file's overrides are layered on top, in order."""
    section = {"steps": 0, "batch_size": 16, "lr": 6e-4, "warmup_fraction": 0.04, "final_lr_fraction": 0.0,
               "grad_clip": 1.0, "b1": 0.9, "b2": 0.95, "weight_decay": 0.0, "log_every": 20, "save_every": 1000,
               "keep": 3, "async_checkpointing": True, "max_bad_steps": 5, "out_dir": "runs/train"}
    for layer in layers:
        section.update(layer or {})
    return section


def drafter_training() -> dict:
    """The `train` section's own fields (beside `run_section`'s): the DFlash recipe's anchors and
    the losses."""
    return dict(
        epochs=6, trainable="all", heads=("xpress",), num_anchors=512, anchor_chunk=32, distributed=False,
        # the backward pass recomputes each anchor chunk's forward (True), and inside it what each
        # drafter layer does not keep (`layer_remat`: none, dots = the weight matmuls' outputs, full)
        remat=True, layer_remat="none",
        # resuming with a different batch size, lr, seed, data... breaks exact resume and is refused;
        # True accepts it deliberately (the change is recorded beside the original config.json)
        allow_config_change=False,
        # a trained drafter to start from (DFlash layout: ours or a published one) and heads from
        # its heads/ folder where present; empty: random initialisation
        init_from="",
        # the drafter's losses, then each registered head's terms with their weights
        loss={"gamma": 7.0, "dflash_ce": 1.0, "tv": 1.0, "dloop": 0.0, "dloop_beta": 0.8, "dloop_tau_s": 7.0,
              # XPress as the paper writes it: while a head whose terms include the drafter's own
              # logits trains (its drafter-anchor term, CE + TV on p^b), DFlash's CE on p^b is not
              # added again (it would count that CE twice); True adds it anyway
              "dflash_ce_with_heads": False, **head_loss_weights()})


def evaluation_defaults() -> dict:
    """The `eval` section. `eval.settings.EvalSettings` has these fields, and the decoder knobs
    among them are `decoding.settings.DecodeSettings`'s defaults."""
    return {
        "datasets": ("gsm8k",), "decoders": ("dflash", "markov", "gru", "xpress"), "num_prompts": 80,
        "max_new_tokens": 2048, "temperature": 0.0, "batch_size": 1, "seed": 0,
        # the drafter's and heads' weights and compute ("bfloat16" as they are served; the target
        # keeps target_param_dtype)
        "drafter_dtype": "float32",
        # prompts longer than this go through the target in chunks of it (bounded prefill memory;
        # 0: whole prompts at once)
        "prefill_chunk": 512,
        "max_iters": 4,  # XPress's Jacobi iterations per block
        "early_stop": True,  # end the Jacobi loop at the fixed point
        "top_k": 0,  # > 0: XPress candidate mode over the drafter's top-k per position
        "iteration_sweep": (1, 2, 4, 8, 15),  # XPress again at each iteration count: tau against iterations
        "out_dir": "runs/eval",
        # longer prompts are skipped and counted in results.json, never cut
        "max_prompt_tokens": 1024,
        "time_split": True,  # per-component timings (separately compiled calls)
        "candidate_k": 0,  # > 0: also measure XPress candidate mode (top-k) against the exact refiner
        # D-Loop's branches (prefixes regenerated and verified together): each dloop method is
        # measured at each count, labelled label.b4 for 4
        "dloop_branches": (1,),
        # draft tokens the target verifies per step, the block's first ones (0: all B-1). The
        # drafter still runs its whole block; its LM head, the head's causal solve and the
        # target's pass (whose cost grows with its length) cover only these. Lossless at any value.
        "verify_tokens": 0,
        # what --check_lossless compares each method with at temperature 0: "target_only" (one
        # token a step) or "verify_pass" (target-only decoding through the method's own loop with
        # every draft refused: the same verification pass, row 0 read; exact in bf16 and TF32 too);
        # "auto": target_only where its arithmetic equals the verify pass's (float32 on a CPU),
        # verify_pass elsewhere (eval.evaluate.lossless_reference)
        "lossless_reference": "auto",
        # local devices the target's heads, MLP width and vocabulary are split over, for a target
        # too large for one device (drafter and heads replicated; decoding/devices.py)
        "tensor_parallel": 1,
    }


def dflash_recipe(*, target: ml_collections.ConfigDict, drafter: ml_collections.ConfigDict,
                  heads: ml_collections.ConfigDict, train: dict | None = None, data: dict | None = None,
                  mesh_shape=(1, -1, 1), evaluation: dict | None = None, pretrain: dict | None = None,
                  dtype: str = "bfloat16", target_param_dtype: str = "bfloat16") -> ml_collections.ConfigDict:
    """A full config with the published DFlash recipe as defaults (block 16, gamma 7, 512 anchors,
    lr 6e-4, warmup 4%, cosine, clip 1.0, AdamW without decay, 6 epochs, length 3072);
    `train`, `data` and `evaluation` override individual fields."""
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.dtype = dtype  # compute
    config.param_dtype = "float32"  # master weights of what trains
    config.target_param_dtype = target_param_dtype  # the frozen target needs no master copy
    config.target = target
    config.drafter = drafter
    config.heads = heads
    config.train = ml_collections.ConfigDict(run_section(drafter_training(), train))
    config.data = ml_collections.ConfigDict({"train_files": (), "tokenizer_dir": "", "max_len": 3072, **(data or {})})
    config.mesh = ml_collections.ConfigDict({"shape": tuple(mesh_shape)})  # (data, fsdp, tensor); -1: the rest
    config.eval = ml_collections.ConfigDict({**evaluation_defaults(), **(evaluation or {})})
    # training the target itself (python -m xpress_jax.pretrain): the tiny reproduction's target
    config.pretrain = ml_collections.ConfigDict(run_section(dict(
        steps=1000, batch_size=32, lr=3e-3, warmup_fraction=0.05, final_lr_fraction=0.1, weight_decay=0.1,
        save_every=200, keep=2, out_dir="runs/pretrain", max_len=384, vocab_size=2048, code_functions=4000,
        val_fraction=0.02, report_prompts=16, report_max_new_tokens=192), pretrain))
    config.sample = ml_collections.ConfigDict(
        {"prompt": "Write a haiku about speculative decoding.", "max_new_tokens": 64, "max_len": 4096})
    return config
