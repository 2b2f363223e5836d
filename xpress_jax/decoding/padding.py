"""The padding rule: prompts padded to a few bucket lengths and batches rounded up, so a run
compiles a fixed, small set of decode programs."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from xpress_jax.errors import InputError

# prompt lengths are padded up to a multiple of this, so a few compiled programs serve every prompt
PROMPT_BUCKET = 64


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n."""
    return -(-int(n) // multiple) * multiple


def bucket_length(longest: int, multiple: int = 1, chunk: int = 0) -> int:
    """The length a batch whose longest prompt has `longest` tokens is padded to: a multiple of
    `multiple`, then whole prefill chunks once it is longer than one chunk (chunk 0: no chunking).
    Rounded in that order, never to a common multiple of the two: a fixed length of 576 with
    chunks of 512 pads to 1,024, not to their least common multiple (4,608).
    The decode loop compiles once per bucket (and batch size), so this is the compile key."""
    padded = round_up(longest, multiple)
    if chunk and padded > chunk:
        padded = round_up(padded, chunk)
    return padded


def shared_length(lengths: Sequence[int], chunk: int = 0) -> int:
    """One padded length for prompts of these lengths (an eval's, over every data set): the longest
    one's bucket. Passed as `multiple`, it pads every one of them to itself, so they share a program."""
    return bucket_length(max(lengths), PROMPT_BUCKET, chunk)


def prompt_buckets(max_prompt: int, multiple: int = PROMPT_BUCKET, chunk: int = 0) -> list[int]:
    """Every padded length prompts of 1..max_prompt tokens can get: the fixed set of prompt shapes
    a run compiles (e.g. 11 for 2,048-token prompts, buckets of 64 and prefill chunks of 512)."""
    return sorted({bucket_length(n, multiple, chunk) for n in range(1, max_prompt + 1)})


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0, multiple: int = 1,
                chunk: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads prompts to their bucket's length (`bucket_length`): ids [batch, padded],
    lengths [batch]. Refuses empty prompts."""
    if not prompts:
        raise InputError("no prompts given")
    lengths = np.array([len(p) for p in prompts], np.int32)
    if lengths.min() == 0:
        raise InputError(f"prompt {int(np.argmin(lengths))} is empty; every prompt needs at least one token")
    ids = np.full((len(prompts), bucket_length(lengths.max(), multiple, chunk)), pad_id, np.int32)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    return ids, lengths
