"""The decoder knobs beyond the decoder's name, in one object with the one set of defaults.

Built once (from `generate`'s arguments or the config's `eval` section) and passed down to the
draft step, the refiner and the profiler. A knob set for a decoder that would ignore it is an
error for a direct request; an evaluation that runs one settings object over many decoders
hands each decoder only the knobs it reads (`for_decoder`).
"""

from __future__ import annotations

import dataclasses

from xpress_jax.errors import InputError

XPRESS_DECODERS = ("xpress", "dloop+xpress")  # read max_iters, early_stop, top_k
LOOP_DECODERS = ("dloop", "dloop+xpress")  # read branches


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    max_iters: int = 4  # Jacobi K of the XPress refiner
    early_stop: bool = True  # end the Jacobi loop at the fixed point
    top_k: int = 0  # > 0: XPress candidate mode over the drafter's top-k per position
    branches: int = 1  # D-Loop's K: prefixes regenerated and verified together

    @classmethod
    def from_eval(cls, e: dict, branches: int = 1) -> "DecodeSettings":
        return cls(max_iters=int(e["max_iters"]), early_stop=bool(e["early_stop"]), top_k=int(e["top_k"]),
                   branches=branches)

    def for_decoder(self, decoder: str) -> "DecodeSettings":
        """These settings with the knobs `decoder` does not read back at their defaults."""
        default = DecodeSettings()
        keep_xpress = decoder in XPRESS_DECODERS
        return dataclasses.replace(
            self, max_iters=self.max_iters if keep_xpress else default.max_iters,
            early_stop=self.early_stop if keep_xpress else default.early_stop,
            top_k=self.top_k if keep_xpress else default.top_k,
            branches=self.branches if decoder in LOOP_DECODERS else default.branches)

    def check(self, decoder: str, block: int) -> None:
        """Ranges, and no knob the decoder would silently ignore."""
        ignored = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != getattr(self.for_decoder(decoder), f.name)]
        if ignored:
            readers = {"max_iters": XPRESS_DECODERS, "early_stop": XPRESS_DECODERS, "top_k": XPRESS_DECODERS,
                       "branches": LOOP_DECODERS}
            name = ignored[0].split("=")[0]
            raise InputError(f"{', '.join(ignored)} would be ignored by decoder {decoder!r}; {name} applies to "
                             f"{', '.join(readers[name])}")
        if self.max_iters < 1:
            raise InputError(f"max_iters (Jacobi K) must be >= 1, got {self.max_iters}")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0, got {self.top_k}")
        if decoder in LOOP_DECODERS and not 1 <= self.branches <= block - 1:
            raise InputError(f"branches must lie in 1..{block - 1} (one per prefix length of a block of {block}), "
                             f"got {self.branches}")
