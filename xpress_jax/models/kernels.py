"""Fused attention for the long passes (training, prefill), and the choice between kernels.

- TPU: splash attention (Pallas, `jax.experimental.pallas.ops.tpu.splash_attention`), for query
  and key lengths in whole 128-key tiles.
- GPU: cuDNN flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`) for a
  causal pass from the first key in bf16/fp16, head_dim <= 128 and a multiple of 8, with KV heads
  split like the query heads; `flash_gpu` (a Pallas GPU kernel, `models/flash_gpu.py`) for the
  rest: an offset, float32, a tensor split that cannot divide the KV heads, the drafter's anchored
  pass. cuDNN is NVIDIA's tuned kernel for Hopper and carries XLA partitioning rules; it cannot
  be traced without a GPU, so a GPU program lowered on a host without one (a dry run here) holds
  `flash_gpu` where a GPU would run cuDNN (`cudnn_available`).
- Anything else, or a shape the kernel refuses: the einsum path (`layers.attend`).

Splash and cuDNN take a causal mask without a dense mask array: splash as a static block mask
(`CausalMask`, whose fully masked blocks it skips), cuDNN as its CAUSAL mask type; flash_gpu as
key intervals per query. None materialises the [batch, heads, T, S] scores. cuDNN's causal mask
is aligned top-left, so a query block placed after other keys (a prefill chunk) has no cuDNN
form: flash_gpu takes it.

The drafter's anchored training pass (`anchored_attention`) takes splash on TPU with a mask made
at run time: block a's queries see the context keys before its anchor p_a and their own block's
keys, a per-sequence pattern that no static block mask expresses. Splash reduces the mask to
per-tile tables (`process_dynamic_mask`) and skips the fully masked tiles (every other block's
keys, the context past a tile's last anchor). On GPU `flash_gpu` takes it as two key intervals
per query (cuDNN's masks are causal or a dense bias).

Every attention call runs inside `attention_scope(part)`, so a traced program names its
attention operations by model part: `train.dry_run` reads from it the share of each part's
attention FLOPs that a platform's program runs in kernels.

`lowering_for("tpu")` traces as for a TPU from any host (`jax.export(..., platforms=["tpu"])`), and
with `interpret=True` runs the Pallas kernel on this CPU (the tests compare it with the einsum path).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator

import jax
import jax.numpy as jnp

from xpress_jax.models import flash_gpu

EINSUM, SPLASH, CUDNN, FLASH_GPU = "einsum", "splash", "cudnn", "flash_gpu"
GPU_PLATFORMS = ("gpu", "cuda", "rocm")
SPLASH_BLOCK = 128  # splash's tile edge on TPU: sequence lengths must be multiples of it
CUDNN_MAX_HEAD_DIM = 128
ATTENTION_SCOPE = "attention"  # named scope of every attention call: "attention:<part>"


def attention_scope(part: str):
    """The named scope an attention call of model part `part` (target, drafter) runs in."""
    return jax.named_scope(f"{ATTENTION_SCOPE}:{part}")

_PLATFORM: contextvars.ContextVar[tuple[str | None, bool]] = contextvars.ContextVar(
    "attention_platform", default=(None, False))


@contextlib.contextmanager
def lowering_for(platform: str, interpret: bool = False) -> Iterator[None]:
    """Within this block, attention is traced as on `platform` ("tpu", "gpu", "cpu"); interpret=True
    runs a Pallas kernel in interpret mode, so it computes on a host without that accelerator."""
    token = _PLATFORM.set((platform, interpret))
    try:
        yield
    finally:
        _PLATFORM.reset(token)


def platform() -> str:
    chosen, _ = _PLATFORM.get()
    return chosen or jax.default_backend()


def cudnn_available() -> bool:
    """cuDNN's attention traces only with a GPU present."""
    return jax.default_backend() == "gpu"


def _kv_heads_split_alike(kv_heads: int | None) -> bool:
    """Whether the mesh's tensor axis divides the KV heads (cuDNN's partitioner needs q, k and v
    split alike; off a mesh, always)."""
    from xpress_jax.sharding import activation_mesh
    mesh = activation_mesh()
    tensor = mesh.shape.get("tensor", 1) if mesh is not None else 1
    return kv_heads is None or kv_heads % tensor == 0


def choose_kernel(q_len: int, kv_len: int, head_dim: int, dtype, offset: int = 0, kv_heads: int | None = None) -> str:
    """The kernel for a causal pass of q_len queries over kv_len keys, query i seeing keys <= i + offset."""
    where = platform()
    if where == "tpu" and q_len % SPLASH_BLOCK == 0 and kv_len % SPLASH_BLOCK == 0:
        return SPLASH
    if where in GPU_PLATFORMS:
        if (jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and offset == 0 and q_len == kv_len
                and head_dim % 8 == 0 and head_dim <= CUDNN_MAX_HEAD_DIM and _kv_heads_split_alike(kv_heads)
                and cudnn_available()):
            return CUDNN
        if flash_gpu.supports(q_len, kv_len, head_dim):
            return FLASH_GPU
    return EINSUM


def choose_anchored_kernel(num_queries: int, num_context: int, head_dim: int) -> str:
    """The kernel for the drafter's anchored pass: num_queries (anchors x block) over num_context
    context keys and the blocks' own keys. Splash on TPU when both key runs fill whole tiles;
    flash_gpu on GPU where its tiles fit."""
    where = platform()
    if where == "tpu" and num_queries % SPLASH_BLOCK == 0 and num_context % SPLASH_BLOCK == 0:
        return SPLASH
    if where in GPU_PLATFORMS and flash_gpu.supports(num_queries, num_context + num_queries, head_dim):
        return FLASH_GPU
    return EINSUM


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, kernel: str, offset: int = 0) -> jax.Array:
    """Grouped-query causal attention through a fused kernel.

    q: [batch, q_len, heads, head_dim]; k, v: [batch, kv_len, kv_heads, head_dim]; query i sees
    keys 0..i + offset (offset static). Returns [batch, q_len, heads, head_dim] in q's dtype."""
    if kernel == SPLASH:
        return _splash(q, k, v, offset)
    if kernel == FLASH_GPU:
        _, interpret = _PLATFORM.get()
        return _on_mesh(lambda q, k, v: flash_gpu.flash_attention(
            q, k, v, flash_gpu.causal_bounds(q.shape[0], q.shape[1], offset), interpret), q, k, v)
    if kernel == CUDNN:
        if offset:
            raise ValueError("cuDNN's causal mask is aligned top-left: no offset")
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=q.shape[-1] ** -0.5,
                                            implementation="cudnn").astype(q.dtype)
    raise ValueError(f"{kernel!r} is not a fused kernel; choose from {SPLASH!r}, {CUDNN!r}, {FLASH_GPU!r}")


def _block(n: int) -> int:
    """The largest splash tile (512, 256 or 128) dividing n; n itself for shorter (interpret mode only)."""
    return next((b for b in (512, 256, SPLASH_BLOCK) if n % b == 0), n)


def _block_sizes(bq: int, bkv: int):
    """Splash's tiles: the same for the forward and both backward kernels."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    return sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                         block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)


@functools.lru_cache(maxsize=64)
def _splash_kernel(group: int, q_len: int, kv_len: int, offset: int, interpret: bool):
    """One KV head's kernel: `group` query heads over shared keys (splash's MQA form)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    mask = sm.MultiHeadMask([sm.CausalMask((q_len, kv_len), offset=offset) for _ in range(group)])
    sizes = _block_sizes(_block(q_len), _block(kv_len))
    # built from constants even when first asked for inside a trace: the cached kernel holds its
    # mask tables as arrays, and a table made under one jit would be a leaked tracer in the next
    with jax.ensure_compile_time_eval():
        return sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def _splash(q, k, v, offset: int):
    """Causal splash attention per sequence and KV head."""
    _, interpret = _PLATFORM.get()

    def local(q, k, v):  # [b, t, h, d], [b, s, kv, d] on one device
        kernel = _splash_kernel(q.shape[2] // k.shape[2], q.shape[1], k.shape[1], offset, interpret)
        return _per_kv_head(jax.vmap(kernel), q, k, v)

    return _on_mesh(local, q, k, v)


def anchored_attention(q: jax.Array, k_ctx: jax.Array, v_ctx: jax.Array, k_blk: jax.Array, v_blk: jax.Array,
                       ctx_bound: jax.Array, kernel: str = SPLASH) -> jax.Array:
    """The drafter's anchored pass through a fused kernel: splash with a run-time mask, or flash_gpu.

    q, k_blk, v_blk: [batch, A*B, heads|kv_heads, head_dim], A blocks of B side by side;
    k_ctx, v_ctx: [batch, S, kv_heads, head_dim]; ctx_bound: [batch, A], the context keys block a
    sees (0..ctx_bound-1: its anchor, or 0 for a padding anchor). Each block also sees its own B
    keys, never another block's. Returns [batch, A*B, heads, head_dim] in q's dtype."""
    _, interpret = _PLATFORM.get()
    num_context = k_ctx.shape[1]
    k, v = jnp.concatenate([k_ctx, k_blk], axis=1), jnp.concatenate([v_ctx, v_blk], axis=1)  # [b, S + A*B, kv, d]
    if kernel == FLASH_GPU:
        def intervals(q, k, v, ctx_bound):
            bounds = flash_gpu.anchored_bounds(ctx_bound, q.shape[1] // ctx_bound.shape[1], num_context)
            return flash_gpu.flash_attention(q, k, v, bounds, interpret)
        return _on_mesh(intervals, q, k, v, ctx_bound)
    if kernel != SPLASH:
        raise ValueError(f"{kernel!r} is not a kernel of the anchored pass; choose from {SPLASH!r}, {FLASH_GPU!r}")

    def local(q, k, v, ctx_bound):  # on one device: [b, A*B, h, d], [b, S + A*B, kv, d], [b, A]
        num_queries, group = q.shape[1], q.shape[2] // k.shape[2]
        block = num_queries // ctx_bound.shape[1]
        query_block = jnp.arange(num_queries) // block  # [A*B]
        key = jnp.arange(k.shape[1])[None, :]  # [1, S + A*B]: the context, then the blocks

        def one_sequence(q, k, v, bound):  # [A*B, h, d], [S + A*B, kv, d], [A]
            visible = jnp.where(key < num_context, key < bound[query_block][:, None],
                                (key - num_context) // block == query_block[:, None])  # [A*B, S + A*B]
            kernel = jax.vmap(_splash_masked_kernel(visible, group, interpret))
            return _per_kv_head(kernel, q[None], k[None], v[None])[0]

        return jax.vmap(one_sequence)(q, k, v, ctx_bound)

    return _on_mesh(local, q, k, v, ctx_bound)


def _splash_masked_kernel(visible: jax.Array, group: int, interpret: bool):
    """Splash's MQA kernel for one sequence under a run-time mask `visible` [q_len, kv_len], the
    same for the `group` query heads of a KV head: the mask's tiles are reduced once and their
    tables indexed alike for every head (splash indexes them by head)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    # the smallest tiles: splash skips whole tiles, and a 128-key tile of the blocks' keys holds 8
    # blocks of 16 where a 512-key one holds 32, of which a query tile reads its own few
    sizes = _block_sizes(SPLASH_BLOCK, SPLASH_BLOCK)
    one_head = sk.make_splash_mqa_single_device(visible[None], block_sizes=sizes, interpret=interpret)

    def every_head(info):
        if info is None:
            return None
        tables = {f: jnp.broadcast_to(getattr(info, f), (group,) + getattr(info, f).shape[1:])
                  for f in ("block_mask", "data_next", "mask_next")}
        return info._replace(is_dynamic_mask=True, **tables)  # a Python flag: the kernel branches on it

    return sk.SplashAttentionKernel(every_head(one_head.fwd_mask_info), every_head(one_head.dq_mask_info),
                                    every_head(one_head.dkv_mask_info), **one_head.kwargs)


def _per_kv_head(kernel, q, k, v):
    """Runs splash's MQA `kernel` (queries [b, group, t, d] over keys [b, s, d]) for every KV head:
    q [b, t, h, d], k, v [b, s, kv, d] -> [b, t, h, d]. Splash takes the scale folded into q."""
    batch, q_len, h, head_dim = q.shape
    kv = k.shape[2]
    qg = (q * head_dim ** -0.5).reshape(batch, q_len, kv, h // kv, head_dim).transpose(0, 2, 3, 1, 4)
    kk, vv = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, kv, s, d]
    out = jax.vmap(kernel, in_axes=1, out_axes=1)(qg, kk, vv)  # [b, kv, group, t, d]
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, q_len, h, head_dim).astype(q.dtype)


def _on_mesh(local, q, k, v, *per_sequence):
    """`local(q, k, v, *per_sequence)` as is off a mesh; on one, inside shard_map over the batch and
    head splits the activations carry (a Pallas call is opaque to XLA's partitioner, which would
    otherwise gather every sequence and head to each device). `per_sequence`: [batch, ...] arrays
    split with the batch."""
    from xpress_jax.sharding import activation_mesh, logical_to_spec
    from xpress_jax.models.layers import KV_AXES, QUERY_AXES
    mesh = activation_mesh()
    if mesh is None or mesh.size == 1:
        return local(q, k, v, *per_sequence)
    heads, kv_heads = q.shape[2], k.shape[2]
    q_spec = logical_to_spec(QUERY_AXES, q.shape, mesh)
    kv_spec = logical_to_spec(KV_AXES, k.shape, mesh)
    if kv_spec[2] != q_spec[2]:  # KV heads that the tensor axis cannot split: one per query head
        k, v = (jnp.repeat(x, heads // kv_heads, axis=2) for x in (k, v))
        kv_spec = logical_to_spec(QUERY_AXES, k.shape, mesh)
    seq_specs = tuple(jax.sharding.PartitionSpec(q_spec[0], *[None] * (x.ndim - 1)) for x in per_sequence)
    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec) + seq_specs, out_specs=q_spec,
                         check_vma=False)(q, k, v, *per_sequence)


# What each fused kernel is called in a lowered program (StableHLO text): the proof that a
# program holds the kernel, not that the code asked for it.
KERNEL_MARKERS = {SPLASH: ("tpu_custom_call", "splash"), CUDNN: ("__cudnn$fmha",),
                  FLASH_GPU: (flash_gpu.TRITON_CALL, "flash_gpu_")}


def kernels_in(program_text: str) -> list[str]:
    """The fused attention kernels a lowered program's text holds (e.g. `jax.export(...).mlir_module()`)."""
    return [kernel for kernel, marks in KERNEL_MARKERS.items() if all(m in program_text for m in marks)]
