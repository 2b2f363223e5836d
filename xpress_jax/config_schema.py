"""What every config field may hold: checked once, before anything is built or written, so a bad
value is one line naming the field, the value and what is allowed (never a traceback from inside
jit after a long model build).

Every leaf of every shipped config has a rule here (a test checks it), so a new field comes with
its rule. Relations between fields (heads divisible by kv heads, chunk vs anchors) are checked
after the per-field rules.
"""

from __future__ import annotations

from typing import Any, Callable

import ml_collections

from xpress_jax.config import DTYPES, LOSSLESS_REFERENCES
from xpress_jax.errors import ConfigError
from xpress_jax.methods import HEADS, head_loss_weights, head_size_defaults, spec_decoders
from xpress_jax.models.layers import REMAT_POLICIES

Rule = Callable[[Any], str | None]  # the value -> None if fine, else what is allowed

DTYPE_NAMES = tuple(DTYPES)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def integer(lo: int | None = None, hi: int | None = None) -> Rule:
    def rule(v):
        if not _is_int(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
            bounds = f" >= {lo}" if hi is None and lo is not None else (f" in [{lo}, {hi}]" if lo is not None else "")
            return f"an integer{bounds}"
        return None
    return rule


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False) -> Rule:
    def rule(v):
        ok = (_is_int(v) or isinstance(v, float)) and v == v  # not NaN
        if ok and lo is not None:
            ok = v > lo if lo_open else v >= lo
        if ok and hi is not None:
            ok = v < hi if hi_open else v <= hi
        if ok:
            return None
        left = "" if lo is None else ("(" if lo_open else "[") + f"{lo}"
        right = "" if hi is None else f"{hi}" + (")" if hi_open else "]")
        return f"a number in {left or '(-inf'}, {right or 'inf)'}"
    return rule


def boolean(v):
    return None if isinstance(v, bool) else "true or false"


def text(nonempty: bool = False) -> Rule:
    def rule(v):
        if not isinstance(v, str) or (nonempty and not v.strip()):
            return "a non-empty string" if nonempty else "a string"
        return None
    return rule


def one_of(*choices: str) -> Rule:
    def rule(v):
        return None if v in choices else f"one of {', '.join(choices)}"
    return rule


def sequence(item: Rule, *, length: int | None = None, nonempty: bool = False, unique: bool = False,
             what: str = "") -> Rule:
    """A tuple or list whose items each satisfy `item`."""
    def rule(v):
        allowed = f"a tuple{f' of {length}' if length else ''} of {what}" + (" (at least one)" if nonempty else "") \
            + (" without repeats" if unique else "")
        if not isinstance(v, (tuple, list)):
            return allowed
        if (length is not None and len(v) != length) or (nonempty and not v) or (unique and len(set(v)) != len(v)):
            return allowed
        return allowed if any(item(x) for x in v) else None
    return rule


def registered(names: Callable[[], tuple[str, ...]], what: str) -> Rule:
    """Unique names from a registry, read when the value is checked (a head registered after
    import is allowed)."""
    def rule(v):
        choices = names()
        return sequence(one_of(*choices), unique=True, what=f"{what} from {', '.join(choices)}")(v)
    return rule


def mesh_shape(v):
    allowed = "a tuple of 3 sizes (data, fsdp, tensor), each >= 1 or -1 (the rest, at most once)"
    if not isinstance(v, (tuple, list)) or len(v) != 3 or not all(_is_int(x) and (x >= 1 or x == -1) for x in v):
        return allowed
    return allowed if list(v).count(-1) > 1 else None


_pos_int, _nonneg_int = integer(1), integer(0)
_fraction = number(0.0, 1.0)
_beta = number(0.0, 1.0, hi_open=True)
_weight = number(0.0)

RULES: dict[str, Rule] = {
    "seed": _nonneg_int,
    "dtype": one_of(*DTYPE_NAMES), "param_dtype": one_of(*DTYPE_NAMES), "target_param_dtype": one_of(*DTYPE_NAMES),
    "target.hf_dir": text(),
    "target.arch.vocab_size": _pos_int, "target.arch.hidden_size": _pos_int,
    "target.arch.intermediate_size": _pos_int, "target.arch.num_hidden_layers": _pos_int,
    "target.arch.num_attention_heads": _pos_int, "target.arch.num_key_value_heads": _pos_int,
    "target.arch.head_dim": integer(2), "target.arch.rms_norm_eps": number(0.0, lo_open=True),
    "target.arch.rope_theta": number(0.0, lo_open=True), "target.arch.tie_word_embeddings": boolean,
    "target.arch.max_position_embeddings": _pos_int,
    "drafter.num_layers": _pos_int, "drafter.block_size": integer(2),
    "drafter.target_layer_ids": sequence(_nonneg_int, unique=True, what="layer ids >= 0"),
    "drafter.mask_token_id": integer(-1),  # -1: from the target's tokenizer
    # train.steps 0 means "by epochs" (train.epochs over the data)
    "train.steps": _nonneg_int, "train.epochs": _pos_int,
    "train.trainable": one_of("all", "drafter", "heads"),
    "train.heads": registered(lambda: tuple(HEADS), "heads"),
    "train.num_anchors": _pos_int, "train.anchor_chunk": _pos_int, "train.remat": boolean,
    "train.layer_remat": one_of(*REMAT_POLICIES),
    "train.distributed": boolean, "train.init_from": text(), "train.allow_config_change": boolean,
    "train.loss.gamma": number(0.0, lo_open=True), "train.loss.dflash_ce": _weight, "train.loss.tv": _weight,
    "train.loss.dloop": _weight, "train.loss.dloop_beta": number(0.0, 1.0, lo_open=True, hi_open=True),
    "train.loss.dloop_tau_s": number(0.0, lo_open=True), "train.loss.dflash_ce_with_heads": boolean,
    "data.train_files": sequence(text(nonempty=True), what="file paths"), "data.tokenizer_dir": text(),
    "data.max_len": integer(2),
    "mesh.shape": mesh_shape,
    "eval.datasets": sequence(text(nonempty=True), nonempty=True, what="dataset names or paths"),
    "eval.decoders": registered(spec_decoders, "decoders"),
    "eval.num_prompts": _pos_int, "eval.max_new_tokens": _pos_int, "eval.temperature": number(0.0),
    "eval.batch_size": _pos_int, "eval.seed": _nonneg_int, "eval.max_iters": _pos_int, "eval.early_stop": boolean,
    "eval.verify_tokens": _nonneg_int, "eval.drafter_dtype": one_of(*DTYPE_NAMES),
    "eval.prefill_chunk": integer(0),
    "eval.lossless_reference": one_of(*LOSSLESS_REFERENCES), "eval.tensor_parallel": _pos_int,
    "eval.top_k": _nonneg_int, "eval.iteration_sweep": sequence(_pos_int, what="iteration counts >= 1"),
    "eval.out_dir": text(nonempty=True), "eval.max_prompt_tokens": _pos_int, "eval.time_split": boolean,
    "eval.candidate_k": _nonneg_int,
    "eval.dloop_branches": sequence(_pos_int, nonempty=True, unique=True, what="branch counts >= 1"),
    "pretrain.steps": _pos_int, "pretrain.max_len": integer(2), "pretrain.vocab_size": integer(300),
    "pretrain.code_functions": _nonneg_int, "pretrain.val_fraction": number(0.0, 1.0, lo_open=True, hi_open=True),
    "pretrain.report_prompts": _nonneg_int, "pretrain.report_max_new_tokens": _pos_int,
    "sample.prompt": text(nonempty=True), "sample.max_new_tokens": _pos_int, "sample.max_len": _pos_int,
    "reproduce.out_dir": text(nonempty=True), "reproduce.regen_records": _pos_int,
    "reproduce.regen_batch_size": _pos_int, "reproduce.regen_max_new_tokens": _pos_int,
    "reproduce.drafter_steps": _pos_int, "reproduce.head_steps": _pos_int,
    "reproduce.temperatures": sequence(number(0.0), nonempty=True, what="temperatures >= 0"),
    "reproduce.speed_verify_tokens": _nonneg_int,
    "reproduce.train_stages": sequence(text(nonempty=True), unique=True, what="stage names"),
    "reproduce.target_from": text(), "reproduce.dflash_from": text(),
}


# the fields every training run has (config.run_section), in `train` and `pretrain` alike
RUN_RULES: dict[str, Rule] = {
    "batch_size": _pos_int, "lr": number(0.0, lo_open=True), "warmup_fraction": _beta,
    "final_lr_fraction": _fraction, "grad_clip": number(0.0, lo_open=True), "b1": _beta, "b2": _beta,
    "weight_decay": _weight, "log_every": _pos_int, "save_every": _pos_int, "keep": _pos_int,
    "async_checkpointing": boolean, "max_bad_steps": _pos_int, "out_dir": text(nonempty=True),
}
RULES.update({f"{section}.{key}": rule for section in ("train", "pretrain") for key, rule in RUN_RULES.items()})


def leaves(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every non-section field."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict):
            out.update(leaves(value, name + "."))
        else:
            out[name] = value
    return out


def rule_of(key: str) -> Rule | None:
    """The rule of a dotted key: RULES, or a registered head's size or loss weight."""
    if key in RULES:
        return RULES[key]
    section, _, name = key.rpartition(".")
    if (section == "heads" and name in head_size_defaults()) or (section == "train.loss" and name in head_loss_weights()):
        return _pos_int if section == "heads" else _weight
    return None


def check_fields(values: dict[str, Any]) -> None:
    """Per-field rules over dotted keys; a key without a rule is refused too (a typo in a config
    file, or a field added without its rule)."""
    for key, value in values.items():
        rule = rule_of(key)
        if rule is None:
            raise ConfigError(f"config field {key} has no validation rule (unknown field?)")
        allowed = rule(value)
        if allowed:
            raise ConfigError(f"config field {key}={value!r}: expected {allowed}")


def check_config(config: ml_collections.ConfigDict) -> None:
    """Every field, then the relations between fields."""
    values = leaves(config)
    check_fields(values)
    arch = "target.arch."
    if f"{arch}num_attention_heads" in values:
        heads, kv = values[f"{arch}num_attention_heads"], values[f"{arch}num_key_value_heads"]
        if heads % kv:
            raise ConfigError(f"config field target.arch.num_attention_heads={heads} is not a multiple of "
                              f"target.arch.num_key_value_heads={kv}")
        if values[f"{arch}head_dim"] % 2:
            raise ConfigError(f"config field target.arch.head_dim={values[f'{arch}head_dim']}: RoPE needs an even "
                              "head_dim")
    if "data.max_len" in values and "drafter.block_size" in values and values["data.max_len"] <= values[
            "drafter.block_size"]:
        raise ConfigError(f"config field data.max_len={values['data.max_len']} must exceed the block size "
                          f"{values['drafter.block_size']}")
