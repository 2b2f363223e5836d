"""What each measured call must compute and move, and the bound that follows on this machine.

Counts are analytic lower bounds from the shapes (reference §4 and the modules' equations): FLOPs
of the matmuls, and bytes = weights that must stream from memory (a weight read again by each
dependent step is counted again: at Qwen3-8B shapes the vocabulary-sized matrices are 150 MB or
more, far past any cache) plus the float32 logits read and written. The machine's matmul
throughput and memory bandwidth are measured in the same run (`machine_peaks`); a call is then
compute- or memory-bound by whichever time, FLOPs / throughput or bytes / bandwidth, is larger.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from xpress_jax.timing import median_seconds

F32 = 4  # bytes of a float32 logit


@dataclasses.dataclass(frozen=True)
class Shapes:
    batch: int  # sequences
    n: int  # draft positions per block (B - 1)
    vocab: int
    hidden: int
    rank: int  # XPress / Markov rank
    gru_hidden: int
    proj_dim: int
    weight_bytes: int  # bytes per weight element as the call reads it


@dataclasses.dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def times(self, k: float) -> "Cost":
        return Cost(self.flops * k, self.bytes * k)


def logits_traffic(d: Shapes, rows: int) -> Cost:
    """Reading s and writing (then arg-maxing) l for `rows` positions of every sequence."""
    return Cost(0.0, 2.0 * d.batch * rows * d.vocab * F32)


def markov_serial(d: Shapes) -> Cost:
    """n dependent steps; each l_k = s_k + W1[x_{k-1}] W2^T streams W2 [vocab, rank] again."""
    step = Cost(2.0 * d.batch * d.vocab * d.rank, d.vocab * d.rank * d.weight_bytes)
    return step.times(d.n) + logits_traffic(d, d.n)


def gru_serial(d: Shapes) -> Cost:
    """n dependent steps: the GRU cell on embed(x_{k-1}), then W_b silu(W_a [h_k; state_k])."""
    g, p = d.gru_hidden, d.proj_dim
    weights = 3 * (d.hidden + g) * g + (d.hidden + g) * p + p * d.vocab
    step = Cost(2.0 * d.batch * weights, weights * d.weight_bytes + d.batch * d.hidden * d.weight_bytes)
    return step.times(d.n) + logits_traffic(d, d.n)


def xpress_block_constant(d: Shapes) -> Cost:
    """Once per block: mix(h H + g G), g = mean_k h_k."""
    return Cost(2.0 * d.batch * d.n * d.hidden * d.rank + 2.0 * d.batch * d.hidden * d.rank,
                2 * d.hidden * d.rank * d.weight_bytes)


def xpress_iteration(d: Shapes) -> Cost:
    """One Jacobi iteration over all n positions at once: u = E[x_{k-1}], the causal mix, the
    gated MLP (r -> 2r -> r) and the readout z W_r [rank, vocab] (the term that dominates)."""
    r = d.rank
    flops = 2.0 * d.batch * d.n * (d.n * r + 3 * r * 2 * r + r * d.vocab)
    weights = d.n * d.n * r + 3 * r * 2 * r + r * d.vocab
    return Cost(flops, weights * d.weight_bytes + d.batch * d.n * r * d.weight_bytes) + logits_traffic(d, d.n)


def xpress_exact(d: Shapes, iterations: float) -> Cost:
    return xpress_block_constant(d) + xpress_iteration(d).times(iterations)


def xpress_candidates(d: Shapes, iterations: float, top_k: int) -> Cost:
    """Candidate mode: top-k of s once (a read of s), W_r's k columns gathered per position, then
    each iteration reads only those: no vocabulary-sized readout inside the loop."""
    r = d.rank
    gather = Cost(0.0, d.batch * d.n * top_k * r * d.weight_bytes + d.batch * d.n * d.vocab * F32)
    it = Cost(2.0 * d.batch * d.n * (d.n * r + 3 * r * 2 * r + r * top_k),
              (d.n * d.n * r + 3 * r * 2 * r) * d.weight_bytes + d.batch * d.n * top_k * r * d.weight_bytes)
    return xpress_block_constant(d) + gather + it.times(iterations)


def xpress_fold(d: Shapes) -> Cost:
    """Once per checkpoint: E = W_e W_in_e [vocab, r] @ [r, r], plus H and G, and W_r transposed."""
    r = d.rank
    return Cost(2.0 * (d.vocab + 2 * d.hidden) * r * r, (2 * (d.vocab + 2 * d.hidden) + 2 * d.vocab) * r * d.weight_bytes)


def lm_head(d: Shapes) -> Cost:
    """s = h W_lm: the drafter's n hidden states through the target's vocabulary readout."""
    return Cost(2.0 * d.batch * d.n * d.hidden * d.vocab, d.hidden * d.vocab * d.weight_bytes
                + d.batch * d.n * d.vocab * F32)


def drafter_forward(d: Shapes, params: int, block: int, context: int, layers: int, kv_heads: int,
                    heads: int, head_dim: int, act_bytes: int) -> Cost:
    """One drafter pass over a block of `block` tokens against `context` committed positions:
    every weight once (block tokens share it), attention over context + block keys."""
    keys = context + block
    attn = 2.0 * 2.0 * d.batch * block * keys * heads * head_dim * layers
    kv_read = 2.0 * layers * d.batch * keys * kv_heads * head_dim * act_bytes
    return Cost(2.0 * d.batch * block * params + attn, params * d.weight_bytes + kv_read)


H200_READ_BYTES_PER_S = 4.8e12  # NVIDIA's HBM3e figure for the H200: the bound a first GPU run is read against


def h200_roofline(d: Shapes) -> dict:
    """What an H200's memory bandwidth alone allows: one XPress Jacobi iteration (the readout
    streamed once) and one Markov block (the readout streamed at each of its n steps), in bytes
    and in seconds at 4.8 TB/s."""
    iteration, markov = xpress_iteration(d).bytes, markov_serial(d).bytes
    return {"read_bytes_per_s": H200_READ_BYTES_PER_S,
            "xpress_iteration_bytes": iteration, "xpress_iteration_bound_s": iteration / H200_READ_BYTES_PER_S,
            "markov_block_bytes": markov, "markov_block_bound_s": markov / H200_READ_BYTES_PER_S}


def machine_peaks(reps: int = 5) -> dict:
    """Measured float32 matmul throughput (FLOP/s) and streaming read bandwidth (bytes/s)."""
    size = 2048
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    t_mm = median_seconds(matmul, a, reps=reps)
    x = jnp.ones((64 * 2**20,), jnp.float32)  # 256 MiB: far past the caches
    read = jax.jit(lambda v: jnp.sum(v))
    t_rd = median_seconds(read, x, reps=reps)
    return {"matmul_flops_per_s": 2.0 * size**3 / t_mm, "read_bytes_per_s": x.size * 4 / t_rd,
            "matmul_shape": [size, size, size], "read_mib": 256}


def bound(cost: Cost, peaks: dict, measured_s: float) -> dict:
    """The roofline verdict for one call: its lower-bound time and what sets it."""
    t_compute = cost.flops / peaks["matmul_flops_per_s"]
    t_memory = cost.bytes / peaks["read_bytes_per_s"]
    floor = max(t_compute, t_memory)
    return {"gflops": round(cost.flops / 1e9, 4), "mbytes": round(cost.bytes / 1e6, 3),
            "compute_s": t_compute, "memory_s": t_memory, "bound": "compute" if t_compute >= t_memory else "memory",
            "roofline_fraction": round(floor / measured_s, 3) if measured_s > 0 else None}
