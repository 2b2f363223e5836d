"""The registry of methods: every causal head and every decoder, in two tables that the
rest of the package reads (construction, training, decoding, checkpoints, config rules, eval).

Adding a head means its module and one `register_head` call: the `HeadSpec` holds its config
sizes and constructor arguments, how it turns logits into a block, its loss terms and their
weights, its checkpoint layout and sizes, and its equations for the checkpoint's config.json.
The config's `heads` and `train.loss` fields, the train step, checkpoints, decoding and eval read
it from here. Adding a decoder means one `DecoderSpec` entry.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from xpress_jax.models.drafter import DrafterConfig
from xpress_jax.models.heads import GRUHead, MarkovHead, XPressRefiner
from xpress_jax.train.losses import teacher_forced, xpress_terms

# how a head turns the drafter's logits s into a block (decoding/refine.py; no head: argmax s)
SERIAL, JACOBI = "serial", "jacobi"
# decoder knobs (decoding/settings.py): which decoders read which
XPRESS_KNOBS = ("max_iters", "early_stop", "top_k")
LOOP_KNOBS = ("branches",)
DRAFT_KNOBS = ("verify_tokens",)  # every decoder with a drafter
COMMON_KNOBS = ("prefill_chunk",)  # every decoder, target-only decoding too


@dataclasses.dataclass(frozen=True)
class HeadSpec:
    """A trainable causal head on top of the drafter: everything the package reads about it."""

    module: type
    # its fields of the config's `heads` section with their defaults; heads that name the same
    # size (rank) share that field
    sizes: Mapping[str, int]
    # constructor arguments from those sizes (a ConfigDict or dict) and the drafter's shape
    kwargs: Callable[[Mapping, DrafterConfig], dict]
    decode: str  # SERIAL (B-1 dependent steps) or JACOBI (parallel fixed-point iterations)
    formula: str  # what the exported tensors mean (heads/NAME.config.json)
    # its loss terms, each a field `train.loss.TERM` with its default weight
    loss_weights: Mapping[str, float]
    # (head, losses.HeadBatch) -> {term: (weighted sum, weight sum)}, plus `sim_tau_*` metrics;
    # None: one teacher-forced CE + TV term named as the single key of loss_weights
    loss: Callable | None = None
    # its terms include CE + TV on the drafter's own logits s, so DFlash's CE is logged, not
    # added, while it trains (train.loss.dflash_ce_with_heads adds it anyway)
    trains_drafter_logits: bool = False
    # module parameter path -> safetensors key, where the file follows another project's layout
    file_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # the sizes heads/NAME.config.json records, from the tensor shapes (keyed by file key)
    dims: Callable[[dict], dict] = lambda shapes: {}

    def __post_init__(self):
        if self.decode not in (SERIAL, JACOBI):
            raise ValueError(f"HeadSpec.decode must be {SERIAL!r} or {JACOBI!r}, got {self.decode!r}")
        if self.loss is None and len(self.loss_weights) != 1:
            raise ValueError("a HeadSpec without its own loss has exactly one loss term")

    def checkpoint_file(self, name: str) -> str:
        """Where the head lives inside a drafter directory."""
        return f"heads/{name}.safetensors"

    def loss_terms(self, head, batch) -> dict:
        """{term: (weighted sum, weight sum)} over a losses.HeadBatch (and `sim_tau_*` metrics)."""
        terms = (self.loss or teacher_forced(next(iter(self.loss_weights))))(head, batch)
        unknown = sorted(k for k in terms if k not in self.loss_weights and not k.startswith("sim_tau"))
        if unknown:
            raise ValueError(f"{self.module.__name__}'s loss returned terms {unknown} that its HeadSpec.loss_weights "
                             "does not declare (they would train with no weight)")
        return terms


def _base(d: DrafterConfig) -> dict:
    return {"vocab_size": d.vocab_size, "hidden_size": d.hidden_size}


_MARKOV_KEYS = {"markov_w1": "markov_head.markov_w1.weight", "markov_w2": "markov_head.markov_w2.weight"}

HEADS: dict[str, HeadSpec] = {}


def register_head(name: str, spec: HeadSpec, decoder: bool = True) -> None:
    """Adds a head (and, by default, the decoder of the same name that drafts through it). A
    size or loss term another head already declares must keep that head's default."""
    if name in HEADS or name in DECODERS:
        raise ValueError(f"a head or decoder named {name!r} is already registered")
    for what, mine, theirs in (("size", spec.sizes, head_size_defaults()),
                               ("loss term", spec.loss_weights, head_loss_weights())):
        clash = {k: (v, theirs[k]) for k, v in mine.items() if k in theirs and theirs[k] != v}
        if clash:
            raise ValueError(f"head {name!r}: {what} defaults {clash} differ from those already registered")
    HEADS[name] = spec
    if decoder:
        DECODERS[name] = DecoderSpec(head=name)


def head_size_defaults() -> dict[str, int]:
    """The `heads` section's fields and their defaults: every registered head's sizes."""
    return {k: v for spec in HEADS.values() for k, v in spec.sizes.items()}


def head_loss_weights() -> dict[str, float]:
    """Every registered head's loss terms (`train.loss.TERM`) with their default weights."""
    return {k: v for spec in HEADS.values() for k, v in spec.loss_weights.items()}


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


DECODERS: dict[str, DecoderSpec] = {"target": DecoderSpec(drafter=False), "dflash": DecoderSpec()}
# in the order tables list them: the serial baselines, then XPress, then D-Loop

register_head("markov", HeadSpec(
    MarkovHead, {"rank": 256}, lambda h, d: {**_base(d), "rank": h["rank"]}, SERIAL,
    "l_k = s_k + markov_w1[x_{k-1}] markov_w2^T (SpecForge DSpark layout)",
    loss_weights={"markov": 1.0},
    file_keys=_MARKOV_KEYS,  # SpecForge's DSpark layout, so checkpoints interchange with theirs
    dims=lambda t: {"vocab_size": t[_MARKOV_KEYS["markov_w1"]][0], "rank": t[_MARKOV_KEYS["markov_w1"]][1]}))
register_head("gru", HeadSpec(
    GRUHead, {"gru_hidden": 256, "proj_dim": 256},
    lambda h, d: {**_base(d), "gru_hidden": h["gru_hidden"], "proj_dim": h["proj_dim"]}, SERIAL,
    "state_k = GRU(state_{k-1}, embed(x_{k-1})) without bias; l_k = s_k + W_b silu(W_a [h_k ; state_k])",
    loss_weights={"gru": 1.0}))
register_head("xpress", HeadSpec(
    XPressRefiner, {"rank": 256}, lambda h, d: {**_base(d), "num_positions": d.block_size - 1, "rank": h["rank"]},
    JACOBI,
    "u_k = W_in [W_e[x_{k-1}] ; W_h h_k ; W_g g], g = mean_k h_k; m_k = sum_{j<=k} L[k,j] * u_j; "
    "z_k = m_k + mlp_down(silu(m_k mlp_gate) * (m_k mlp_up)); l_k = s_k + z_k W_r "
    "(every matrix stored [in, out]; L [n, n, rank], lower triangle used)",
    # the paper's consistency term; 0 gave +3-4% tau on held-out prompts for a refiner on a
    # frozen tiny drafter (benchmarks/tiny/checks)
    loss_weights={"xpress_teacher_forced": 1.0, "xpress_anchor": 1.0, "xpress_consistency": 1.0},
    loss=xpress_terms, trains_drafter_logits=True,
    dims=lambda t: {"vocab_size": t["W_e"][0], "rank": t["W_e"][1], "hidden_size": t["W_h"][0],
                    "num_positions": t["L"][0], "block_size": t["L"][0] + 1}))
DECODERS["dloop"] = DecoderSpec(loop=True)
DECODERS["dloop+xpress"] = DecoderSpec(head="xpress", loop=True)


def spec_decoders() -> tuple[str, ...]:
    """The decoders that draft (what eval compares), as registered now."""
    return tuple(n for n, d in DECODERS.items() if d.drafter)


def head_of(decoder: str) -> str | None:
    """The head a decoder drafts through (None: the drafter alone, or no drafter)."""
    return DECODERS[decoder].head


def decoders_reading(knob: str) -> tuple[str, ...]:
    return tuple(n for n, d in DECODERS.items() if knob in d.knobs)


def head_kwargs(name: str, heads_section: Mapping, drafter: DrafterConfig) -> dict:
    """Constructor arguments of head `name` for a config's `heads` section."""
    return HEADS[name].kwargs(heads_section, drafter)
