"""Causal heads on top of the drafter's independent per-position guesses.

One interface: `head(s, h, prev_tokens, embed)` returns refined logits l [batch, n, vocab] for all
n draft positions at once, given s (the drafter's base logits [batch, n, vocab]), h (its hidden
states [batch, n, hidden]) and prev_tokens [batch, n] (x_{k-1} for position k: the anchor, then
the block's own tokens). Every head is causal: l_k depends on prev_tokens[:k+1] only. The
decoders in `xpress_jax.decoding.jacobi` turn this into tokens.
"""

from xpress_jax.models.heads.baselines import GRUHead, MarkovHead
from xpress_jax.models.heads.xpress import FoldedXPress, XPressRefiner

HEADS = {"xpress": XPressRefiner, "markov": MarkovHead, "gru": GRUHead}

__all__ = ["HEADS", "FoldedXPress", "GRUHead", "MarkovHead", "XPressRefiner"]
