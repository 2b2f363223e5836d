"""The decoder knobs beyond the decoder's name, in one object whose defaults are the config's
`eval` fields of the same names (`config.EVAL`; `branches` is the first of `dloop_branches`).

Built once (from `generate`'s arguments or the eval's settings) and passed down to the
draft step, the refiner and the profiler. A knob set for a decoder that would ignore it is an
error for a direct request; an evaluation that runs one settings object over many decoders
hands each decoder only the knobs it reads (`for_decoder`).
"""

from __future__ import annotations

import dataclasses

from xpress_jax.config import EVAL
from xpress_jax.errors import InputError
from xpress_jax.methods import DECODERS, decoders_reading

_EVAL = {name: f.default for name, f in EVAL.items()}


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    max_iters: int = _EVAL["max_iters"]  # XPress's Jacobi iterations per block
    early_stop: bool = _EVAL["early_stop"]
    top_k: int = _EVAL["top_k"]  # > 0: XPress candidate mode
    branches: int = _EVAL["dloop_branches"][0]  # D-Loop: prefixes regenerated and verified together
    verify_tokens: int = _EVAL["verify_tokens"]  # 0: all B-1 drafts
    prefill_chunk: int = _EVAL["prefill_chunk"]  # longer prompts are prefilled in chunks of this many tokens

    def drafted(self, block: int) -> int:
        """Draft positions per step that are drafted, refined and verified: verify_tokens, or all B-1."""
        return self.verify_tokens or block - 1

    def for_decoder(self, decoder: str) -> "DecodeSettings":
        """These settings with the knobs `decoder` does not read (methods.DECODERS) back at their defaults."""
        reads = DECODERS[decoder].knobs
        return dataclasses.replace(DecodeSettings(), **{k: getattr(self, k) for k in reads})

    def check(self, decoder: str, block: int) -> None:
        """Ranges, and no knob the decoder would silently ignore."""
        ignored = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != getattr(self.for_decoder(decoder), f.name)]
        if ignored:
            name = ignored[0].split("=")[0]
            raise InputError(f"{', '.join(ignored)} would be ignored by decoder {decoder!r}; {name} applies to "
                             f"{', '.join(decoders_reading(name))}")
        for name in ("max_iters", "top_k", "prefill_chunk", "verify_tokens"):  # the eval fields' rules
            allowed = EVAL[name].rule(getattr(self, name))
            if allowed:
                raise InputError(f"{name} must be {allowed}, got {getattr(self, name)}")
        if not self.verify_tokens <= block - 1:
            raise InputError(f"verify_tokens must lie in 0..{block - 1} (0: the whole block of {block - 1} "
                             f"draft tokens), got {self.verify_tokens}")
        if DECODERS[decoder].loop and not 1 <= self.branches <= block - 1:
            raise InputError(f"branches must lie in 1..{block - 1} (one per prefix length of a block of {block}), "
                             f"got {self.branches}")
