"""Building blocks shared by the Qwen3 target and the DFlash drafter.

Every parameter carries logical axis names in its `axes` metadata (vocab, embed, heads, kv_heads,
head_dim, mlp); `xpress_jax.sharding` maps them onto a device mesh.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from xpress_jax.sharding import constrain

# the residual stream's logical axes: batch split over (data, fsdp), the rest whole on each device
ACTIVATION_AXES = ("batch", None, None)  # [batch, seq, hidden]
# Inside attention, the heads follow their projections' split (tensor parallelism): without these,
# XLA may gather every head to each device and compute attention whole on all of them.
QUERY_AXES = ("batch", None, "heads", None)  # [batch, seq, heads, head_dim]
KV_AXES = ("batch", None, "kv_heads", None)  # [batch, seq, kv_heads, head_dim]

# A large negative number rather than -inf: a fully masked row then softmaxes to uniform garbage
# instead of NaN, and such rows (padding) are never read.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
# Slots a decoding step's attention reads at a time (`RowOrder.attend_filled`): its cost grows by
# one chunk per FILL_CHUNK tokens held, and a loop step is long enough to hide the loop's overhead.
FILL_CHUNK = 256
WHOLE_CHUNKS = 4  # a segment of at most this many chunks is read whole (benchmarks/cpu/decode-lengths)


def param(rngs: nnx.Rngs, shape, axes, dtype, *, std: float | None = 0.02) -> nnx.Param:
    """A parameter initialised like HF (normal(0, initializer_range)); `std=None` means ones."""
    if std is None:
        value = jnp.ones(shape, dtype)
    else:
        value = std * jax.random.normal(rngs.params(), shape, dtype)
    return nnx.Param(value, axes=tuple(axes))


class RMSNorm(nnx.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in float32 like HF's Qwen3RMSNorm."""

    def __init__(self, dim: int, eps: float, *, axis_name: str, param_dtype, rngs: nnx.Rngs):
        self.weight = param(rngs, (dim,), (axis_name,), param_dtype, std=None)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Half-split rotary embedding (HF `rotate_half`), angles in float32.

    x: [batch, seq, heads, head_dim]; positions: [batch, seq] absolute token positions.
    """
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [batch, seq, head_dim/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [batch, seq, 1, head_dim]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class RowOrder:
    """One order of the merged [kv_heads x batch] row axis that attention reads: keys and values as
    [batch * kv_heads, seq, head_dim], one row of slots per sequence and KV head.

    A mesh can split only the major factor of a merged axis, so each pass takes the order of what
    its mesh splits: passes without a cache (training, pretraining) the batch, over data and fsdp
    (BATCH_MAJOR); the KV caches their heads, as the queries are split when a tensor-split target
    decodes, at any batch (HEADS_MAJOR, `qwen3.KVCache.ORDER`). There is no default order: the rows,
    the per-row values and the attention over them all come from one object.
    """

    heads_first: bool
    major: str  # the logical axis of the major factor ("kv_heads" or "batch")
    axis: str  # the logical axis of the merged rows (`sharding.DEFAULT_RULES`): split as `major` is

    def rows(self, x: jax.Array) -> jax.Array:
        """[batch, seq, kv_heads, head_dim] (what the projections give) -> [batch * kv_heads, seq,
        head_dim]: row h * batch + b heads first, b * kv_heads + h batch first."""
        batch, seq, kv_heads, head_dim = x.shape
        perm = (2, 0, 1, 3) if self.heads_first else (0, 2, 1, 3)
        return jnp.transpose(x, perm).reshape(batch * kv_heads, seq, head_dim)

    def sequence_rows(self, b: jax.Array, batch: int, kv_heads: int) -> jax.Array:
        """The rows [kv_heads] that hold sequence `b` (a traced index) of a batch of `batch`."""
        h = jnp.arange(kv_heads, dtype=jnp.int32)
        return h * batch + b if self.heads_first else b * kv_heads + h

    def per_row(self, values: jax.Array, kv_heads: int) -> jax.Array:
        """Per-sequence values [batch] -> one per row [batch * kv_heads]."""
        return jnp.tile(values, kv_heads) if self.heads_first else jnp.repeat(values, kv_heads)

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """Grouped-query softmax attention under any mask (f32 scores and softmax): XLA's einsums. The
        long causal passes take a fused kernel where the platform has one (`models/kernels.py`).

        q: [batch, q_len, heads, head_dim]; k, v: [batch * kv_heads, kv_len, head_dim] in this
        order (`rows`); mask: [batch, q_len, kv_len] bool, True where a query may attend.
        Returns [batch, q_len, heads, head_dim].

        Why this layout:
        - heads-major, not slots-major: stored slots-major, every step would transpose the whole
          cache to feed the dots (on CPUs 3x the attention itself at batch 64).
        - sequences and KV heads as one leading axis (in either order): the dots want a single
          batch axis, and with a 4-D cache the bitcast between the two makes XLA's CPU compiler
          duplicate each in-place cache write into two fusions and copy every cache buffer four
          times per decoding step (1.3-1.5x slower target-only decoding; benchmarks/cpu/cache-copies/).
        - the queries of a KV group stacked into one [group * q_len] axis, so both dots are plain
          batched matmuls with the cache as stored. With the group and query axes apart, XLA's CPU
          layouts move the probabilities and the values through a transpose in every layer of
          every step (1.23-1.36x slower batch-64 decoding; benchmarks/cpu/attention-layout/).
        """
        batch, q_len, heads, head_dim = q.shape
        q_rows, unrows, row_mask = self._grouped(q, k.shape[0] // batch)
        scores = jnp.einsum("nrd,nsd->nrs", q_rows, k, preferred_element_type=jnp.float32)
        scores = jnp.where(row_mask(mask), scores * (head_dim**-0.5), _MASK_VALUE)  # [rows, group*q_len, kv_len]
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return unrows(jnp.einsum("nrs,nsd->nrd", probs, v))

    def attend_filled(self, q: jax.Array, segments: Sequence[tuple], chunk: int = FILL_CHUNK) -> jax.Array:
        """`attend` over key segments read only as far as they hold anything: each segment (k, v,
        mask, filled) in `attend`'s layouts, of which only the first `filled` slots (a traced count;
        None: all) are read, `chunk` slots at a time in a loop of ceil(filled / chunk) steps, so a
        decoding step costs what its sequences hold and not what their cache could. A segment of
        at most WHOLE_CHUNKS chunks is read whole. The softmax is
        the online one (running max and sum, float32), equal to `attend`'s up to rounding."""
        batch, q_len, heads, head_dim = q.shape
        q_rows, unrows, row_mask = self._grouped(q, segments[0][0].shape[0] // batch)
        n, rows, _ = q_rows.shape
        out_dtype = segments[0][1].dtype

        def add(carry, k, v, mask):  # one more run of keys into the running softmax
            m, total, acc = carry
            scores = jnp.einsum("nrd,nsd->nrs", q_rows, k, preferred_element_type=jnp.float32)
            scores = jnp.where(row_mask(mask), scores * (head_dim**-0.5), _MASK_VALUE)
            m_new = jnp.maximum(m, scores.max(axis=-1))  # [n, rows]
            p = jnp.exp(scores - m_new[..., None])
            scale = jnp.exp(m - m_new)
            acc = acc * scale[..., None] + jnp.einsum("nrs,nsd->nrd", p.astype(v.dtype), v,
                                                      preferred_element_type=jnp.float32)
            return m_new, total * scale + p.sum(axis=-1), acc

        carry = (jnp.full((n, rows), -jnp.inf, jnp.float32), jnp.zeros((n, rows), jnp.float32),
                 jnp.zeros((n, rows, head_dim), jnp.float32))
        for k, v, mask, filled in segments:
            size = k.shape[1]
            # up to WHOLE_CHUNKS chunks the loop's overhead outweighs what it can skip: read whole
            if filled is None or size <= WHOLE_CHUNKS * chunk or _READ_EVERY_SLOT.get():
                carry = add(carry, k, v, mask)
                continue
            width = min(chunk, size)

            def body(i, carry, k=k, v=v, mask=mask, width=width, size=size):
                # the last chunk is read from size - width: slots before i * width were read already
                start = jnp.minimum(i * width, size - width)
                fresh = (start + jnp.arange(width)) >= i * width  # [width]
                chunk_mask = jax.lax.dynamic_slice_in_dim(mask, start, width, axis=2) & fresh
                return add(carry, jax.lax.dynamic_slice_in_dim(k, start, width, axis=1),
                           jax.lax.dynamic_slice_in_dim(v, start, width, axis=1), chunk_mask)
            steps = (jnp.minimum(filled, size) + width - 1) // width
            carry = jax.lax.fori_loop(0, steps, body, carry)
        _, total, acc = carry
        return unrows((acc / total[..., None]).astype(out_dtype))

    def _grouped(self, q: jax.Array, kv_heads: int):
        """The queries of each KV group stacked as rows [batch * kv_heads, group * q_len, head_dim]
        (row = g * q_len + t), with the functions that put the output [same rows, head_dim] back to
        [batch, q_len, heads, head_dim] and a mask [batch, q_len, keys] onto the rows."""
        batch, q_len, heads, head_dim = q.shape
        lead = (kv_heads, batch) if self.heads_first else (batch, kv_heads)  # the row axis, unmerged
        group = heads // kv_heads
        rows = group * q_len
        # [*lead, group, q_len, head_dim]
        q = q.reshape(batch, q_len, kv_heads, group, head_dim).transpose(
            ((2, 0) if self.heads_first else (0, 2)) + (3, 1, 4))

        def unrows(out):
            return out.reshape(lead + (group, q_len, head_dim)).transpose(
                (1, 3, 0, 2, 4) if self.heads_first else (0, 3, 1, 2, 4)).reshape(batch, q_len, heads, head_dim)

        def row_mask(mask):
            m = mask[None, :, None] if self.heads_first else mask[:, None, None]
            return jnp.broadcast_to(m, lead + (group,) + mask.shape[1:]).reshape(batch * kv_heads, rows, -1)
        return q.reshape(batch * kv_heads, rows, head_dim), unrows, row_mask


BATCH_MAJOR = RowOrder(heads_first=False, major="batch", axis="batch")
HEADS_MAJOR = RowOrder(heads_first=True, major="kv_heads", axis="kv_rows")


class Attention(nnx.Module):
    """Qwen3 attention projections: GQA, per-head RMSNorm on q and k before RoPE, no bias.

    Split into queries / keys_values / output so the drafter can inject context keys and values.
    """

    def __init__(self, *, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float,
                 rope_theta: float, dtype, param_dtype, rngs: nnx.Rngs):
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        self.q_proj = param(rngs, (hidden, heads, head_dim), ("embed", "heads", "head_dim"), param_dtype)
        self.k_proj = param(rngs, (hidden, kv_heads, head_dim), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.v_proj = param(rngs, (hidden, kv_heads, head_dim), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.o_proj = param(rngs, (heads, head_dim, hidden), ("heads", "head_dim", "embed"), param_dtype)
        self.q_norm = RMSNorm(head_dim, eps, axis_name="head_dim", param_dtype=param_dtype, rngs=rngs)
        self.k_norm = RMSNorm(head_dim, eps, axis_name="head_dim", param_dtype=param_dtype, rngs=rngs)
        self.rope_theta = rope_theta
        self.dtype = dtype

    def queries(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """x: [batch, seq, hidden] -> [batch, seq, heads, head_dim], normed and rotated."""
        q = constrain(jnp.einsum("bsh,hnd->bsnd", x, self.q_proj[...].astype(self.dtype)), QUERY_AXES)
        return rope(self.q_norm(q), positions, self.rope_theta)

    def keys_values(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x: [batch, seq, hidden] -> k, v: [batch, seq, kv_heads, head_dim]; k normed and rotated."""
        k = constrain(jnp.einsum("bsh,hnd->bsnd", x, self.k_proj[...].astype(self.dtype)), KV_AXES)
        v = constrain(jnp.einsum("bsh,hnd->bsnd", x, self.v_proj[...].astype(self.dtype)), KV_AXES)
        return rope(self.k_norm(k), positions, self.rope_theta), v

    def output(self, attn: jax.Array) -> jax.Array:
        """attn: [batch, seq, heads, head_dim] -> [batch, seq, hidden]."""
        # one contraction over heads * head_dim (a free reshape of both): contracting the two axes
        # separately made XLA's CPU layouts transpose o_proj inside every decoding step
        batch, seq, heads, head_dim = attn.shape
        w = self.o_proj[...].astype(self.dtype).reshape(heads * head_dim, -1)  # [heads * head_dim, hidden]
        return jnp.einsum("bsf,fh->bsh", attn.reshape(batch, seq, heads * head_dim), w)


class SwiGLU(nnx.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.gate_proj = param(rngs, (hidden, intermediate), ("embed", "mlp"), param_dtype)
        self.up_proj = param(rngs, (hidden, intermediate), ("embed", "mlp"), param_dtype)
        self.down_proj = param(rngs, (intermediate, hidden), ("mlp", "embed"), param_dtype)
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = x @ self.gate_proj[...].astype(self.dtype)  # [batch, seq, mlp]
        up = x @ self.up_proj[...].astype(self.dtype)
        return (jax.nn.silu(gate) * up) @ self.down_proj[...].astype(self.dtype)


class DecoderLayer(nnx.Module):
    """Pre-norm Qwen3 block: x + attn(norm(x)), then + mlp(norm(x)).

    The caller says how the queries meet keys (`attention`), so the same layer serves the target
    (its own keys, and its cache) and the drafter (injected context keys plus the block's own).
    """

    def __init__(self, *, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 eps: float, rope_theta: float, dtype, param_dtype, rngs: nnx.Rngs):
        norm = dict(axis_name="embed", param_dtype=param_dtype, rngs=rngs)
        self.input_layernorm = RMSNorm(hidden, eps, **norm)
        self.self_attn = Attention(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                   eps=eps, rope_theta=rope_theta, dtype=dtype,
                                   param_dtype=param_dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(hidden, eps, **norm)
        self.mlp = SwiGLU(hidden, intermediate, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array, positions: jax.Array, attention: Callable, carry: Any = None):
        """x: [batch, seq, hidden] at positions [batch, seq] -> (x after the block, carry).

        attention(q, k, v, carry) -> (attn, carry): q [batch, seq, heads, head_dim] and this
        layer's own k, v [batch, seq, kv_heads, head_dim] give attn [batch, seq, heads, head_dim];
        `carry` is whatever the caller threads through the layers (a KV cache written in place)."""
        h = self.input_layernorm(x)
        q = self.self_attn.queries(h, positions)
        k, v = self.self_attn.keys_values(h, positions)
        attn, carry = attention(q, k, v, carry)
        x = x + self.self_attn.output(attn)
        return x + self.mlp(self.post_attention_layernorm(x)), carry


# XLA's cost analysis counts a while loop's body once, whatever its trip count: a program traced
# inside `unrolled_loops` unrolls the training pass's layer and head-position loops, so that its
# FLOPs are the step's (`train.dry_run` counts them so, with the anchors in one chunk).
_UNROLL_LOOPS: contextvars.ContextVar[bool] = contextvars.ContextVar("unroll_loops", default=False)
_READ_EVERY_SLOT: contextvars.ContextVar[bool] = contextvars.ContextVar("read_every_slot", default=False)


@contextlib.contextmanager
def read_every_slot() -> Iterator[None]:
    """Programs traced inside read every cache slot, filled or not (`RowOrder.attend_filled`'s
    bound off): the cost it saves, measured side by side (benchmarks/cpu/decode-lengths). Traced
    programs are cached, so clear jax's caches around it."""
    token = _READ_EVERY_SLOT.set(True)
    try:
        yield
    finally:
        _READ_EVERY_SLOT.reset(token)


@contextlib.contextmanager
def unrolled_loops() -> Iterator[None]:
    token = _UNROLL_LOOPS.set(True)
    try:
        yield
    finally:
        _UNROLL_LOOPS.reset(token)


def loop_unroll(length: int) -> int:
    """lax.scan's `unroll` for a loop of `length` steps: all of them inside `unrolled_loops`, else 1."""
    return max(length, 1) if _UNROLL_LOOPS.get() else 1


LAYERS = "layers"  # the logical axis of a layer stack (never split: every device runs every layer)
REMAT_POLICIES = {
    "none": None,  # keep every activation for the backward pass
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only each layer's input; recompute the rest
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep the weight matmuls' outputs
}


def layer_stack(num_layers: int, rngs: nnx.Rngs, *, scan: bool, **layer_kwargs) -> nnx.Module:
    """`num_layers` DecoderLayers in one of two layouts, which `scan_layers` runs alike:

    - scan=True: one module whose parameters carry a leading `layers` axis, run under lax.scan:
      training compiles one layer body whatever the depth, and gathers one layer's fsdp-sharded
      weights at a time.
    - scan=False: an nnx.List of layers, unrolled: what decoding wants, since every layer's weights
      and KV cache are then buffers of their own (a scanned step slices them, and XLA's CPU compiler
      copies each slice in every step: 1.9x slower target-only decoding at the tiny shapes).
    """
    def make(layer_rngs):
        return DecoderLayer(rngs=layer_rngs, **layer_kwargs)

    if not scan:
        return nnx.List([make(rngs) for _ in range(num_layers)])
    stack = nnx.split_rngs(splits=num_layers)(nnx.vmap(make, in_axes=(0,), out_axes=0))(rngs)
    for _, var in nnx.to_flat_state(nnx.state(stack)):
        var.set_metadata(axes=(LAYERS,) + tuple(var.get_metadata()["axes"]))
    return stack


def is_scanned(stack: nnx.Module) -> bool:
    return not isinstance(stack, nnx.List)


def map_layers(stack: nnx.Module, fn: Callable) -> Any:
    """fn(layer) for every layer: a list for an unrolled stack, a pytree with a leading `layers`
    axis for a scanned one (`scan_layers` takes either as `per_layer`)."""
    if not is_scanned(stack):
        return [fn(layer) for layer in stack]
    graphdef, params = nnx.split(stack)
    return jax.vmap(lambda p: fn(nnx.merge(graphdef, p)))(params)


def _stacked(per_layer: Any) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer) if isinstance(per_layer, list) else per_layer


def scan_layers(stack: nnx.Module, x: jax.Array, positions: jax.Array, attention: Callable, *,
                carry: Any = None, per_layer: Any = None, tap_rows: Sequence[int] | None = None,
                remat: str = "none"):
    """Runs x [batch, seq, hidden] through a `layer_stack`: under lax.scan if it is scanned, else
    layer by layer, with the same body.

    attention(q, k, v, carry, per_layer_i, i) -> (attn, carry): as DecoderLayer's, plus this
    layer's part of `per_layer` (e.g. the drafter's context keys: a list, or a pytree with a
    leading layers axis) and its index. An unrolled stack may change the carry's structure from
    layer to layer (a cache grows a tuple of per-layer buffers); a scanned one keeps it.
    The residual stream is pinned to the batch split at every layer boundary (`constrain`).

    tap_rows: per layer, the row of a tap buffer its output goes to (-1: not tapped); the buffer
    [rows, batch, seq, hidden] is returned third (None without tap_rows).
    remat: a REMAT_POLICIES name, for a stack that is trained. Returns (x, carry, taps).
    """
    n_taps = 0 if tap_rows is None else max(tap_rows) + 1
    if not is_scanned(stack):
        if remat != "none":
            raise ValueError("remat applies to a scanned layer stack (layer_stack(scan=True))")
        taps = [None] * n_taps
        for i, layer in enumerate(stack):
            layer_input = None if per_layer is None else (
                per_layer[i] if isinstance(per_layer, list) else jax.tree.map(lambda a: a[i], per_layer))
            x, carry = layer(x, positions, lambda q, k, v, c: attention(q, k, v, c, layer_input, i), carry)
            x = constrain(x, ACTIVATION_AXES)
            if n_taps and tap_rows[i] >= 0:
                taps[tap_rows[i]] = x
        return x, carry, (jnp.stack(taps) if n_taps else None)

    graphdef, params = nnx.split(stack)
    num_layers = jax.tree.leaves(params)[0].shape[0]
    # untapped layers write a scratch row past the real ones, so every step is the same in-place write
    rows = jnp.asarray([n_taps if r < 0 else r for r in tap_rows or [-1] * num_layers], jnp.int32)
    taps = jnp.zeros((n_taps + 1,) + x.shape, x.dtype) if n_taps else None

    def body(state, xs):
        x, carry, taps = state
        i, layer_params, layer_input = xs
        layer = nnx.merge(graphdef, layer_params)
        x, carry = layer(x, positions, lambda q, k, v, c: attention(q, k, v, c, layer_input, i), carry)
        x = constrain(x, ACTIVATION_AXES)
        if taps is not None:
            taps = jax.lax.dynamic_update_index_in_dim(taps, x, rows[i], axis=0)
        return (x, carry, taps), None

    if remat != "none":
        body = jax.checkpoint(body, policy=REMAT_POLICIES[remat], prevent_cse=False)
    xs = (jnp.arange(num_layers, dtype=jnp.int32), params, _stacked(per_layer))
    (x, carry, taps), _ = jax.lax.scan(body, (x, carry, taps), xs, unroll=loop_unroll(num_layers))
    return x, carry, (taps[:n_taps] if taps is not None else None)
