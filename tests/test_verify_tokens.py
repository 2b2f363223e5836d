"""settings.verify_tokens = m: the target verifies the block's first m drafts. Lossless (greedy:
target-only tokens; sampling: the target's distribution), the heads' first m positions equal the
first m of their whole-block solve, and acceptance is capped at m."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from head_fixtures import N, inputs, make_head
from spec_fixtures import (BLOCK, SLOTS, chi_square_p, counting_models, exact_first_two, random_models,
                           zero_logit_models)
from xpress_jax.decoding.refine import refine_block
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodingModels, generate
from xpress_jax.errors import InputError

PROMPTS = [[5, 9, 2, 7, 11], [3], [1, 4, 1, 5, 9, 2, 6, 5, 3]]


def target_only(models, prompts, **kw):
    return generate(DecodingModels(models.target), prompts, decoder="target", **kw)


@pytest.mark.parametrize("decoder, options", [("dflash", {}), ("markov", {}), ("gru", {}), ("xpress", dict(max_iters=2)),
                                              ("xpress", dict(max_iters=4, top_k=5)), ("dloop", dict(branches=2)),
                                              ("dloop+xpress", dict(branches=2))])
@pytest.mark.parametrize("verify_tokens", [1, 2])
def test_greedy_equals_target_only(decoder, options, verify_tokens):
    models = random_models("xpress" if decoder == "dloop+xpress" else decoder, seed=verify_tokens)
    ref = target_only(models, PROMPTS, max_new_tokens=11, max_len=SLOTS)
    out = generate(models, PROMPTS, decoder=decoder, max_new_tokens=11, max_len=SLOTS, verify_tokens=verify_tokens, **options)
    assert out.tokens == ref.tokens
    accepted_at = out.stats["accepted_at"]  # [batch, B-1]: no step accepts past position m
    assert (accepted_at[:, verify_tokens:] == 0).all()


@pytest.mark.parametrize("verify_tokens", [1, 2, BLOCK - 1])
def test_every_draft_accepted_commits_m_plus_one_per_step(verify_tokens):
    models = zero_logit_models()  # the target wants zeros and the drafter drafts them
    out = generate(models, PROMPTS, decoder="dflash", max_new_tokens=13, max_len=SLOTS, verify_tokens=verify_tokens)
    assert out.tokens == target_only(models, PROMPTS, max_new_tokens=13, max_len=SLOTS).tokens
    per_step = verify_tokens + 1
    steps = -(-12 // per_step)  # the first token comes from prefill
    assert out.stats["steps"].tolist() == [steps] * 3
    assert (out.stats["accepted_at"][:, :verify_tokens] >= steps - 1).all()
    # an all-zero draft repeats itself at each of its positions 2..m
    assert (out.stats["draft_repeats"] == out.stats["steps"] * (verify_tokens - 1)).all()


@pytest.mark.parametrize("decoder", ["markov", "xpress"])
def test_counting_heads_are_capped_at_m(decoder):
    models = counting_models(decoder)
    options = dict(max_iters=BLOCK - 1) if decoder == "xpress" else {}
    out = generate(models, [[3, 4], [10]], decoder=decoder, max_new_tokens=13, max_len=SLOTS, verify_tokens=2, **options)
    assert out.tokens == target_only(models, [[3, 4], [10]], max_new_tokens=13, max_len=SLOTS).tokens
    assert out.tau == pytest.approx(3.0)  # 12 tokens after prefill, 3 per step


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name, settings", [
    ("markov", DecodeSettings()), ("gru", DecodeSettings()),
    ("xpress", DecodeSettings(max_iters=1)), ("xpress", DecodeSettings(max_iters=3)),
    ("xpress", DecodeSettings(max_iters=N, early_stop=False)), ("xpress", DecodeSettings(max_iters=4, top_k=6))])
def test_heads_first_m_positions_equal_the_whole_blocks(seed, name, settings):
    """Causal heads: position k reads positions < k only (and XPress's g, the mean of every h), so
    solving the first m positions gives the whole block's first m tokens and logits."""
    head = make_head(name, seed)
    s, h, _, embed = inputs(seed)
    anchor = jnp.array([1, 2, 3])
    solve = jax.jit(lambda s: refine_block(name, head, s, h, anchor, embed, settings=settings))
    whole = solve(s)
    for m in (1, 4, N - 1):
        part = solve(s[:, :m])
        np.testing.assert_array_equal(np.asarray(part.tokens), np.asarray(whole.tokens)[:, :m])
        np.testing.assert_allclose(np.asarray(part.logits), np.asarray(whole.logits)[:, :m], atol=1e-4)
        assert (np.asarray(part.iterations) <= np.asarray(whole.iterations)).all()


def test_xpress_part_reads_the_whole_blocks_mean():
    """g = mean_j h_j over the whole block: the last position's h moves the first two's logits."""
    head = make_head("xpress", 4)
    s, h, _, _ = inputs(4)
    anchor = jnp.array([1, 2, 3])
    a = refine_block("xpress", head, s[:, :2], h, anchor, settings=DecodeSettings(max_iters=2))
    b = refine_block("xpress", head, s[:, :2], h.at[:, -1].add(3.0), anchor, settings=DecodeSettings(max_iters=2))
    assert not np.allclose(np.asarray(a.logits), np.asarray(b.logits))


@pytest.mark.parametrize("decoder", ["dflash", "xpress"])
def test_sampling_preserves_the_target_distribution(decoder):
    models = random_models(decoder, seed=11, vocab=16)
    prompt = [3, 1, 4]
    options = dict(max_iters=2) if decoder == "xpress" else {}
    out = generate(models, [prompt] * 20_000, decoder=decoder, max_new_tokens=3, temperature=1.0, seed=321,
                   verify_tokens=1, **options)
    pairs = np.array([t[:2] for t in out.tokens])
    counts = np.zeros((16, 16))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    p = chi_square_p(counts, exact_first_two(models.target, prompt, 1.0))
    assert p > 1e-3, f"chi-square p = {p:.2e}"
    assert 0.0 < out.stats["accepted_at"][:, 0].mean() < 1.0


def test_bad_verify_tokens_get_clear_errors():
    models = random_models("dflash")
    with pytest.raises(InputError, match=r"verify_tokens must lie in 0\.\.3"):
        generate(models, PROMPTS, decoder="dflash", max_new_tokens=4, verify_tokens=BLOCK)
    with pytest.raises(InputError, match="verify_tokens=1 would be ignored by decoder 'target'"):
        generate(DecodingModels(models.target), PROMPTS, decoder="target", max_new_tokens=4, verify_tokens=1)
    assert DecodeSettings(verify_tokens=2, max_iters=3).for_decoder("dflash") == DecodeSettings(verify_tokens=2)
