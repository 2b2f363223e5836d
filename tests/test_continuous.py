"""Continuous batching (decoding/continuous.py): the tokens of static greedy decoding, on one
device and split over four; less idle decode work on answers of mixed lengths; rows sized from a
device's memory."""

import types

import jax
import numpy as np
import pytest

from xpress_jax import assets
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.data.chat import load_tokenizer, prompt_ids
from xpress_jax.data.questions import load_questions
from xpress_jax.decoding.continuous import DEFAULT_ROWS, admission_buckets, rows_that_fit, serve_greedy
from xpress_jax.decoding.speculative import DecodingModels, generate
from xpress_jax.errors import InputError


@pytest.fixture(scope="module")
def tiny():
    """The shipped tiny target and 10 questions whose answers end at different lengths."""
    target = load_qwen3(assets.TINY_TARGET, scan=False)
    tok = load_tokenizer(assets.TINY_TARGET)
    questions = [q for pair in zip(load_questions("gsm8k", 5), load_questions("alpaca", 5)) for q in pair]
    prompts = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    static = generate(DecodingModels(target), prompts, decoder="target", max_new_tokens=64, stop_ids=stops,
                      pad_multiple=64)
    return target, prompts, stops, static


def test_continuous_batching_gives_static_greedy_tokens_with_less_idle_work(tiny):
    target, prompts, stops, static = tiny
    lengths = sorted(len(t) for t in static.tokens)
    assert lengths[0] < lengths[-1] == 64  # mixed: some answers end early, some run to the budget
    served = serve_greedy(target, prompts, rows=3, max_new_tokens=64, stop_ids=stops)
    assert served.tokens == static.tokens
    assert served.useful == sum(len(t) - 1 for t in static.tokens)  # first tokens come from the prefills
    # static batches of 3 decode until each batch's longest answer ends
    static_slots = sum(3 * max(len(t) - 1 for t in static.tokens[i:i + 3]) for i in range(0, len(prompts), 3))
    assert served.slots < static_slots and served.useful / served.slots > 0.8


def test_each_prompt_is_admitted_at_its_own_bucket_with_the_same_tokens(tiny):
    """Admissions prefill each prompt padded to its own bucket (64, 128 or 192 tokens here), not to the
    longest prompt's: the tokens equal those of admissions padded to the queue's bucket."""
    target, prompts, stops, static = tiny
    lengths = [len(p) for p in prompts]
    buckets, bucket_of = admission_buckets(lengths)
    assert buckets == [64, 128, 192] and len({buckets[b] for b in bucket_of}) >= 2
    assert all(n <= buckets[b] < n + 64 for n, b in zip(lengths, bucket_of))
    assert admission_buckets(lengths, "queue") == ([192], [0] * len(prompts))
    queue = serve_greedy(target, prompts, rows=3, max_new_tokens=64, stop_ids=stops, admit_at="queue")
    assert queue.tokens == static.tokens
    with pytest.raises(InputError, match="admit_at must be"):
        admission_buckets(lengths, "longest")


def test_edge_cases_one_token_budgets_and_more_rows_than_prompts(tiny):
    target, prompts, stops, static = tiny
    one = serve_greedy(target, prompts[:4], rows=2, max_new_tokens=1, stop_ids=stops)
    assert one.tokens == [t[:1] for t in static.tokens[:4]] and one.steps == 0
    wide = serve_greedy(target, prompts[:2], rows=5, max_new_tokens=64, stop_ids=stops)
    assert wide.tokens == static.tokens[:2]
    with pytest.raises(InputError, match="rows and max_new_tokens must be >= 1"):
        serve_greedy(target, prompts, rows=0, max_new_tokens=8)


def test_four_devices_each_serve_their_share_with_the_same_tokens(tiny):
    target, prompts, stops, static = tiny
    assert jax.local_device_count() >= 4
    served = serve_greedy(target, prompts, rows=2, max_new_tokens=64, stop_ids=stops, devices=4)
    assert served.tokens == static.tokens


def test_rows_are_sized_from_the_devices_memory(tiny):
    target = tiny[0]
    cpu = types.SimpleNamespace(memory_stats=lambda: None)
    assert rows_that_fit(target, 1024, cpu) == DEFAULT_ROWS
    cfg = target.cfg
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(__import__("flax").nnx.state(target)))
    per_row = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 1024 * 4 + 4 * cfg.vocab_size
    fits = types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": int((weights + 37.5 * per_row) / 0.8)})
    assert rows_that_fit(target, 1024, fits) == 32  # 37 rows fit: 32, a multiple of 8
    few = types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": int((weights + 5.5 * per_row) / 0.8)})
    assert rows_that_fit(target, 1024, few) == 5
    with pytest.raises(InputError, match="do not fit"):
        rows_that_fit(target, 1024, types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": weights}))


def test_an_h200_holds_over_a_hundred_rows_of_the_8b_recipe():
    """Qwen3-8B in bf16 (abstract weights) with 4,097 slots per row (2,048-token prompts and
    answers) on a device reporting an H200's 141 GB: the default regeneration batch per GPU."""
    from flax import nnx
    from xpress_jax.cli import load_config
    from xpress_jax.models.build import build_target
    target = build_target(load_config("configs/qwen3_8b.py"), abstract=True)
    assert isinstance(jax.tree.leaves(nnx.state(target))[0], jax.ShapeDtypeStruct)
    h200 = types.SimpleNamespace(memory_stats=lambda: {"bytes_limit": 141 * 10**9})
    rows = rows_that_fit(target, 4097, h200)
    assert 100 <= rows <= 256 and rows % 8 == 0, rows
    assert np.isclose(rows, (0.8 * 141e9 - 8.19e9 * 2) / (2 * 36 * 8 * 128 * 4097 * 2 + 4 * 151936), atol=8)
