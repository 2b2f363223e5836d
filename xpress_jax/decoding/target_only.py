"""Target-only greedy decoding through the KV cache: prefill, then one token per step, all jitted.

This is the baseline that speculative decoding must reproduce token for token.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from xpress_jax.errors import InputError
from xpress_jax.models.qwen3 import KVCache, Qwen3

PAD = -1  # fills the output after a sequence stops


@dataclasses.dataclass
class Generation:
    tokens: list[list[int]]  # generated ids per sequence, stop token included
    stopped: list[bool]  # ended on a stop token (else on max_new_tokens)


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads prompts to one length: ids [batch, max_prompt], lengths [batch]. Refuses empty prompts."""
    if not prompts:
        raise InputError("no prompts given")
    lengths = np.array([len(p) for p in prompts], np.int32)
    if lengths.min() == 0:
        raise InputError(f"prompt {int(np.argmin(lengths))} is empty; every prompt needs at least one token")
    ids = np.full((len(prompts), lengths.max()), pad_id, np.int32)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    return ids, lengths


def check_fits(lengths: np.ndarray, max_new_tokens: int, max_len: int, *, slack: int = 0) -> None:
    need = int(lengths.max()) + max_new_tokens + slack
    if need > max_len:
        raise InputError(f"the longest prompt has {int(lengths.max())} tokens; with max_new_tokens="
                         f"{max_new_tokens} it needs {need} cache slots but the cache holds {max_len}")


def prefill(model: Qwen3, prompt: jax.Array, prompt_lens: jax.Array, cache: KVCache,
            tap_layers: Sequence[int] = ()):
    """Runs the right-padded prompt [batch, seq]; returns the next greedy token [batch], the output, the cache."""
    out = model(prompt, cache=cache, num_new=prompt_lens, tap_layers=tap_layers)
    last = jnp.take_along_axis(out.logits, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]  # [batch, vocab]
    return jnp.argmax(last, axis=-1).astype(jnp.int32), out


def is_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
    """tokens: [...] -> bool [...]; stop_ids: [n] (may be empty)."""
    return jnp.any(tokens[..., None] == stop_ids, axis=-1)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens"), donate_argnames=("cache",))
def _greedy(graphdef, state, prompt, prompt_lens, cache, stop_ids, max_new_tokens):
    model = nnx.merge(graphdef, state)
    batch = prompt.shape[0]
    token, out = prefill(model, prompt, prompt_lens, cache)
    buf = jnp.full((batch, max_new_tokens), PAD, jnp.int32)  # [batch, max_new]

    def cond(carry):
        step, _, _, done, _ = carry
        return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        step, token, cache, done, buf = carry
        buf = buf.at[:, step].set(jnp.where(done, PAD, token))
        done = done | is_stop(token, stop_ids)
        nxt = model(token[:, None], cache=cache)  # logits [batch, 1, vocab]
        return step + 1, jnp.argmax(nxt.logits[:, 0], -1).astype(jnp.int32), nxt.cache, done, buf

    done = jnp.zeros((batch,), bool)
    _, _, _, done, buf = jax.lax.while_loop(cond, body, (jnp.int32(0), token, out.cache, done, buf))
    return buf, done


def generate_greedy(model: Qwen3, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                    stop_ids: Sequence[int] = (), max_len: int | None = None,
                    cache_dtype=None) -> Generation:
    """Greedy decoding of a batch of prompts (lists of token ids) with the target alone."""
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    ids, lengths = pad_prompts(prompts)
    max_len = max_len or int(lengths.max()) + max_new_tokens
    check_fits(lengths, max_new_tokens, max_len)
    cache = KVCache.init(model.cfg, len(prompts), max_len, cache_dtype or model.dtype)
    graphdef, state = nnx.split(model)
    buf, done = _greedy(graphdef, state, jnp.asarray(ids), jnp.asarray(lengths), cache,
                        jnp.asarray(list(stop_ids), jnp.int32), max_new_tokens)
    buf = np.asarray(buf)
    return Generation(tokens=[[int(t) for t in row if t != PAD] for row in buf],
                      stopped=[bool(d) for d in np.asarray(done)])
