"""Fused causal attention for the long passes (training, prefill), and the choice between them.

- TPU: splash attention (Pallas, `jax.experimental.pallas.ops.tpu.splash_attention`), for query
  and key lengths in whole 128-key tiles.
- GPU: cuDNN flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`), in
  bf16/fp16, head_dim <= 128 and a multiple of 8, no offset.
- Anything else, or a shape the kernel refuses: the einsum path (`layers.attend`).

cuDNN rather than a Pallas GPU kernel: jax's cuDNN call carries XLA partitioning rules (it splits
with the mesh's batch and heads without a shard_map), takes GQA and has its backward pass, and is
NVIDIA's tuned kernel for Hopper; jax's Pallas GPU attention is an example kernel without them.

Both kernels take a causal mask without a dense mask array: splash as a static block mask
(`CausalMask`, whose fully masked blocks it skips), cuDNN as its CAUSAL mask type. Neither
materialises the [batch, heads, T, S] scores. cuDNN's causal mask is aligned top-left, so a
query block placed after other keys (a prefill chunk) has no cuDNN form: the einsum path takes it.
The drafter's anchored training pass keeps the einsum path too: each block sees the context
before its own anchor, a per-sequence bound that splash's static block masks cannot express.

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

EINSUM, SPLASH, CUDNN = "einsum", "splash", "cudnn"
SPLASH_BLOCK = 128  # splash's tile edge on TPU: sequence lengths must be multiples of it
CUDNN_MAX_HEAD_DIM = 128

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


def choose_kernel(q_len: int, kv_len: int, head_dim: int, dtype, offset: int = 0) -> str:
    """The kernel for a causal pass of q_len queries over kv_len keys, query i seeing keys <= i + offset."""
    where = platform()
    if where == "tpu" and q_len % SPLASH_BLOCK == 0 and kv_len % SPLASH_BLOCK == 0:
        return SPLASH
    if (where in ("gpu", "cuda", "rocm") and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and offset == 0
            and q_len == kv_len and head_dim % 8 == 0 and head_dim <= CUDNN_MAX_HEAD_DIM):
        return CUDNN
    return EINSUM


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, kernel: str, offset: int = 0) -> jax.Array:
    """Grouped-query causal attention through a fused kernel.

    q: [batch, q_len, heads, head_dim]; k, v: [batch, kv_len, kv_heads, head_dim]; query i sees
    keys 0..i + offset (offset static). Returns [batch, q_len, heads, head_dim] in q's dtype."""
    if kernel == SPLASH:
        return _splash(q, k, v, offset)
    if kernel == CUDNN:
        if offset:
            raise ValueError("cuDNN's causal mask is aligned top-left: no offset")
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=q.shape[-1] ** -0.5,
                                            implementation="cudnn").astype(q.dtype)
    raise ValueError(f"{kernel!r} is not a fused kernel; choose from {SPLASH!r}, {CUDNN!r}")


def _block(n: int) -> int:
    """The largest splash tile (512, 256 or 128) dividing n; n itself for shorter (interpret mode only)."""
    return next((b for b in (512, 256, SPLASH_BLOCK) if n % b == 0), n)


@functools.lru_cache(maxsize=64)
def _splash_kernel(group: int, q_len: int, kv_len: int, offset: int, interpret: bool):
    """One KV head's kernel: `group` query heads over shared keys (splash's MQA form)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    mask = sm.MultiHeadMask([sm.CausalMask((q_len, kv_len), offset=offset) for _ in range(group)])
    bq, bkv = _block(q_len), _block(kv_len)
    sizes = sk.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
                          block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
    # built from constants even when first asked for inside a trace: the cached kernel holds its
    # mask tables as arrays, and a table made under one jit would be a leaked tracer in the next
    with jax.ensure_compile_time_eval():
        return sk.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def _splash(q, k, v, offset: int):
    """Splash attention per sequence and KV head; on a mesh, inside shard_map over the batch and
    head splits the activations carry (a Pallas call is opaque to XLA's partitioner, which would
    otherwise gather every sequence and head to each device)."""
    from xpress_jax.sharding import activation_mesh, logical_to_spec
    from xpress_jax.models.layers import KV_AXES, QUERY_AXES
    _, interpret = _PLATFORM.get()
    heads, kv_heads = q.shape[2], k.shape[2]

    def local(q, k, v):  # [b, t, h, d], [b, s, kv, d] on one device
        batch, q_len, h, head_dim = q.shape
        kv = k.shape[2]
        kernel = _splash_kernel(h // kv, q_len, k.shape[1], offset, interpret)
        # [b, kv, group, t, d]: splash takes the scale folded into the queries
        qg = (q * head_dim ** -0.5).reshape(batch, q_len, kv, h // kv, head_dim).transpose(0, 2, 3, 1, 4)
        kk, vv = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, kv, s, d]
        out = jax.vmap(jax.vmap(kernel))(qg, kk, vv)  # [b, kv, group, t, d]
        return out.transpose(0, 3, 1, 2, 4).reshape(batch, q_len, h, head_dim).astype(q.dtype)

    mesh = activation_mesh()
    if mesh is None or mesh.size == 1:
        return local(q, k, v)
    q_spec = logical_to_spec(QUERY_AXES, q.shape, mesh)
    kv_spec = logical_to_spec(KV_AXES, k.shape, mesh)
    if kv_spec[2] != q_spec[2]:  # KV heads that the tensor axis cannot split: one per query head
        k, v = (jnp.repeat(x, heads // kv_heads, axis=2) for x in (k, v))
        kv_spec = logical_to_spec(QUERY_AXES, k.shape, mesh)
    return jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec,
                         check_vma=False)(q, k, v)


# What each fused kernel is called in a lowered program (StableHLO text): the proof that a
# program holds the kernel, not that the code asked for it.
KERNEL_MARKERS = {SPLASH: ("tpu_custom_call", "splash"), CUDNN: ("__cudnn$fmha",)}


def kernels_in(program_text: str) -> list[str]:
    """The fused attention kernels a lowered program's text holds (e.g. `jax.export(...).mlir_module()`)."""
    return [kernel for kernel, marks in KERNEL_MARKERS.items() if all(m in program_text for m in marks)]
