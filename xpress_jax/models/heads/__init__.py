"""Causal heads on top of the drafter's independent per-position guesses.

One interface: `head(s, h, prev_tokens, embed)` returns refined logits l [batch, n, vocab] for all
n draft positions at once, given s (the drafter's base logits [batch, n, vocab]), h (its hidden
states [batch, n, hidden]) and prev_tokens [batch, n] (x_{k-1} for position k: the anchor, then
the block's own tokens). Every head is causal: l_k depends on prev_tokens[:k+1] only. The
decoders in `xpress_jax.decoding.refine` turn this into tokens; `xpress_jax.methods.HEADS` registers
each head (constructor arguments, decoding, checkpoint file).
"""

from xpress_jax.models.heads.baselines import GRUHead, MarkovHead
from xpress_jax.models.heads.xpress import FoldedXPress, XPressRefiner

__all__ = ["FoldedXPress", "GRUHead", "MarkovHead", "XPressRefiner"]
