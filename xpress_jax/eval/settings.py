"""The eval's settings: the config's `eval` section as a typed, frozen object, made from the
section's declarations (`config.EVAL`: each field's default and rule), so it has exactly the
section's fields and defaults. The command's flags and the reproduction's passes change it with
`dataclasses.replace`, never by mutating a dict."""

from __future__ import annotations

import dataclasses

from xpress_jax.config import EVAL
from xpress_jax.decoding.settings import DecodeSettings


class _EvalMethods:
    @classmethod
    def from_config(cls, section) -> "EvalSettings":
        """From a config's `eval` section (a ConfigDict or a plain dict); sequences become tuples."""
        values = dict(section.items())
        return cls(**{f.name: tuple(values[f.name]) if isinstance(values[f.name], (list, tuple)) else values[f.name]
                      for f in dataclasses.fields(cls)})

    def decode(self, branches: int = 1) -> DecodeSettings:
        """The decoder knobs of these settings (D-Loop's branch count given per method)."""
        return DecodeSettings(max_iters=self.max_iters, early_stop=self.early_stop, top_k=self.top_k,
                              branches=branches, verify_tokens=self.verify_tokens, prefill_chunk=self.prefill_chunk)

    def as_dict(self) -> dict:
        """What results.json records under `settings`."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}


EvalSettings = dataclasses.make_dataclass(
    "EvalSettings", [(name, f.type, dataclasses.field(default=f.default)) for name, f in EVAL.items()],
    bases=(_EvalMethods,), frozen=True)
EvalSettings.__module__ = __name__
EvalSettings.__doc__ = "The config's `eval` section, typed and frozen (fields and defaults: config.EVAL)."
