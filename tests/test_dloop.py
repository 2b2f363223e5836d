"""D-Loop inference: prefix selection, two-pass drafting, multi-branch verification (greedy
lossless token for token, sampling lossless in distribution) and the state it leaves behind."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compiled import jit_call
from spec_fixtures import SLOTS, chi_square_p, exact_first_two, random_models, redraw, zero_logit_models
from xpress_jax.decoding.dloop import (branch_inputs, branch_layout, loop_draft, prefix_scores, select_prefixes,
                                      verify_branches)
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodingModels, adjacent_repeats, generate, prefill
from xpress_jax.decoding.verify import branch_accept
from xpress_jax.errors import InputError
from xpress_jax.models.qwen3 import KVCache

BLOCK = 8  # room for K = 4 branches (prefix lengths 0..6)
PROMPTS = [[5, 9, 2, 7, 11], [3], [1, 4, 1, 5, 9, 2, 6, 5, 3]]


def target_only(models, prompts, **kw):
    return generate(DecodingModels(models.target), prompts, decoder="target", **kw)


def test_prefix_scores_and_top_k_match_numpy():
    rng = np.random.default_rng(0)
    c = rng.uniform(0.05, 1.0, size=(5, 7)).astype(np.float32)
    c[0] = [0.9, 0.9, 0.2, 0.9, 0.9, 0.9, 0.9]  # a confident prefix of 2, then a doubtful token
    expected = np.array([[np.prod(row[:ell]) * (1 - row[ell]) for ell in range(7)] for row in c])
    r = np.asarray(prefix_scores(jnp.asarray(c)))
    np.testing.assert_allclose(r, expected, rtol=1e-5)
    assert int(np.argmax(r[0])) == 2
    top = np.asarray(select_prefixes(jnp.asarray(c), 3))
    np.testing.assert_array_equal(top, np.argsort(-expected, axis=1, kind="stable")[:, :3])


def test_branch_inputs_keep_the_prefix_and_mask_the_suffix():
    first = jnp.asarray([[11, 12, 13, 14]])
    out = np.asarray(branch_inputs(jnp.asarray([7]), first, jnp.asarray([[2, 0, 4]]), mask_id=99))
    assert out.tolist() == [[[7, 11, 12, 99, 99], [7, 99, 99, 99, 99], [7, 11, 12, 13, 14]]]


@pytest.mark.parametrize("decoder, branches, batch", [("dloop", 1, 3), ("dloop", 2, 1), ("dloop", 4, 1),
                                                       ("dloop", 4, 3), ("dloop+xpress", 2, 3)])
def test_greedy_equals_target_only(decoder, branches, batch):
    models = random_models("xpress" if decoder == "dloop+xpress" else "dflash", seed=batch, block=BLOCK)
    ref = target_only(models, PROMPTS[:batch], max_new_tokens=13, max_len=SLOTS)  # 13: not a multiple of the block
    out = generate(models, PROMPTS[:batch], decoder=decoder, branches=branches, max_new_tokens=13, max_len=SLOTS)
    assert out.tokens == ref.tokens
    assert all(len(t) == 13 for t in out.tokens)


def test_greedy_stops_on_stop_token_like_target_only():
    models = random_models("dflash", seed=7, block=BLOCK)
    stop = target_only(models, PROMPTS, max_new_tokens=14, max_len=SLOTS).tokens[0][3]
    ref = target_only(models, PROMPTS, max_new_tokens=14, max_len=SLOTS, stop_ids=[stop])
    out = generate(models, PROMPTS, decoder="dloop", branches=4, max_new_tokens=14, max_len=SLOTS, stop_ids=[stop])
    assert out.tokens == ref.tokens and out.stopped == ref.stopped and out.stopped[0]


def test_full_acceptance_with_branches():
    models = zero_logit_models(block=BLOCK)  # every branch is all zeros and the target wants zeros
    out = generate(models, PROMPTS, decoder="dloop", branches=3, max_new_tokens=17, max_len=SLOTS)
    assert out.tokens == target_only(models, PROMPTS, max_new_tokens=17, max_len=SLOTS).tokens
    assert out.stats["steps"].tolist() == [2, 2, 2]  # 1 from prefill + 8 + 8
    assert (out.stats["accepted_at"] == out.stats["steps"][:, None]).all()


def _prefilled(models, prompt):
    target = models.target
    cache = KVCache.init(target.cfg, 1, 64)
    out = jit_call(target, jnp.asarray([prompt]), cache=cache)
    return out.cache, int(jnp.argmax(out.logits[0, -1]))


def test_each_branch_sees_only_itself():
    models = random_models("dflash", seed=3, block=BLOCK)
    target, n = models.target, BLOCK - 1
    cache, last = _prefilled(models, PROMPTS[2])
    drafts = jax.random.randint(jax.random.key(0), (1, 3, n), 0, target.cfg.vocab_size)
    offsets, mask = branch_layout(3, BLOCK)

    def logits(d):
        tokens = jnp.concatenate([jnp.full((1, 3, 1), last), d], axis=2).reshape(1, 3 * BLOCK)
        return jit_call(target, tokens, cache=cache, block_offsets=offsets, block_mask=mask).logits.reshape(
            1, 3, BLOCK, -1)

    joint = logits(drafts)
    changed = logits(drafts.at[0, 1].set((drafts[0, 1] + 1) % target.cfg.vocab_size))
    np.testing.assert_array_equal(np.asarray(joint[:, [0, 2]]), np.asarray(changed[:, [0, 2]]))
    assert not np.allclose(joint[:, 1, 1:], changed[:, 1, 1:])
    for j in range(3):  # a branch's logits equal a single-branch verification of it
        alone = jit_call(target, jnp.concatenate([jnp.asarray([[last]]), drafts[:, j]], axis=1), cache=cache).logits
        np.testing.assert_allclose(joint[:, j], alone, atol=1e-5)


def test_state_after_multi_branch_verification_equals_direct_decoding():
    models = random_models("dflash", seed=4, block=BLOCK)
    target, drafter, n = models.target, models.drafter, BLOCK - 1
    taps = drafter.cfg.target_layer_ids
    prompt = PROMPTS[0]
    # the prefill's token (`last` below), then its continuation
    greedy = target_only(models, [prompt], max_new_tokens=BLOCK + 1, max_len=SLOTS).tokens[0]
    cache, last = _prefilled(models, prompt)
    assert last == greedy[0]
    right = jnp.asarray(greedy[1:BLOCK])
    wrong = (right + 1) % target.cfg.vocab_size
    drafts = jnp.stack([wrong, wrong.at[:3].set(right[:3]), right])[None]  # branch 2 is the target's own
    branch, acc, nxt, out = verify_branches(target, cache, jnp.asarray([last]), drafts, key=jax.random.key(0),
                                            temperature=1.0, greedy=True, tap_layers=taps)
    assert (int(branch[0]), int(acc[0]), int(nxt[0])) == (2, n, greedy[BLOCK])
    kept = out.cache.rollback(cache.lengths + acc + 1)
    direct = jit_call(target, jnp.asarray([prompt + greedy[:BLOCK]]), cache=KVCache.init(target.cfg, 1, 64),
                      tap_layers=taps)
    used = len(prompt) + BLOCK
    for a, b in zip(kept.k + kept.v, direct.cache.k + direct.cache.v):
        np.testing.assert_allclose(a[:, :used], b[:, :used], atol=1e-5)  # [batch * kv_heads, slots, head_dim]
    np.testing.assert_allclose(out.taps, direct.taps[:, len(prompt):], atol=1e-5)
    # the drafter context grown from the kept branch equals the one grown from the direct pass
    ctx0 = drafter.extend_context(KVCache.init(drafter.cfg, 1, 64), direct.taps[:, :len(prompt)])
    grown = drafter.extend_context(ctx0, out.taps)
    whole = drafter.extend_context(KVCache.init(drafter.cfg, 1, 64), direct.taps)
    for a, b in zip(grown.k + grown.v, whole.k + whole.v):
        np.testing.assert_allclose(a[:, :used], b[:, :used], atol=1e-5)  # [batch * kv_heads, slots, head_dim]


@pytest.mark.parametrize("std", [1.0, 4.0])
def test_first_step_stats_report_the_kept_prefix_and_the_one_pass_block(std):
    """One verification step: the stats' kept prefix, empty-prefix count and one-pass repeats equal
    those of the draft the engine's own pieces make from the prefilled state."""
    models = random_models("dflash", seed=0, block=BLOCK)
    target, drafter = redraw(models.target, 12, std=std), models.drafter  # peaked: some prefixes are kept
    out = generate(models, PROMPTS, decoder="dloop", max_new_tokens=2, max_len=SLOTS)  # the first token, then one step
    assert out.stats["steps"].tolist() == [1, 1, 1]
    for i, prompt in enumerate(PROMPTS):
        ids = jnp.asarray([prompt])
        first_logits, _, ctx = prefill(target, drafter, ids, jnp.asarray([len(prompt)]), 64)
        last = jnp.argmax(first_logits[:, -1], -1).astype(jnp.int32)
        d = loop_draft(target, drafter, ctx, last, DecodeSettings())
        kept = int(d.prefix_len[0, 0])
        assert int(out.stats["prefix_kept"][i]) == kept
        assert int(out.stats["empty_prefix"][i]) == (kept == 0)
        assert int(out.stats["drafter_repeats"][i]) == int(adjacent_repeats(d.one_pass)[0])
        assert int(out.stats["draft_repeats"][i]) == int(adjacent_repeats(d.tokens[:, 0])[0])
        np.testing.assert_array_equal(d.tokens[0, 0, :kept], d.one_pass[0, :kept])  # the prefix is pass 1's
    assert out.stats["prefix_kept"].any() and out.stats["empty_prefix"].any()  # both cases were met


def test_one_pass_decoders_report_no_prefix_and_their_drafters_repeats():
    models = random_models("markov", seed=2, block=BLOCK)
    out = generate(models, PROMPTS, decoder="dflash", max_new_tokens=13, max_len=SLOTS)
    assert (out.stats["drafter_repeats"] == out.stats["draft_repeats"]).all()  # the block is the drafter's
    assert not out.stats["prefix_kept"].any() and not out.stats["empty_prefix"].any()


def test_branch_accept_greedy_keeps_the_longest_branch():
    vocab, n = 6, 4
    want = np.array([[1, 2, 3, 4, 5], [0, 0, 0, 0, 0]])  # the target's argmax per row, per sequence
    logits = jnp.asarray(np.eye(vocab)[np.broadcast_to(want[:, None], (2, 3, n + 1))] * 5.0)  # [2, 3, n+1, V]
    drafts = jnp.asarray([[[1, 2, 0, 0], [1, 2, 3, 0], [1, 0, 0, 0]], [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]])
    branch, acc, nxt = branch_accept(jax.random.key(0), drafts, logits, 1.0, greedy=True)
    assert branch.tolist() == [1, 0] and acc.tolist() == [3, 4] and nxt.tolist() == [4, 0]


def test_branch_accept_sampling_is_the_target_distribution():
    """Three point-mass branches over a vocabulary of 4 (two share a prefix, one duplicates a
    token): the emitted tokens, completed by the target, must follow the target's joint law."""
    vocab, n, runs = 4, 2, 200_000
    rng = np.random.default_rng(1)
    p1 = rng.dirichlet(np.ones(vocab))
    p2 = rng.dirichlet(np.ones(vocab), size=vocab)  # p(x2 | x1)
    p3 = rng.dirichlet(np.ones(vocab), size=(vocab, vocab))  # p(x3 | x1, x2)
    drafts = np.array([[1, 2], [1, 0], [3, 3]])
    logits = np.log(np.stack([np.stack([p1, p2[d[0]], p3[d[0], d[1]]]) for d in drafts]))  # [K, n+1, V]
    branch, acc, nxt = branch_accept(jax.random.key(7), jnp.asarray(np.broadcast_to(drafts, (runs, 3, n))),
                                     jnp.asarray(np.broadcast_to(logits, (runs,) + logits.shape)), 1.0, greedy=False)
    branch, acc, nxt = map(np.asarray, (branch, acc, nxt))
    seqs = np.zeros((runs, 3), int)
    for i in range(runs):
        emitted = list(drafts[branch[i], :acc[i]]) + [nxt[i]]
        while len(emitted) < 3:  # the target continues where verification stopped
            dist = p2[emitted[0]] if len(emitted) == 1 else p3[emitted[0], emitted[1]]
            emitted.append(rng.choice(vocab, p=dist))
        seqs[i] = emitted[:3]
    counts = np.zeros((vocab,) * 3)
    np.add.at(counts, tuple(seqs.T), 1)
    exact = p1[:, None, None] * p2[:, :, None] * p3
    assert chi_square_p(counts, exact) > 1e-3
    # the first node has two distinct children (1 and 3): one of them is accepted with p1[1] + p1[3]
    first = p1[1] + p1[3]
    assert abs((acc >= 1).mean() - first) < 4 * np.sqrt(first * (1 - first) / runs)
    assert (branch > 0).any()


@pytest.mark.parametrize("branches,acceptance", [(1, "rejection"), (3, "rejection"), (3, "match")])
def test_sampling_preserves_the_target_distribution(branches, acceptance):
    """The tree walk, and the harness's rule: the longest branch equal to the target's samples."""
    models = random_models("dflash", seed=11, vocab=16, block=BLOCK)
    prompt = [3, 1, 4]
    out = generate(models, [prompt] * 20_000, decoder="dloop", branches=branches, max_new_tokens=2,
                   temperature=1.0, seed=123, acceptance=acceptance)
    pairs = np.array([t[:2] for t in out.tokens])
    counts = np.zeros((16, 16))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    assert chi_square_p(counts, exact_first_two(models.target, prompt, 1.0)) > 1e-3


def test_bad_branch_requests_get_clear_errors():
    models = random_models("dflash", block=BLOCK)
    with pytest.raises(InputError, match=r"branches must lie in 1\.\.7"):
        generate(models, PROMPTS, decoder="dloop", branches=0, max_new_tokens=4)
    with pytest.raises(InputError, match=r"branches must lie in 1\.\.7"):
        generate(models, PROMPTS, decoder="dloop", branches=8, max_new_tokens=4)
    with pytest.raises(InputError, match="branches=2 would be ignored by decoder 'dflash'"):
        generate(models, PROMPTS, decoder="dflash", branches=2, max_new_tokens=4)
    with pytest.raises(InputError, match="no xpress head"):
        generate(models, PROMPTS, decoder="dloop+xpress", max_new_tokens=4)
    with pytest.raises(InputError, match="needs a drafter"):
        generate(DecodingModels(models.target), PROMPTS, decoder="dloop", max_new_tokens=4)
    with pytest.raises(InputError, match="2 block"):  # K blocks of cache are needed, not one
        generate(models, [[1] * 6], decoder="dloop", branches=2, max_new_tokens=4, max_len=20)
