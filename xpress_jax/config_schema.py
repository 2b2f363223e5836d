"""What every config field may hold: checked once, before anything is built or written, so a bad
value is one line naming the field, the value and what is allowed (never a traceback from inside
jit after a long model build).

Each field's rule is declared beside its default in `config.py`, so a new field comes with its
rule. Relations between fields (heads divisible by kv heads, block size vs length) are checked
after the per-field rules.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from xpress_jax.config import fields
from xpress_jax.config_rules import Rule
from xpress_jax.errors import ConfigError


def rule_of(key: str) -> Rule | None:
    """The rule of a dotted key (`config.fields`), None for a key no section declares."""
    f = fields().get(key)
    return None if f is None else f.rule


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


def check_fields(values: dict[str, Any]) -> None:
    """Per-field rules over dotted keys; a key no section declares is refused too (a typo in a
    config file)."""
    declared = fields()
    for key, value in values.items():
        rule = declared[key].rule if key in declared else None
        if rule is None:
            raise ConfigError(f"config field {key} is not a field of any section (unknown field?)")
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
