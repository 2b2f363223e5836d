"""Rules for config values: each takes a value and returns None when it is allowed, else what is
allowed (the one-line error names the field, the value and this)."""

from __future__ import annotations

from typing import Any, Callable

Rule = Callable[[Any], str | None]  # the value -> None if fine, else what is allowed


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


positive_int, non_negative_int = integer(1), integer(0)
fraction = number(0.0, 1.0)
open_fraction = number(0.0, 1.0, hi_open=True)  # [0, 1): Adam's betas, warmup
weight = number(0.0)  # a loss weight
