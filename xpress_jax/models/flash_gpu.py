"""Flash attention as a Pallas GPU (Triton) kernel, for the attention calls cuDNN does not take.

cuDNN's fused attention (`models/kernels.py`) takes a causal mask aligned top-left or a dense
bias, and its XLA partitioner needs q, k and v split alike. This kernel takes what it leaves:
a causal pass placed after other keys (a prefill chunk), the drafter's anchored pass, and a
tensor split whose KV heads the axis cannot divide (inside a `shard_map`, as splash runs).

Its mask is two key intervals per query, given at run time: query i sees key j when
j < end1[i], or start2[i] <= j < end2[i]. A causal pass with an offset is end1 = i + offset + 1;
block a of the anchored pass is end1 = its anchor p_a (the context before it) and
[start2, end2) = its own block's keys, placed after the context. Each query block reads only
the key blocks its intervals reach (two loops), so a causal pass skips the upper triangle and an
anchored block the context past its anchor and every other block.

Why a kernel of its own: jax's Pallas GPU attention (`pallas.ops.gpu.attention.mha`) is causal
from the top-left corner or by segment ids, which express neither form. A Pallas kernel lowers on
any host (`lowered_for_cuda`: `jax.export(..., platforms=["cuda"])` with the export's check on
its custom call disabled) and runs in Pallas's interpret mode on a CPU,
so it is tested against the einsum path here; cuDNN needs a GPU for both. On a GPU, float32
dots in Triton run in TF32, as XLA's do by default. jax 0.11 deprecates Pallas's Triton backend
for Mosaic GPU (benchmarks/cpu/jax-0.11): this kernel runs there with a warning.

The forward keeps each row's log-sum-exp (base 2); the backward recomputes the probabilities
block by block: a dq kernel over the same key blocks as the forward, a dk/dv kernel over every
query block (masked scores add zero), summed over each KV head's query heads.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

LOG2E = math.log2(math.e)  # scores in base 2: exp2 is the GPU's native exponential
MASKED = -1e30  # finite: a row's all-masked first key block gives exp2(0), erased by the next visible one
TRITON_CALL = "__gpu$xla.gpu.triton"  # the custom call a Pallas GPU kernel lowers to (jax 0.10 and 0.11)


class Bounds(NamedTuple):
    """Each query's visible keys: j < end1, or start2 <= j < end2. Arrays [batch, q_len] int32."""
    end1: jax.Array
    start2: jax.Array
    end2: jax.Array


def lowered_for_cuda(fn, *args) -> str:
    """`fn` (jitted) lowered for CUDA through jax.export, as StableHLO text, on any host. The export's
    check on this kernel's custom call is off: it carries no compatibility guarantee across jax
    versions, and the program is read, not kept."""
    check = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
    with _triton_target():
        return jax.export.export(fn, platforms=["cuda"], disabled_checks=check)(*args).mlir_module()


@contextlib.contextmanager
def _triton_target():
    """jax 0.11's Triton lowering reads its target GPU from the device it lowers on (inside a
    shard_map, the mesh's); on a host without a GPU, this host's device kind names an H200 while
    the block runs (jax 0.10 reads no target). jax keeps that table in a private module: the one
    place it takes a target by device kind."""
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        gpu_info = None
    kind = jax.devices()[0].device_kind
    if jax.default_backend() == "gpu" or gpu_info is None or not hasattr(gpu_info, "registry") \
            or kind in gpu_info.registry:
        yield
        return
    gpu_info.registry[kind] = lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)
    try:
        yield
    finally:
        del gpu_info.registry[kind]


def causal_bounds(batch: int, q_len: int, offset: int = 0) -> Bounds:
    """Query i sees keys 0..i + offset."""
    end1 = jnp.broadcast_to(jnp.arange(q_len, dtype=jnp.int32) + offset + 1, (batch, q_len))
    none = jnp.zeros((batch, q_len), jnp.int32)
    return Bounds(end1, none, none)


def anchored_bounds(ctx_bound: jax.Array, block: int, num_context: int) -> Bounds:
    """Block a (queries a*B..a*B+B-1) sees the context keys before ctx_bound[:, a] and its own B
    keys at num_context + a*B. ctx_bound: [batch, A]."""
    end1 = jnp.repeat(ctx_bound.astype(jnp.int32), block, axis=1)  # [batch, A*B]
    own = num_context + jnp.arange(end1.shape[1], dtype=jnp.int32) // block * block
    start2 = jnp.broadcast_to(own, end1.shape)
    return Bounds(end1, start2, start2 + block)


def tile(n: int) -> int | None:
    """The tile edge for a sequence of n: 64, 32 or 16 (Triton wants powers of two), the largest
    dividing n; None where none does."""
    return next((b for b in (64, 32, 16) if n % b == 0), None)


def supports(q_len: int, kv_len: int, head_dim: int) -> bool:
    return tile(q_len) is not None and tile(kv_len) is not None and head_dim in (16, 32, 64, 128)


def _visible(end1, start2, end2, keys):  # [bq] x3, [bk] -> [bq, bk]
    return (keys[None, :] < end1[:, None]) | ((keys[None, :] >= start2[:, None]) & (keys[None, :] < end2[:, None]))


def _key_blocks(end1, start2, end2, bk: int):
    """The key blocks a query block reads: [0, first) and [second_from, second_to), disjoint."""
    cdiv = lambda n: lax.div(n + bk - 1, bk)  # noqa: E731  (traced ints: pl.cdiv takes Python ints)
    first = cdiv(jnp.max(end1))
    second_to = cdiv(jnp.max(end2))
    second_from = jnp.minimum(jnp.maximum(lax.div(jnp.min(start2), bk), first), second_to)
    return first, second_from, second_to


def _scores(q, k, end1, start2, end2, keys, scale):
    """Masked base-2 scores [bq, bk] in float32."""
    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32) * (scale * LOG2E)
    return jnp.where(_visible(end1, start2, end2, keys), s, MASKED)


def _forward_kernel(q_ref, k_ref, v_ref, end1_ref, start2_ref, end2_ref, o_ref, lse_ref, *, scale: float, bk: int):
    q = q_ref[...]  # [bq, d]
    end1, start2, end2 = end1_ref[...], start2_ref[...], end2_ref[...]  # [bq]
    bq, d = q.shape

    def key_block(j, carry):
        acc, m, l = carry  # [bq, d], [bq], [bq]: FlashAttention's running output, max and sum
        keys = pl.ds(j * bk, bk)
        s = _scores(q, k_ref[keys, :], end1, start2, end2, j * bk + jnp.arange(bk), scale)
        m_next = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp2(s - m_next[:, None])
        correction = jnp.exp2(m - m_next)
        v = v_ref[keys, :]
        acc = correction[:, None] * acc + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc, m_next, correction * l + jnp.sum(p, axis=-1)

    first, second_from, second_to = _key_blocks(end1, start2, end2, bk)
    carry = (jnp.zeros((bq, d), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32))
    carry = lax.fori_loop(0, first, key_block, carry)
    acc, m, l = lax.fori_loop(second_from, second_to, key_block, carry)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)


def _dq_kernel(q_ref, k_ref, v_ref, end1_ref, start2_ref, end2_ref, do_ref, lse_ref, delta_ref, dq_ref, *,
               scale: float, bk: int):
    q, do = q_ref[...], do_ref[...]  # [bq, d]
    end1, start2, end2 = end1_ref[...], start2_ref[...], end2_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]  # [bq]

    def key_block(j, dq):
        keys = pl.ds(j * bk, bk)
        k, v = k_ref[keys, :], v_ref[keys, :]
        p = jnp.exp2(_scores(q, k, end1, start2, end2, j * bk + jnp.arange(bk), scale) - lse[:, None])
        ds = p * (jnp.dot(do, v.T, preferred_element_type=jnp.float32) - delta[:, None])  # [bq, bk]
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    first, second_from, second_to = _key_blocks(end1, start2, end2, bk)
    dq = lax.fori_loop(0, first, key_block, jnp.zeros(q.shape, jnp.float32))
    dq = lax.fori_loop(second_from, second_to, key_block, dq)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, end1_ref, start2_ref, end2_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                scale: float, bq: int):
    k, v = k_ref[...], v_ref[...]  # [bk, d]
    bk = k.shape[0]
    keys = pl.program_id(0) * bk + jnp.arange(bk)

    def query_block(i, carry):
        dk, dv = carry
        rows = pl.ds(i * bq, bq)
        q, do = q_ref[rows, :], do_ref[rows, :]
        p = jnp.exp2(_scores(q, k, end1_ref[rows], start2_ref[rows], end2_ref[rows], keys, scale)
                     - lse_ref[rows][:, None])  # [bq, bk]: zero where masked
        dv = dv + jnp.dot(p.astype(do.dtype).T, do, preferred_element_type=jnp.float32)
        ds = p * (jnp.dot(do, v.T, preferred_element_type=jnp.float32) - delta_ref[rows][:, None])
        return dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=jnp.float32), dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, q_ref.shape[0] // bq, query_block, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _specs(bq: int, bk: int, q_len: int, kv_len: int, d: int, group: int):
    """BlockSpecs over grid (query or key blocks, batch, heads): a block of the first operand's rows,
    the whole of the others'. KV heads are read through h // group (GQA without a copy)."""
    return {
        "rows": pl.BlockSpec((None, bq, None, d), lambda i, b, h: (b, i, h, 0)),
        "whole_q": pl.BlockSpec((None, q_len, None, d), lambda i, b, h: (b, 0, h, 0)),
        "whole_kv": pl.BlockSpec((None, kv_len, None, d), lambda i, b, h: (b, 0, h // group, 0)),
        "kv_rows": pl.BlockSpec((None, bk, None, d), lambda i, b, h: (b, i, h // group, 0)),
        "bound_rows": pl.BlockSpec((None, bq), lambda i, b, h: (b, i)),
        "bound_whole": pl.BlockSpec((None, q_len), lambda i, b, h: (b, 0)),
        "per_head_rows": pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i)),
        "per_head_whole": pl.BlockSpec((None, None, q_len), lambda i, b, h: (b, h, 0)),
    }


def _call(kernel, grid, in_specs, out_specs, out_shape, interpret: bool, name: str):
    from jax.experimental.pallas import triton as plgpu
    return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
                          compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2), interpret=interpret,
                          name=name)


def _forward(q, k, v, bounds: Bounds, interpret: bool):
    batch, q_len, heads, d = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    bq, bk = tile(q_len), tile(kv_len)
    sp = _specs(bq, bk, q_len, kv_len, d, heads // kv_heads)
    return _call(functools.partial(_forward_kernel, scale=d ** -0.5, bk=bk), (q_len // bq, batch, heads),
                 [sp["rows"], sp["whole_kv"], sp["whole_kv"]] + [sp["bound_rows"]] * 3,
                 [sp["rows"], sp["per_head_rows"]],
                 [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, q_len), jnp.float32)],
                 interpret, "flash_gpu_forward")(q, k, v, *bounds)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, bounds, interpret):
    return _forward(q, k, v, bounds, interpret)[0]


def _attention_fwd(q, k, v, bounds, interpret):
    out, lse = _forward(q, k, v, bounds, interpret)
    return out, (q, k, v, bounds, out, lse)


def _attention_bwd(interpret, residuals, d_out):
    q, k, v, bounds, out, lse = residuals
    batch, q_len, heads, d = q.shape
    kv_len, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    bq, bk = tile(q_len), tile(kv_len)
    sp = _specs(bq, bk, q_len, kv_len, d, group)
    d_out = d_out.astype(q.dtype)
    delta = jnp.einsum("bthd,bthd->bht", out.astype(jnp.float32), d_out.astype(jnp.float32))  # [b, h, T]
    scale = d ** -0.5
    dq = _call(functools.partial(_dq_kernel, scale=scale, bk=bk), (q_len // bq, batch, heads),
               [sp["rows"], sp["whole_kv"], sp["whole_kv"]] + [sp["bound_rows"]] * 3
               + [sp["rows"], sp["per_head_rows"], sp["per_head_rows"]],
               sp["rows"], jax.ShapeDtypeStruct(q.shape, q.dtype), interpret,
               "flash_gpu_dq")(q, k, v, *bounds, d_out, lse, delta)
    per_head = jax.ShapeDtypeStruct((batch, kv_len, heads, d), jnp.float32)  # summed over each group below
    head_rows = pl.BlockSpec((None, bk, None, d), lambda i, b, h: (b, i, h, 0))
    dk, dv = _call(functools.partial(_dkv_kernel, scale=scale, bq=bq), (kv_len // bk, batch, heads),
                   [sp["whole_q"], sp["kv_rows"], sp["kv_rows"]] + [sp["bound_whole"]] * 3
                   + [sp["whole_q"], sp["per_head_whole"], sp["per_head_whole"]],
                   [head_rows, head_rows], [per_head, per_head], interpret,
                   "flash_gpu_dkv")(q, k, v, *bounds, d_out, lse, delta)
    fold = lambda x, like: x.reshape(batch, kv_len, kv_heads, group, d).sum(3).astype(like.dtype)  # noqa: E731
    return dq, fold(dk, k), fold(dv, v), None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, bounds: Bounds, interpret: bool = False) -> jax.Array:
    """Attention of q [batch, q_len, heads, head_dim] over k, v [batch, kv_len, kv_heads, head_dim]
    under `bounds`, differentiable in q, k and v. Returns [batch, q_len, heads, head_dim] in q's dtype."""
    if not supports(q.shape[1], k.shape[1], q.shape[-1]):
        raise ValueError(f"flash_gpu takes lengths in tiles of 16 or more and head_dim 16-128 (a power of two), "
                         f"got q {q.shape}, k {k.shape}")
    return _attention(q, k, v.astype(q.dtype), bounds, interpret)
