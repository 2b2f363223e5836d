"""The eval's settings: the config's `eval` section as a typed, frozen object. Its fields and their
defaults are the config's (`config.evaluation_defaults`); the command's flags and the reproduction's
passes change them with `dataclasses.replace`, never by mutating a dict."""

from __future__ import annotations

import dataclasses

from xpress_jax.decoding.settings import DecodeSettings


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    datasets: tuple[str, ...]
    decoders: tuple[str, ...]  # methods measured from one --checkpoint (methods.spec_decoders())
    num_prompts: int
    max_new_tokens: int
    temperature: float
    batch_size: int
    seed: int
    max_iters: int  # XPress's Jacobi iterations per block
    early_stop: bool
    top_k: int
    iteration_sweep: tuple[int, ...]  # XPress again at each of these iteration counts (tau against iterations)
    out_dir: str
    max_prompt_tokens: int
    time_split: bool
    candidate_k: int
    dloop_branches: tuple[int, ...]
    verify_tokens: int
    drafter_dtype: str  # the drafter's and heads' weights and compute (config.DTYPES)
    prefill_chunk: int  # longer prompts go through the target in chunks of this many tokens
    lossless_reference: str  # what --check_lossless compares with (config.LOSSLESS_REFERENCES)
    tensor_parallel: int  # local devices the target is split over (1: one device)

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
