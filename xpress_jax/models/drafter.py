"""The DFlash block-diffusion drafter (reference §2): one parallel pass proposes a block.

Context features (target taps, concatenated) -> `fc` -> `hidden_norm` give one fused vector per
committed token. Every draft layer projects them with its own k_proj/v_proj (no input norm: the
features are already normed) and attends from the block's queries to [context ; block] keys,
non-causally inside the block, at absolute positions. The drafter owns no embedding and no LM
head: callers pass the target's (frozen) `embed` and `logits`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from xpress_jax.errors import ConfigError
from xpress_jax.models import kernels
from xpress_jax.models.layers import (ACTIVATION_AXES, RMSNorm, layer_stack, map_layers,
                                      param, scan_layers)
from xpress_jax.models.qwen3 import KVCache, Qwen3Config
from xpress_jax.sharding import constrain

# the published DFlash drafters' layout (reference §3): what a config or a config.json leaves unsaid
QWEN3_MASK_TOKEN_ID = 151669  # an unused row of the Qwen3 embedding
DFLASH_BLOCK_SIZE = 16
DFLASH_DRAFT_LAYERS = 5


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's spacing rule: round(1 + i * (L - 4) / (n - 1)); Qwen3-8B, 5 layers -> [1, 9, 17, 25, 33]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrafterConfig(Qwen3Config):
    """The drafter's layers are Qwen3 layers with the target's shapes (Qwen3Config's fields; the
    drafter has no embedding or LM head of its own, so tie_word_embeddings is unused), plus what
    DFlash adds: which target layers it reads, its block and its mask token."""
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    block_size: int = DFLASH_BLOCK_SIZE
    mask_token_id: int = QWEN3_MASK_TOKEN_ID

    def __post_init__(self):
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ConfigError(f"target_layer_ids {bad} outside the target's 0..{self.num_target_layers - 1}")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary of {self.vocab_size}")

    @classmethod
    def from_target(cls, target: Qwen3Config, num_layers: int = DFLASH_DRAFT_LAYERS,
                    target_layer_ids: Sequence[int] | None = None, block_size: int = DFLASH_BLOCK_SIZE,
                    mask_token_id: int = QWEN3_MASK_TOKEN_ID) -> "DrafterConfig":
        """Draft layers with the target's layer shapes (as DFlash does)."""
        ids = target_layer_ids or default_target_layer_ids(target.num_hidden_layers, num_layers)
        return cls(hidden_size=target.hidden_size, intermediate_size=target.intermediate_size,
                   num_hidden_layers=num_layers, num_attention_heads=target.num_attention_heads,
                   num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
                   num_target_layers=target.num_hidden_layers, target_layer_ids=tuple(ids),
                   vocab_size=target.vocab_size, block_size=block_size, mask_token_id=mask_token_id,
                   rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta)

    def check_target(self, target: Qwen3Config) -> None:
        """Refuses a target this drafter cannot read (different width, vocabulary or depth)."""
        for mine, theirs, what in ((self.hidden_size, target.hidden_size, "hidden_size"),
                                   (self.vocab_size, target.vocab_size, "vocab_size"),
                                   (self.num_target_layers, target.num_hidden_layers, "number of target layers")):
            if mine != theirs:
                raise ConfigError(f"drafter {what} is {mine} but the target's is {theirs}")

    def to_hf(self) -> dict[str, Any]:
        """config.json as the `dflash` package, SGLang and vLLM read it (reference §3)."""
        return {
            "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)},
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "layer_types": ["full_attention"] * self.num_hidden_layers, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "vocab_size": self.vocab_size, "tie_word_embeddings": False,
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "max_position_embeddings": 40960,
        }

    @classmethod
    def from_hf(cls, hf: dict[str, Any], source: str = "drafter config.json") -> "DrafterConfig":
        base = Qwen3Config.from_hf({**hf, "tie_word_embeddings": False}, source=source)
        missing = [k for k in ("num_target_layers",) if k not in hf]
        if missing:
            raise ConfigError(f"{source}: missing fields {missing}")
        dflash = hf.get("dflash_config") or {}
        n = hf["num_hidden_layers"]
        ids = dflash.get("target_layer_ids") or default_target_layer_ids(hf["num_target_layers"], n)
        return cls(hidden_size=base.hidden_size, intermediate_size=base.intermediate_size, num_hidden_layers=n,
                   num_attention_heads=base.num_attention_heads, num_key_value_heads=base.num_key_value_heads,
                   head_dim=base.head_dim, num_target_layers=hf["num_target_layers"], target_layer_ids=tuple(ids),
                   vocab_size=base.vocab_size, block_size=hf.get("block_size", DFLASH_BLOCK_SIZE),
                   mask_token_id=dflash.get("mask_token_id", QWEN3_MASK_TOKEN_ID),
                   rms_norm_eps=base.rms_norm_eps, rope_theta=base.rope_theta)


# The drafter's context cache is a KVCache over the fused context features: one K/V per draft
# layer and committed token, grown by extend_context and rolled back by length like the target's.
ContextCache = KVCache


class DFlashDrafter(nnx.Module):
    """`scan`: the layers stacked and scanned (training) or unrolled (decoding; `layers.layer_stack`)."""

    def __init__(self, cfg: DrafterConfig, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
                 scan: bool = False):
        self.cfg = cfg
        self.dtype = dtype
        n_feat = len(cfg.target_layer_ids)
        self.fc = param(rngs, (n_feat * cfg.hidden_size, cfg.hidden_size), ("features", "embed"), param_dtype)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axis_name="embed",
                                   param_dtype=param_dtype, rngs=rngs)
        self.layers = layer_stack(cfg.num_hidden_layers, rngs, scan=scan, hidden=cfg.hidden_size,
                                  intermediate=cfg.intermediate_size, heads=cfg.num_attention_heads,
                                  kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, eps=cfg.rms_norm_eps,
                                  rope_theta=cfg.rope_theta, dtype=dtype, param_dtype=param_dtype)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axis_name="embed", param_dtype=param_dtype, rngs=rngs)

    def fuse(self, taps: jax.Array) -> jax.Array:
        """taps: [batch, seq, n_taps, hidden] (target hidden states) -> fused context [batch, seq, hidden]."""
        b, t, n, h = taps.shape
        x = taps.reshape(b, t, n * h).astype(self.dtype) @ self.fc[...].astype(self.dtype)
        return self.hidden_norm(x)

    def context_kv(self, fused: jax.Array, positions: jax.Array):
        """Every layer's (k, v) [batch, seq, kv_heads, head_dim] of fused context at `positions` [batch, seq]:
        a list per layer (unrolled), or k, v with a leading layers axis (scanned)."""
        return map_layers(self.layers, lambda layer: layer.self_attn.keys_values(fused, positions))

    def extend_context(self, cache: ContextCache, taps: jax.Array, num_new: jax.Array | None = None) -> ContextCache:
        """Appends the features of newly committed tokens (taps [batch, t, n, hidden]) at cache.lengths.

        `num_new` [batch] (<= t) says how many of the t are real per sequence; the rest are
        written but left outside the new lengths, so later appends overwrite them.
        """
        t = taps.shape[1]
        positions = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)
        kv = self.context_kv(self.fuse(taps), positions)
        if not isinstance(kv, list):
            kv = [(kv[0][i], kv[1][i]) for i in range(kv[0].shape[0])]
        k = tuple(cache.write(c, k_new, cache.lengths) for c, (k_new, _) in zip(cache.k, kv))
        v = tuple(cache.write(c, v_new, cache.lengths) for c, (_, v_new) in zip(cache.v, kv))
        added = jnp.full_like(cache.lengths, t) if num_new is None else num_new.astype(jnp.int32)
        return ContextCache(k=k, v=v, lengths=cache.lengths + added)

    def __call__(self, block_embeds: jax.Array, cache: ContextCache, num_blocks: int = 1) -> jax.Array:
        """Inference: one block per sequence at positions cache.lengths + arange(B).

        block_embeds: [batch, B, hidden] (target embeddings of [last token, MASK, ...]).
        Returns the final-normed hidden states [batch, B, hidden]; slot k >= 1 predicts token start + k.
        With num_blocks = K the input is K alternative blocks side by side, [batch, K*B, hidden], all
        at the same positions over the shared context; each attends to the context and to itself only.
        """
        batch, width, _ = block_embeds.shape
        block = width // num_blocks
        slot = jnp.arange(width, dtype=jnp.int32)
        positions = cache.lengths[:, None] + slot % block  # [batch, K*B]
        ctx_visible = jnp.arange(cache.max_len)[None, :] < cache.lengths[:, None]  # [batch, max_len]
        ctx_mask = jnp.broadcast_to(ctx_visible[:, None, :], (batch, width, cache.max_len))
        same_block = (slot[:, None] // block) == (slot[None, :] // block)  # [K*B, K*B]
        block_mask = jnp.broadcast_to(same_block, (batch, width, width))
        held = jnp.max(cache.lengths)  # the context slots past it are not read

        @kernels.attention_scope("drafter")
        def context_then_block(q, k_blk, v_blk, carry, ctx, i):
            # the context slots [kv_heads * batch, max_len, head_dim] as far as filled, then the block's own
            return cache.attend_filled(q, [(ctx[0].astype(k_blk.dtype), ctx[1].astype(v_blk.dtype), ctx_mask, held),
                                           (cache.rows(k_blk), cache.rows(v_blk), block_mask, None)]), carry

        x, _, _ = scan_layers(self.layers, block_embeds.astype(self.dtype), positions, context_then_block,
                              per_layer=list(zip(cache.k, cache.v)))
        return self.norm(x)

    def training_context(self, taps: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Every layer's context keys/values of a whole sequence (taps [batch, seq, n, hidden]),
        computed once and shared by every anchored block (as `context_kv` gives them)."""
        batch, seq = taps.shape[:2]
        positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
        return self.context_kv(constrain(self.fuse(taps), ACTIVATION_AXES), positions)

    def anchored_blocks(self, ctx_kv, block_embeds: jax.Array, anchors: jax.Array,
                        anchor_valid: jax.Array | None = None, remat: str = "none") -> jax.Array:
        """Training: many anchored blocks of each sequence in one pass (block-sparse attention).

        ctx_kv: from training_context; block_embeds: [batch, A, B, hidden] embeddings of
        [token at anchor, MASK, ...]; anchors: [batch, A] anchor positions p (block a sits at
        p..p+B-1). A block's queries see context keys at positions < p (strictly) and their own
        block, never another block. Returns hidden states [batch, A, B, hidden].
        `remat`: what each layer keeps for the backward pass (`layers.REMAT_POLICIES`).
        """
        batch, n_anchors, block, hidden = block_embeds.shape
        seq = ctx_kv[0][0].shape[1]  # layer 0's k [batch, seq, ...], in either layout
        ctx_bound = anchors if anchor_valid is None else jnp.where(anchor_valid, anchors, 0)  # [batch, A]: padding anchors see only their own block
        flat_pos = (anchors[:, :, None] + jnp.arange(block, dtype=jnp.int32)).reshape(batch, n_anchors * block)
        x = constrain(block_embeds.reshape(batch, n_anchors * block, hidden).astype(self.dtype), ACTIVATION_AXES)
        kernel = kernels.choose_anchored_kernel(n_anchors * block, seq, self.cfg.head_dim)

        @kernels.attention_scope("drafter")
        def anchored(q, k_blk, v_blk, carry, ctx, i):
            if kernel != kernels.EINSUM:
                return kernels.anchored_attention(q, ctx[0], ctx[1], k_blk, v_blk, ctx_bound, kernel), carry
            return _anchored_attention(q, ctx[0], ctx[1], k_blk, v_blk, ctx_bound), carry

        x, _, _ = scan_layers(self.layers, x, flat_pos, anchored, per_layer=ctx_kv, remat=remat)
        return self.norm(x).reshape(batch, n_anchors, block, hidden)

    def train_blocks(self, taps: jax.Array, block_embeds: jax.Array, anchors: jax.Array,
                     anchor_valid: jax.Array | None = None) -> jax.Array:
        """training_context + anchored_blocks in one call: [batch, A, B, hidden]."""
        return self.anchored_blocks(self.training_context(taps), block_embeds, anchors, anchor_valid)


def _anchored_attention(q, k_ctx, v_ctx, k_blk, v_blk, ctx_bound):
    """Softmax over [visible context ; own block] for every block, without an A*B x A*B mask: the
    einsum form of `kernels.anchored_attention` (same arguments).

    q, k_blk, v_blk: [batch, A*B, heads|kv_heads, head_dim]; k_ctx, v_ctx: [batch, seq, kv_heads, head_dim];
    ctx_bound: [batch, A], block a sees context keys 0..ctx_bound-1. Memory is A*B*(seq + B) scores
    instead of A*B*(seq + A*B).
    """
    batch, ab, heads, head_dim = q.shape
    n_anchors = ctx_bound.shape[1]
    block = ab // n_anchors
    kv_heads = k_ctx.shape[2]
    group = heads // kv_heads
    qg = q.reshape(batch, n_anchors, block, kv_heads, group, head_dim)
    kb = k_blk.reshape(batch, n_anchors, block, kv_heads, head_dim)
    vb = v_blk.reshape(batch, n_anchors, block, kv_heads, head_dim)
    scale = head_dim**-0.5
    s_ctx = jnp.einsum("baqkgd,bskd->bakgqs", qg, k_ctx, preferred_element_type=jnp.float32) * scale
    s_blk = jnp.einsum("baqkgd,baskd->bakgqs", qg, kb, preferred_element_type=jnp.float32) * scale
    ctx_visible = jnp.arange(k_ctx.shape[1], dtype=jnp.int32)[None, None, :] < ctx_bound[:, :, None]  # [batch, A, seq]
    s_ctx = jnp.where(ctx_visible[:, :, None, None, None, :], s_ctx, -0.7 * float(jnp.finfo(jnp.float32).max))
    probs = jax.nn.softmax(jnp.concatenate([s_ctx, s_blk], axis=-1), axis=-1)
    seq = k_ctx.shape[1]
    p_ctx, p_blk = probs[..., :seq].astype(v_ctx.dtype), probs[..., seq:].astype(vb.dtype)
    out = jnp.einsum("bakgqs,bskd->baqkgd", p_ctx, v_ctx) + jnp.einsum("bakgqs,baskd->baqkgd", p_blk, vb)
    return out.reshape(batch, ab, heads, head_dim)


def block_inputs(anchor_tokens: jax.Array, block_size: int, mask_token_id: int) -> jax.Array:
    """[..., ] anchor ids -> [..., B] block tokens [anchor, MASK x (B-1)]."""
    masks = jnp.full(anchor_tokens.shape + (block_size - 1,), mask_token_id, jnp.int32)
    return jnp.concatenate([anchor_tokens[..., None].astype(jnp.int32), masks], axis=-1)

