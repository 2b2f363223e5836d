"""The Qwen3 dense target in Flax NNX: config from HF config.json, static KV cache, hidden taps.

Conventions follow HF `modeling_qwen3.py`: tap id i returns HF `hidden_states[i + 1]`, i.e. the
output of decoder layer i (for the last layer HF reports it after the final norm, and so do we).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
from flax import nnx, struct

from xpress_jax.errors import ConfigError, read_json
from xpress_jax.sharding import constrain
from xpress_jax.models import kernels
from xpress_jax.models.kernels import EINSUM, causal_attention, choose_kernel
from xpress_jax.models.layers import (ACTIVATION_AXES, BATCH_MAJOR, HEADS_MAJOR, RMSNorm, RowOrder, is_scanned,
                                      layer_stack, param, scan_layers)


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Field names are HF's, so a config.json (or a config file's `target` section) maps 1:1."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40960

    @classmethod
    def from_hf(cls, hf: dict[str, Any], *, source: str = "config") -> "Qwen3Config":
        """Builds the config from a parsed HF config.json, refusing what Qwen3 dense is not."""
        model_type = hf.get("model_type")
        if model_type != "qwen3":
            raise ConfigError(f"{source}: model_type is {model_type!r}, expected 'qwen3' (dense Qwen3)")
        for flag in ("attention_bias", "use_sliding_window"):
            if hf.get(flag):
                raise ConfigError(f"{source}: {flag}=true is not supported by the Qwen3 port")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"{source}: rope_type {rope_type!r} is not supported (only 'default')")
        theta = hf.get("rope_theta", rope.get("rope_theta"))
        if theta is None:
            raise ConfigError(f"{source}: no rope_theta (looked at rope_theta and rope_parameters)")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in hf]
        if missing:
            raise ConfigError(f"{source}: missing fields {missing}")
        heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=hf.get("max_position_embeddings", 40960),
        )

    @classmethod
    def from_dir(cls, hf_dir: str) -> "Qwen3Config":
        path = os.path.join(hf_dir, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{hf_dir}: no config.json")
        return cls.from_hf(read_json(path, ConfigError), source=path)

    def to_hf(self) -> dict[str, Any]:
        """A config.json dict that transformers' Qwen3Config reads back to the same model."""
        d = dataclasses.asdict(self)
        d.update(
            architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
            attention_bias=False, attention_dropout=0.0, use_sliding_window=False,
            sliding_window=None, layer_types=["full_attention"] * self.num_hidden_layers,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            initializer_range=0.02, use_cache=True,
        )
        return d


@struct.dataclass
class KVCache:
    """Preallocated keys/values; slot i holds absolute position i of each sequence.

    Rolling back is `cache.rollback(lengths)`: no copy, since slots past a query's position are
    masked and later writes overwrite them.
    """

    k: tuple[jax.Array, ...]  # per layer [kv_heads * batch, max_len, head_dim], rows in ORDER
    v: tuple[jax.Array, ...]
    lengths: jax.Array  # [batch] int32: committed tokens per sequence

    # Heads first: a tensor-split target splits its cache rows by KV head, as its queries.
    ORDER: ClassVar[RowOrder] = HEADS_MAJOR
    AXES: ClassVar[tuple] = (ORDER.axis, None, None)  # [kv_heads * batch, max_len, head_dim]

    @classmethod
    def init(cls, cfg, batch: int, max_len: int, dtype=jnp.float32) -> "KVCache":
        """cfg: anything with num_hidden_layers, num_key_value_heads, head_dim (target or drafter)."""
        shape = (cfg.num_key_value_heads * batch, max_len, cfg.head_dim)
        zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_hidden_layers))
        return cls(k=zeros, v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_hidden_layers)),
                   lengths=jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.k[0].shape[1]

    def rollback(self, lengths: jax.Array) -> "KVCache":
        return self.replace(lengths=lengths.astype(jnp.int32))

    def keep_branch(self, start: jax.Array, branch: jax.Array, width: int) -> "KVCache":
        """After a multi-branch pass wrote branches of `width` slots side by side from `start`
        [batch], moves each sequence's chosen `branch` [batch] to the front (slots start..start+width-1),
        where decoding that branch alone would have written it. Lengths are left to the caller."""
        src = start + branch * width

        def move(rows):  # [kv_heads * batch, max_len, head_dim]; each row moves by its sequence's offsets
            kv_heads = rows.shape[0] // start.shape[0]
            row_src, row_start = self.ORDER.per_row(src, kv_heads), self.ORDER.per_row(start, kv_heads)
            chosen = jax.vmap(lambda row, o: jax.lax.dynamic_slice_in_dim(row, o, width, axis=0))(rows, row_src)
            return write_at(rows, chosen, row_start, axis=1)
        return self.replace(k=tuple(move(c) for c in self.k), v=tuple(move(c) for c in self.v))

    def put_sequence(self, b: jax.Array, one: "KVCache") -> "KVCache":
        """This cache with sequence `b` (a traced index) replaced by `one`, a cache of one sequence
        and as many slots (continuous batching: a finished row takes the next prompt)."""
        batch = self.lengths.shape[0]

        def put(rows, new):  # new: [kv_heads, max_len, head_dim], the one sequence's rows
            return rows.at[self.ORDER.sequence_rows(b, batch, new.shape[0])].set(new.astype(rows.dtype))
        return KVCache(k=tuple(put(r, n) for r, n in zip(self.k, one.k)),
                       v=tuple(put(r, n) for r, n in zip(self.v, one.v)),
                       lengths=self.lengths.at[b].set(one.lengths[0]))

    @classmethod
    def rows(cls, x: jax.Array) -> jax.Array:
        """New keys or values [batch, t, kv_heads, head_dim] as rows in the cache's order."""
        return cls.ORDER.rows(x)

    @classmethod
    def write(cls, layer: jax.Array, new: jax.Array, offsets: jax.Array) -> jax.Array:
        """One layer's buffer [kv_heads * batch, max_len, head_dim] with `new` [batch, t, kv_heads,
        head_dim] (the projections' layout) written at slots offsets..offsets+t-1 of each sequence
        [batch]. Written row by row in the cache's own layout: through a 4-D view of it, XLA's CPU
        compiler copied the whole buffer whenever a step wrote it twice (D-Loop's branch move at
        batch 1)."""
        kv_heads = new.shape[2]
        return write_at(layer, cls.rows(new), cls.ORDER.per_row(offsets, kv_heads), axis=1)

    @classmethod
    def attend(cls, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """Attention over keys and values held in the cache's order (`RowOrder.attend`)."""
        return cls.ORDER.attend(q, k, v, mask)

    @classmethod
    def attend_filled(cls, q: jax.Array, segments) -> jax.Array:
        """Attention over cache segments read as far as they are filled (`RowOrder.attend_filled`)."""
        return cls.ORDER.attend_filled(q, segments)


def write_at(buffer: jax.Array, new: jax.Array, offsets: jax.Array, axis: int = 1) -> jax.Array:
    """buffer: [batch, ...]; new (same rank) is written along `axis` at per-sequence offsets [batch]."""
    def one(b, n, o):
        return jax.lax.dynamic_update_slice_in_dim(b, n.astype(b.dtype), o, axis=axis - 1)
    return jax.vmap(one)(buffer, new, offsets)


def _cache_mask(lengths: jax.Array, max_len: int, seq: int, block_mask: jax.Array | None) -> jax.Array:
    """[batch, seq, max_len]: new token i (written at slot lengths + i) sees every committed slot
    and, among the new slots, those block_mask[i] allows (causal by default)."""
    key_slots = jnp.arange(max_len, dtype=jnp.int32)[None, :]  # [1, max_len]
    rel = key_slots - lengths[:, None]  # [batch, max_len]: index among the new tokens
    if block_mask is None:
        return rel[:, None, :] <= jnp.arange(seq, dtype=jnp.int32)[None, :, None]
    among_new = (rel >= 0) & (rel < seq)
    allowed = jnp.take(block_mask.astype(bool), jnp.clip(rel, 0, seq - 1), axis=1)  # [seq, batch, max_len]
    return (rel < 0)[:, None, :] | (among_new[:, None, :] & jnp.moveaxis(allowed, 0, 1))


@struct.dataclass
class Qwen3Output:
    logits: jax.Array | None  # [batch, seq, vocab] float32
    taps: jax.Array | None  # [batch, seq, n_taps, hidden]
    cache: KVCache | None


class Qwen3(nnx.Module):
    """Qwen3ForCausalLM. `dtype` is the compute dtype, `param_dtype` the storage dtype; `scan`: the
    layers stacked and scanned (training) or unrolled (decoding; `layers.layer_stack`)."""

    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32,
                 scan: bool = False):
        self.cfg = cfg
        self.dtype = dtype
        self.embed_tokens = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), param_dtype)
        self.layers = layer_stack(cfg.num_hidden_layers, rngs, scan=scan, hidden=cfg.hidden_size,
                                  intermediate=cfg.intermediate_size, heads=cfg.num_attention_heads,
                                  kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, eps=cfg.rms_norm_eps,
                                  rope_theta=cfg.rope_theta, dtype=dtype, param_dtype=param_dtype)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, axis_name="embed",
                            param_dtype=param_dtype, rngs=rngs)
        if not cfg.tie_word_embeddings:
            self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), param_dtype)

    # The drafter borrows these two (frozen): it owns no embedding and no LM head.
    def embed(self, tokens: jax.Array) -> jax.Array:
        """tokens: [batch, seq] -> [batch, seq, hidden]. The table is gathered over fsdp first (as
        every weight is, at its use): looked up in an fsdp-sharded table, each device would hold a
        hidden slice of its sequences, and XLA gathers those over the batch to reach the batch split."""
        table = constrain(self.embed_tokens[...], ("vocab", None))  # [vocab, hidden]
        return jnp.take(table, tokens, axis=0).astype(self.dtype)

    def logits(self, h: jax.Array) -> jax.Array:
        """h: [batch, seq, hidden] (already normed) -> [batch, seq, vocab] float32."""
        if self.cfg.tie_word_embeddings:  # contract with the embedding as stored: `.T` would copy it every step
            return jnp.einsum("bsh,vh->bsv", h, self.embed_tokens[...].astype(self.dtype),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("bsh,hv->bsv", h, self.lm_head[...].astype(self.dtype), preferred_element_type=jnp.float32)

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 cache: KVCache | None = None, num_new: jax.Array | None = None,
                 tap_layers: Sequence[int] = (), return_logits: bool = True, logits_at: jax.Array | None = None,
                 attention: str | None = None,
                 block_offsets: jax.Array | None = None, block_mask: jax.Array | None = None) -> Qwen3Output:
        """Runs tokens [batch, seq] through the model.

        With `cache`, the tokens sit at positions cache.lengths + arange(seq), their keys/values
        are written there and the returned cache has lengths + num_new (default: seq). `num_new`
        marks a prefill: a right-padded prompt into an empty cache, with the real lengths. Without
        a cache, plain causal attention at `positions` (default arange).

        Token trees (multi-branch verification): with a cache, `block_offsets` [seq] replaces
        arange(seq) as the tokens' positions relative to cache.lengths, and `block_mask` [seq, seq]
        (query, key) replaces the causal mask among the new tokens; every token still sees the
        whole committed cache.

        `attention`: the kernel (`models/kernels.py`); by default the platform's fused causal
        kernel for a pass without a cache at the default positions (training) and a prefill
        (`num_new`), where the shapes allow it, and the einsum path (`layers.attend`) for the
        rest: decoding and verification over a partly filled cache, token trees.

        `logits_at` [batch]: the logits of that one position per sequence only, [batch, 1, vocab]
        (a prefill reads one row; [batch, seq, vocab] f32 logits of a long prompt would not fit).
        """
        batch, seq = tokens.shape
        num_layers = self.cfg.num_hidden_layers
        bad = [i for i in tap_layers if not 0 <= i < num_layers]
        if bad:
            raise ValueError(f"tap layer ids {bad} are outside 0..{num_layers - 1}")
        if cache is not None:
            if is_scanned(self.layers):
                raise ValueError("a KV cache needs the unrolled layer layout (Qwen3(..., scan=False)): "
                                 "a scanned stack is for passes without a cache")
            if positions is not None:
                raise ValueError("positions are implied by cache.lengths; pass one or the other")
            offsets = jnp.arange(seq, dtype=jnp.int32) if block_offsets is None else block_offsets
            positions = cache.lengths[:, None] + offsets.astype(jnp.int32)  # [batch, seq]
            mask = _cache_mask(cache.lengths, cache.max_len, seq, block_mask)  # [batch, seq, max_len]
        else:
            if block_offsets is not None or block_mask is not None:
                raise ValueError("block_offsets and block_mask describe tokens appended to a cache; pass a cache")
            causal_from_zero = positions is None
            if positions is None:
                positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
            mask = positions[:, None, :] <= positions[:, :, None]  # [batch, seq, seq]

        if attention is None:
            causal = causal_from_zero if cache is None else (num_new is not None and block_mask is None
                                                            and block_offsets is None)
            attention = (choose_kernel(seq, seq, self.cfg.head_dim, self.dtype, kv_heads=self.cfg.num_key_value_heads)
                         if causal else EINSUM)
        x = constrain(self.embed(tokens), ACTIVATION_AXES)  # [batch, seq, hidden]

        @kernels.attention_scope("target")
        def own_keys(q, k, v, written, _, i):  # attention over this pass's keys (and the cache's)
            # a fused kernel reads this pass's own keys: without a cache, or in a prefill (empty cache)
            fused = None if attention == EINSUM else causal_attention(q, k, v, attention)
            if cache is None:
                return (BATCH_MAJOR.attend(q, BATCH_MAJOR.rows(k), BATCH_MAJOR.rows(v), mask)
                        if fused is None else fused), written
            # k, v: [kv_heads * batch, max_len, head_dim] after the write; the written buffers accumulate
            k, v = KVCache.write(cache.k[i], k, cache.lengths), KVCache.write(cache.v[i], v, cache.lengths)
            k, v = constrain(k, KVCache.AXES), constrain(v, KVCache.AXES)  # split with the target's KV heads
            if fused is None:  # the slots past the longest sequence's new tokens are not read
                fused = KVCache.attend_filled(q, [(k, v, mask, jnp.max(cache.lengths) + seq)])
            return fused, written + ((k, v),)

        last = num_layers - 1  # its tap is read after the final norm, as HF reports it
        # one tap row per distinct layer: DFlash's spacing repeats the layers of a shallow target
        # (6 layers, 5 drafter layers: taps 1, 2, 2, 2, 3)
        inner = list(dict.fromkeys(i for i in tap_layers if i != last))
        x, written, inner_taps = scan_layers(
            self.layers, x, positions, own_keys, carry=(),
            tap_rows=[inner.index(i) if i in inner else -1 for i in range(num_layers)] if inner else None)
        x = self.norm(x)
        taps = None
        if tap_layers:  # [batch, seq, n_taps, hidden]
            taps = jnp.stack([x if i == last else inner_taps[inner.index(i)] for i in tap_layers], axis=2)

        new_cache = None
        if cache is not None:
            added = jnp.full((batch,), seq, jnp.int32) if num_new is None else num_new.astype(jnp.int32)
            new_cache = KVCache(k=tuple(k for k, _ in written), v=tuple(v for _, v in written),
                                lengths=cache.lengths + added)
        if logits_at is not None:
            x = jnp.take_along_axis(x, logits_at.astype(jnp.int32)[:, None, None], axis=1)  # [batch, 1, hidden]
        return Qwen3Output(
            logits=self.logits(x) if return_logits else None,
            taps=taps,
            cache=new_cache,
        )
