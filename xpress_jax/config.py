"""Every config field, once: its default and its rule side by side, per section, and the published
DFlash recipe assembled from them. A config file (`configs/*.py`) calls `dflash_recipe` and changes
fields; `--config.a.b=V` changes them on the command line; `config_schema.check_config` checks
every field against its rule here. The typed views (`eval.settings.EvalSettings`,
`train.step.LossSettings`) are made from these declarations. Building models from a config lives
in `models/build.py`.

A section a config file must give in full (`target.arch`, the reproduction's `reproduce`) has
rules and no defaults. The causal heads' sizes (`heads.*`) and loss weights (`train.loss.*`) come
from the head registry (`methods.HEADS`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import ml_collections

from xpress_jax.config_rules import (Rule, boolean, fraction, integer, mesh_shape, non_negative_int, number, one_of,
                                     open_fraction, positive_int, registered, sequence, text, weight)
from xpress_jax.methods import HEADS, head_loss_weights, head_size_defaults, spec_decoders
from xpress_jax.models.drafter import DFLASH_BLOCK_SIZE, DFLASH_DRAFT_LAYERS
from xpress_jax.models.layers import REMAT_POLICIES

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
LOSSLESS_REFERENCES = ("auto", "target_only", "verify_pass")  # eval.lossless_reference
ACCEPTANCE_RULES = ("rejection", "match")  # at temperature > 0 (decoding/speculative.py)
MASK_FROM_TOKENIZER = -1  # drafter.mask_token_id: the target tokenizer's <|mask|>, else its first unused id
REQUIRED = object()  # the default of a field a config file must give


@dataclasses.dataclass(frozen=True)
class Field:
    default: Any
    rule: Rule

    @property
    def type(self) -> type:
        return type(self.default)


def dtype(name: str):
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


_dtype_name = one_of(*DTYPES)
_positive = number(0.0, lo_open=True)

TOP = {"seed": Field(0, non_negative_int),
       "dtype": Field("bfloat16", _dtype_name),  # compute
       "param_dtype": Field("float32", _dtype_name),  # master weights of what trains
       "target_param_dtype": Field("bfloat16", _dtype_name)}  # the frozen target needs no master copy

# where the target is (empty: random init, or the target an evaluated drafter records); a given
# target that differs from the recorded one is refused unless accept_other (checkpoints/target_record.py)
TARGET = {"hf_dir": Field("", text()), "accept_other": Field(False, boolean)}

TARGET_ARCH = {  # Hugging Face's names; `target.hf_dir`'s config.json replaces them when given
    "vocab_size": Field(REQUIRED, positive_int), "hidden_size": Field(REQUIRED, positive_int),
    "intermediate_size": Field(REQUIRED, positive_int), "num_hidden_layers": Field(REQUIRED, positive_int),
    "num_attention_heads": Field(REQUIRED, positive_int), "num_key_value_heads": Field(REQUIRED, positive_int),
    "head_dim": Field(REQUIRED, integer(2)), "rms_norm_eps": Field(REQUIRED, _positive),
    "rope_theta": Field(REQUIRED, _positive), "tie_word_embeddings": Field(REQUIRED, boolean),
    "max_position_embeddings": Field(REQUIRED, positive_int)}

# What depends on the target is derived from it unless given: empty target_layer_ids means
# DFlash's spacing over the target's layers, MASK_FROM_TOKENIZER the mask token of the target's
# tokenizer (build.mask_token).
DRAFTER = {"num_layers": Field(DFLASH_DRAFT_LAYERS, positive_int),
           "target_layer_ids": Field((), sequence(non_negative_int, unique=True, what="layer ids >= 0")),
           "block_size": Field(DFLASH_BLOCK_SIZE, integer(2)),
           "mask_token_id": Field(MASK_FROM_TOKENIZER, integer(-1))}

# What every training run reads (`train` and `pretrain` alike): batch, the optimizer (AdamW with
# warmup + cosine and global-norm clipping), logging and the checkpoint policy.
RUN = {"batch_size": Field(16, positive_int), "lr": Field(6e-4, _positive),
       "warmup_fraction": Field(0.04, open_fraction), "final_lr_fraction": Field(0.0, fraction),
       "grad_clip": Field(1.0, _positive), "b1": Field(0.9, open_fraction), "b2": Field(0.95, open_fraction),
       "weight_decay": Field(0.0, weight), "log_every": Field(20, positive_int),
       "save_every": Field(1000, positive_int), "keep": Field(3, positive_int),
       "async_checkpointing": Field(True, boolean), "max_bad_steps": Field(5, positive_int),
       "out_dir": Field("runs/train", text(nonempty=True))}


def run_fields(**defaults) -> dict[str, Field]:
    """RUN with some defaults changed (a section's own recipe), the rules kept."""
    return {**RUN, **{k: dataclasses.replace(RUN[k], default=v) for k, v in defaults.items()}}


# The drafter's training: the DFlash recipe's anchors and the losses.
TRAIN = {
    **RUN,
    "steps": Field(0, non_negative_int),  # 0: by epochs (train.epochs over the data)
    "epochs": Field(6, positive_int),
    "trainable": Field("all", one_of("all", "drafter", "heads")),
    "heads": Field(("xpress",), registered(lambda: tuple(HEADS), "heads")),
    "num_anchors": Field(512, positive_int), "anchor_chunk": Field(32, positive_int),
    "distributed": Field(False, boolean),
    # the backward pass recomputes each anchor chunk's forward (True), and inside it what each
    # drafter layer does not keep (`layer_remat`: none, dots = the weight matmuls' outputs, full)
    "remat": Field(True, boolean), "layer_remat": Field("none", one_of(*REMAT_POLICIES)),
    # resuming with a different batch size, lr, seed, data... breaks exact resume and is refused;
    # True accepts it deliberately (the change is recorded beside the original config.json)
    "allow_config_change": Field(False, boolean),
    # a resumed run whose length (steps, epochs) changed continues its learning-rate schedule from
    # the newest checkpoint's step to the new last step (train/schedule.py); refused without it
    "continue_schedule": Field(False, boolean),
    # a trained drafter to start from (DFlash layout: ours or a published one) and heads from
    # its heads/ folder where present; empty: random initialisation
    "init_from": Field("", text()),
}

# `train.loss`: the drafter's losses; each registered head adds its terms (`loss_section`).
LOSS = {
    "gamma": Field(7.0, _positive), "dflash_ce": Field(1.0, weight), "tv": Field(1.0, weight),
    "dloop": Field(0.0, weight),  # > 0: D-Loop's complementary objective replaces the DFlash CE
    "dloop_beta": Field(0.8, number(0.0, 1.0, lo_open=True, hi_open=True)), "dloop_tau_s": Field(7.0, _positive),
    # XPress as the paper writes it: while a head whose terms include the drafter's own logits
    # trains (its drafter-anchor term, CE + TV on p^b), DFlash's CE on p^b is not added again (it
    # would count that CE twice); True adds it anyway
    "dflash_ce_with_heads": Field(False, boolean),
}

DATA = {"train_files": Field((), sequence(text(nonempty=True), what="file paths")),
        "tokenizer_dir": Field("", text()), "max_len": Field(3072, integer(2))}

MESH = {"shape": Field((1, -1, 1), mesh_shape)}  # (data, fsdp, tensor); -1: the rest

EVAL = {
    "datasets": Field(("gsm8k",), sequence(text(nonempty=True), nonempty=True, what="dataset names or paths")),
    "decoders": Field(("dflash", "markov", "gru", "xpress"), registered(spec_decoders, "decoders")),
    # questions per dataset: the first N of a question file; N chosen as the DFlash harness chooses
    # them from a published benchmark (0: its harness count; every question of any other file)
    "num_prompts": Field(80, non_negative_int), "max_new_tokens": Field(2048, positive_int),
    "temperature": Field(0.0, number(0.0)), "batch_size": Field(1, positive_int), "seed": Field(0, non_negative_int),
    # at temperature > 0: "rejection" (sampled drafts, rejection sampling) or "match" (argmax drafts
    # accepted while they equal the target's sampled tokens: the DFlash harness's rule)
    "acceptance": Field("rejection", one_of(*ACCEPTANCE_RULES)),
    # the drafter's and heads' weights and compute ("bfloat16" as they are served; the target
    # keeps target_param_dtype)
    "drafter_dtype": Field("float32", _dtype_name),
    # prompts longer than this go through the target in chunks of it (bounded prefill memory; 0:
    # whole prompts at once)
    "prefill_chunk": Field(512, integer(0)),
    "max_iters": Field(4, positive_int),  # XPress's Jacobi iterations per block
    "early_stop": Field(True, boolean),  # end the Jacobi loop at the fixed point
    "top_k": Field(0, non_negative_int),  # > 0: XPress candidate mode over the drafter's top-k per position
    # XPress again at each iteration count: tau against iterations
    "iteration_sweep": Field((1, 2, 4, 8, 15), sequence(positive_int, what="iteration counts >= 1")),
    "out_dir": Field("runs/eval", text(nonempty=True)),
    "max_prompt_tokens": Field(1024, positive_int),  # longer prompts are skipped and counted, never cut
    "time_split": Field(True, boolean),  # per-component timings (separately compiled calls)
    "candidate_k": Field(0, non_negative_int),  # > 0: also XPress candidate mode (top-k) against the exact refiner
    # D-Loop's branches (prefixes regenerated and verified together): each dloop method is
    # measured at each count, labelled label.b4 for 4
    "dloop_branches": Field((1,), sequence(positive_int, nonempty=True, unique=True, what="branch counts >= 1")),
    # draft tokens the target verifies per step, the block's first ones (0: all B-1). The drafter
    # still runs its whole block; its LM head, the head's causal solve and the target's pass
    # (whose cost grows with its length) cover only these. Lossless at any value.
    "verify_tokens": Field(0, non_negative_int),
    # what --check_lossless compares each method with at temperature 0: "target_only" (one token a
    # step) or "verify_pass" (target-only decoding through the method's own loop with every draft
    # refused: the same verification pass, row 0 read; exact in bf16 and TF32 too); "auto":
    # target_only where its arithmetic equals the verify pass's (float32 on a CPU), verify_pass
    # elsewhere (eval.evaluate.lossless_reference)
    "lossless_reference": Field("auto", one_of(*LOSSLESS_REFERENCES)),
    # local devices the target's heads, MLP width and vocabulary are split over, for a target too
    # large for one device (drafter and heads replicated; decoding/devices.py)
    "tensor_parallel": Field(1, positive_int),
    # local devices the questions are split over, one response at a time on each (groups of
    # tensor_parallel for a split target; eval/workers.py); 0: every local device
    "devices": Field(0, non_negative_int),
}

# Training the target itself (python -m xpress_jax.pretrain): the tiny reproduction's target.
PRETRAIN = {
    **run_fields(batch_size=32, lr=3e-3, warmup_fraction=0.05, final_lr_fraction=0.1, weight_decay=0.1,
                 save_every=200, keep=2, out_dir="runs/pretrain"),
    "steps": Field(1000, positive_int), "max_len": Field(384, integer(2)), "vocab_size": Field(2048, integer(300)),
    "code_functions": Field(4000, non_negative_int),
    "val_fraction": Field(0.02, number(0.0, 1.0, lo_open=True, hi_open=True)),
    "report_prompts": Field(16, non_negative_int), "report_max_new_tokens": Field(192, positive_int),
}

SAMPLE = {"prompt": Field("Write a haiku about speculative decoding.", text(nonempty=True)),
          "max_new_tokens": Field(64, positive_int)}

# The reproduction's section (configs/tiny_repro.py gives it whole).
REPRODUCE = {
    "out_dir": Field(REQUIRED, text(nonempty=True)), "regen_records": Field(REQUIRED, positive_int),
    "regen_batch_size": Field(REQUIRED, positive_int), "regen_max_new_tokens": Field(REQUIRED, positive_int),
    "drafter_steps": Field(REQUIRED, positive_int), "head_steps": Field(REQUIRED, positive_int),
    "temperatures": Field(REQUIRED, sequence(number(0.0), nonempty=True, what="temperatures >= 0")),
    "speed_verify_tokens": Field(REQUIRED, non_negative_int),
    "train_stages": Field(REQUIRED, sequence(text(nonempty=True), unique=True, what="stage names")),
    "target_from": Field(REQUIRED, text()), "dflash_from": Field(REQUIRED, text()),
}


def heads_fields() -> dict[str, Field]:
    """`heads`: every registered head's sizes."""
    return {k: Field(v, positive_int) for k, v in head_size_defaults().items()}


def loss_fields() -> dict[str, Field]:
    """`train.loss`: the drafter's losses and every registered head's terms."""
    return {**LOSS, **{k: Field(v, weight) for k, v in head_loss_weights().items()}}


def fields() -> dict[str, Field]:
    """Every field by dotted key (the heads' as registered now)."""
    sections = {"": TOP, "target.": TARGET, "target.arch.": TARGET_ARCH, "drafter.": DRAFTER,
                "heads.": heads_fields(), "train.": TRAIN, "train.loss.": loss_fields(), "data.": DATA,
                "mesh.": MESH, "eval.": EVAL, "pretrain.": PRETRAIN, "sample.": SAMPLE, "reproduce.": REPRODUCE}
    return {prefix + name: f for prefix, section in sections.items() for name, f in section.items()}


def defaults(section: dict[str, Field], **changes) -> dict:
    """A section's fields at their defaults, with `changes` (unknown names refused)."""
    unknown = sorted(set(changes) - set(section))
    if unknown:
        raise ValueError(f"unknown fields {unknown}; this section has {sorted(section)}")
    return {k: changes.get(k, f.default) for k, f in section.items()}


def target_arch(**fields) -> ml_collections.ConfigDict:
    """A `target` section: where the checkpoint is (empty: random init) and its HF-named shape."""
    missing = sorted(set(TARGET_ARCH) - set(fields))
    if missing:
        raise ValueError(f"target_arch: missing {missing}")
    return ml_collections.ConfigDict({**defaults(TARGET), "arch": defaults(TARGET_ARCH, **fields)})


def drafter_section(**changes) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(defaults(DRAFTER, **changes))


def heads_section(**sizes: int) -> ml_collections.ConfigDict:
    """Sizes of the causal heads: every registered head's (`methods.HEADS`), at their defaults
    unless given here."""
    return ml_collections.ConfigDict(defaults(heads_fields(), **sizes))


def dflash_recipe(*, target: ml_collections.ConfigDict, drafter: ml_collections.ConfigDict,
                  heads: ml_collections.ConfigDict, train: dict | None = None, data: dict | None = None,
                  mesh_shape=MESH["shape"].default, evaluation: dict | None = None, pretrain: dict | None = None,
                  dtype: str = TOP["dtype"].default,
                  target_param_dtype: str = TOP["target_param_dtype"].default) -> ml_collections.ConfigDict:
    """A full config with the published DFlash recipe as defaults (block 16, gamma 7, 512 anchors,
    lr 6e-4, warmup 4%, cosine, clip 1.0, AdamW without decay, 6 epochs, length 3072);
    `train`, `data`, `evaluation` and `pretrain` change individual fields."""
    config = ml_collections.ConfigDict(defaults(TOP, dtype=dtype, target_param_dtype=target_param_dtype))
    config.target = target
    config.drafter = drafter
    config.heads = heads
    train = dict(train or {})
    config.train = ml_collections.ConfigDict(defaults(TRAIN, **{k: v for k, v in train.items() if k != "loss"}))
    config.train.loss = ml_collections.ConfigDict(defaults(loss_fields(), **train.get("loss", {})))
    config.data = ml_collections.ConfigDict(defaults(DATA, **(data or {})))
    config.mesh = ml_collections.ConfigDict(defaults(MESH, shape=tuple(mesh_shape)))
    config.eval = ml_collections.ConfigDict(defaults(EVAL, **(evaluation or {})))
    config.pretrain = ml_collections.ConfigDict(defaults(PRETRAIN, **(pretrain or {})))
    config.sample = ml_collections.ConfigDict(defaults(SAMPLE))
    return config
