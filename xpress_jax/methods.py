"""The registry of methods: every causal head and every decoder, in two tables that the
rest of the package reads (construction, training, decoding, checkpoints, config rules, eval).

Adding a head means one `HeadSpec` entry (its module class, its constructor arguments from the
config, how it turns logits into a block, its equations for the checkpoint's config.json) and
its module under `models/heads/`; adding a decoder means one `DecoderSpec` entry.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from xpress_jax.models.drafter import DrafterConfig
from xpress_jax.models.heads import GRUHead, MarkovHead, XPressRefiner

# how a head turns the drafter's logits s into a block (decoding/refine.py; no head: argmax s)
SERIAL, JACOBI = "serial", "jacobi"
# decoder knobs (decoding/settings.py): which decoders read which
XPRESS_KNOBS = ("max_iters", "early_stop", "top_k")
LOOP_KNOBS = ("branches",)
DRAFT_KNOBS = ("verify_tokens",)  # every decoder with a drafter
COMMON_KNOBS = ("prefill_chunk",)  # every decoder, target-only decoding too


@dataclasses.dataclass(frozen=True)
class HeadSpec:
    """A trainable causal head on top of the drafter."""

    module: type
    # constructor arguments from the config's `heads` section and the drafter's shape
    kwargs: Callable[[ml_collections.ConfigDict, DrafterConfig], dict]
    decode: str  # SERIAL (B-1 dependent steps) or JACOBI (parallel fixed-point iterations)
    formula: str  # what the exported tensors mean (heads/NAME.config.json)

    def checkpoint_file(self, name: str) -> str:
        """Where the head lives inside a drafter directory."""
        return f"heads/{name}.safetensors"


def _base(d: DrafterConfig) -> dict:
    return {"vocab_size": d.vocab_size, "hidden_size": d.hidden_size}


HEADS: dict[str, HeadSpec] = {
    "xpress": HeadSpec(
        XPressRefiner, lambda h, d: {**_base(d), "num_positions": d.block_size - 1, "rank": h.rank}, JACOBI,
        "u_k = W_in [W_e[x_{k-1}] ; W_h h_k ; W_g g], g = mean_k h_k; m_k = sum_{j<=k} L[k,j] * u_j; "
        "z_k = m_k + mlp_down(silu(m_k mlp_gate) * (m_k mlp_up)); l_k = s_k + z_k W_r "
        "(every matrix stored [in, out]; L [n, n, rank], lower triangle used)"),
    "markov": HeadSpec(
        MarkovHead, lambda h, d: {**_base(d), "rank": h.rank}, SERIAL,
        "l_k = s_k + markov_w1[x_{k-1}] markov_w2^T (SpecForge DSpark layout)"),
    "gru": HeadSpec(
        GRUHead, lambda h, d: {**_base(d), "gru_hidden": h.gru_hidden, "proj_dim": h.proj_dim}, SERIAL,
        "state_k = GRU(state_{k-1}, embed(x_{k-1})) without bias; l_k = s_k + W_b silu(W_a [h_k ; state_k])"),
}


@dataclasses.dataclass(frozen=True)
class DecoderSpec:
    """How a decoder drafts: with the drafter or not, through which head, with D-Loop's two passes."""

    drafter: bool = True  # False: target-only decoding, the baseline
    head: str | None = None  # the key in HEADS it refines with
    loop: bool = False  # D-Loop: regenerate suffixes after confident prefixes, verify K branches

    @property
    def knobs(self) -> tuple[str, ...]:
        """The DecodeSettings fields this decoder reads; any other knob it would ignore."""
        jacobi = self.head is not None and HEADS[self.head].decode == JACOBI
        return (COMMON_KNOBS + (DRAFT_KNOBS if self.drafter else ()) + (XPRESS_KNOBS if jacobi else ())
                + (LOOP_KNOBS if self.loop else ()))


DECODERS: dict[str, DecoderSpec] = {
    "target": DecoderSpec(drafter=False),
    "dflash": DecoderSpec(),
    "markov": DecoderSpec(head="markov"),
    "gru": DecoderSpec(head="gru"),
    "xpress": DecoderSpec(head="xpress"),
    "dloop": DecoderSpec(loop=True),
    "dloop+xpress": DecoderSpec(head="xpress", loop=True),
}

SPEC_DECODERS = tuple(n for n, d in DECODERS.items() if d.drafter)  # what eval can compare
HEAD_OF = {n: d.head for n, d in DECODERS.items()}  # decoder -> head module name (None: none)


def decoders_reading(knob: str) -> tuple[str, ...]:
    return tuple(n for n, d in DECODERS.items() if knob in d.knobs)


def head_kwargs(name: str, heads_section: ml_collections.ConfigDict, drafter: DrafterConfig) -> dict:
    """Constructor arguments of head `name` for a config's `heads` section."""
    return HEADS[name].kwargs(heads_section, drafter)
