"""Speculative decoding is lossless: greedy output equals target-only output token for token,
and sampling preserves the target's distribution (chi-square)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spec_fixtures import (BLOCK, SLOTS, chi_square_p, counting_models, exact_first_two, random_models,
                           zero_logit_models)
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodingModels, generate
from xpress_jax.errors import ConfigError, InputError

PROMPTS = [[5, 9, 2, 7, 11], [3], [1, 4, 1, 5, 9, 2, 6, 5, 3]]
DECODES = [("dflash", {}), ("markov", {}), ("gru", {}), ("xpress", dict(max_iters=2)),
           ("xpress", dict(max_iters=BLOCK - 1, early_stop=False)), ("xpress", dict(max_iters=4, top_k=5))]


def target_only(models, prompts, **kw):
    return generate(DecodingModels(models.target), prompts, decoder="target", **kw)


@pytest.mark.parametrize("decoder, options", DECODES)
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_target_only_random_models(decoder, options, batch):
    models = random_models(decoder, seed=batch)
    prompts = PROMPTS[:batch]
    for max_new in (11, 8):  # 11 is not a multiple of the block
        ref = target_only(models, prompts, max_new_tokens=max_new, max_len=SLOTS)
        out = generate(models, prompts, decoder=decoder, max_new_tokens=max_new, max_len=SLOTS, **options)
        assert out.tokens == ref.tokens
        assert all(len(t) == max_new for t in out.tokens)
        assert out.stats["steps"].min() >= 1


@pytest.mark.parametrize("decoder, options", DECODES)
def test_greedy_stops_on_stop_token_like_target_only(decoder, options):
    models = random_models(decoder, seed=7)
    free = target_only(models, PROMPTS, max_new_tokens=14, max_len=SLOTS)
    stop = free.tokens[0][3]  # a token the first sequence produces early
    ref = target_only(models, PROMPTS, max_new_tokens=14, max_len=SLOTS, stop_ids=[stop])
    out = generate(models, PROMPTS, decoder=decoder, max_new_tokens=14, max_len=SLOTS, stop_ids=[stop], **options)
    assert out.tokens == ref.tokens and out.stopped == ref.stopped
    assert out.stopped[0] and out.tokens[0][-1] == stop and len(out.tokens[0]) <= 4


@pytest.mark.parametrize("decoder", ["markov", "gru", "xpress"])
def test_near_complete_acceptance_counting_target(decoder):
    models = counting_models(decoder)
    prompts = [[3, 4], [10], [30, 31, 0]]
    options = dict(max_iters=BLOCK - 1) if decoder == "xpress" else {}
    out = generate(models, prompts, decoder=decoder, max_new_tokens=13, max_len=SLOTS, **options)
    ref = target_only(models, prompts, max_new_tokens=13, max_len=SLOTS)
    assert out.tokens == ref.tokens
    assert out.tokens[0][:4] == [5, 6, 7, 8]
    assert out.tau > BLOCK - 0.6  # every draft accepted except where max_new_tokens cuts a block
    assert (out.stats["accepted_at"][:, -1] >= out.stats["steps"] - 1).all()
    # a counting draft never repeats its previous token
    assert (out.stats["draft_repeats"] == 0).all()
    assert (out.stats["per_step"].sum(1) == out.stats["committed"]).all()


def test_full_acceptance_with_the_bare_drafter():
    models = zero_logit_models()
    out = generate(models, PROMPTS, decoder="dflash", max_new_tokens=10, max_len=SLOTS)
    assert out.tokens == target_only(models, PROMPTS, max_new_tokens=10, max_len=SLOTS).tokens
    assert out.stats["steps"].tolist() == [3, 3, 3]  # 1 from prefill + 4 + 4 + (cut to) 1
    assert out.tau == pytest.approx(3.0)
    assert out.stats["per_step"][:, :4].tolist() == [[4, 4, 1, 0]] * 3  # tokens committed by each step
    assert (out.stats["draft_repeats"] == out.stats["steps"] * (BLOCK - 2)).all()  # an all-0 draft repeats itself


@pytest.mark.parametrize("case,acceptance", [("bad_draft_dflash", "rejection"), ("bad_draft_xpress", "rejection"),
                                             ("good_draft_markov", "rejection"), ("bad_draft_dflash", "match"),
                                             ("bad_draft_xpress", "match")])
def test_sampling_preserves_the_target_distribution(case, acceptance):
    """Rejection sampling of sampled drafts, and the DFlash harness's rule (argmax drafts kept while
    they equal the target's sampled tokens): both give the target's distribution."""
    temperature = 1.0
    if case == "good_draft_markov":
        models, decoder, options = counting_models("markov", vocab=16, scale=0.5), "markov", {}
    else:
        decoder = case.split("_")[-1]
        models = random_models(decoder, seed=11, vocab=16)
        options = dict(max_iters=2, top_k=4) if decoder == "xpress" else {}
    prompt = [3, 1, 4]
    runs = 20_000
    out = generate(models, [prompt] * runs, decoder=decoder, max_new_tokens=2, temperature=temperature,
                   seed=123, acceptance=acceptance, **options)
    pairs = np.array([t[:2] for t in out.tokens])
    counts = np.zeros((16, 16))
    np.add.at(counts, (pairs[:, 0], pairs[:, 1]), 1)
    p = chi_square_p(counts, exact_first_two(models.target, prompt, temperature))
    assert p > 1e-3, f"chi-square p = {p:.2e}"
    if case == "good_draft_markov":  # q == p: the first draft is always accepted
        assert out.stats["accepted_at"][:, 0].mean() == 1.0
    else:
        assert 0.0 < out.stats["accepted_at"][:, 0].mean() < 1.0


def test_sampling_is_reproducible_by_seed():
    models = random_models("dflash", seed=2, vocab=16)
    a = generate(models, PROMPTS, decoder="dflash", max_new_tokens=9, max_len=SLOTS, temperature=0.8, seed=5)
    b = generate(models, PROMPTS, decoder="dflash", max_new_tokens=9, max_len=SLOTS, temperature=0.8, seed=5)
    c = generate(models, PROMPTS, decoder="dflash", max_new_tokens=9, max_len=SLOTS, temperature=0.8, seed=6)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_bad_requests_get_clear_errors():
    models = random_models("dflash")
    with pytest.raises(InputError, match="empty"):
        generate(models, [[1, 2], []], max_new_tokens=4)
    with pytest.raises(InputError, match="cache holds 12"):
        generate(models, [[1] * 6], max_new_tokens=4, max_len=12)
    with pytest.raises(InputError, match="unknown decoder 'medusa'"):
        generate(models, PROMPTS, decoder="medusa")
    with pytest.raises(InputError, match="no xpress head"):
        generate(models, PROMPTS, decoder="xpress")
    with pytest.raises(InputError, match="token ids must lie"):
        generate(models, [[1, 4800]], max_new_tokens=2)
    # a knob the decoder would silently ignore is refused; one settings object serves many decoders
    with pytest.raises(InputError, match=r"max_iters=2 would be ignored by decoder 'dflash'; max_iters applies to "
                                         r"xpress, dloop\+xpress"):
        generate(models, PROMPTS, decoder="dflash", max_iters=2)
    with pytest.raises(InputError, match="top_k=8 would be ignored by decoder 'markov'"):
        generate(random_models("markov"), PROMPTS, decoder="markov", top_k=8)
    with pytest.raises(InputError, match="unknown decoding options"):
        generate(models, PROMPTS, decoder="dflash", jacobi=2)
    knobs = DecodeSettings(max_iters=6, early_stop=False, top_k=8, branches=3)
    assert knobs.for_decoder("dflash") == DecodeSettings()
    assert knobs.for_decoder("xpress") == DecodeSettings(max_iters=6, early_stop=False, top_k=8)
    assert knobs.for_decoder("dloop") == DecodeSettings(branches=3)
    assert knobs.for_decoder("dloop+xpress") == knobs
    other = random_models("dflash", vocab=64)
    with pytest.raises(ConfigError, match="drafter vocab_size is 64 but the target's is 48"):
        generate(DecodingModels(models.target, other.drafter), PROMPTS, max_new_tokens=2)


def test_prefill_computes_logits_for_each_prompts_last_token_only():
    """A prefill reads one row of logits per sequence: the compiled program holds no
    [batch, prompt, vocab] f32 array (it would not fit at Qwen3's vocabulary and 2,048-token
    prompts), and the row equals the full forward pass's."""
    from xpress_jax.decoding.speculative import prefill
    from xpress_jax.models.qwen3 import Qwen3
    from spec_fixtures import redraw, target_config
    target = redraw(Qwen3(target_config(vocab=8192, hidden=32), rngs=nnx.Rngs(0)), 0)
    batch, prompt_len = 2, 512
    ids = jax.random.randint(jax.random.key(1), (batch, prompt_len), 0, 8192)
    lengths = jnp.asarray([prompt_len, 300], jnp.int32)
    graphdef, state = nnx.split(target)
    step = jax.jit(lambda state, ids, lengths: prefill(nnx.merge(graphdef, state), None, ids, lengths,
                                                       prompt_len + 16)[0])
    logits = step(state, ids, lengths)
    assert logits.shape == (batch, 1, 8192)
    full = target(ids).logits  # [batch, prompt, vocab]
    for b, n in enumerate([prompt_len, 300]):
        np.testing.assert_allclose(logits[b, 0], full[b, n - 1], rtol=1e-5, atol=1e-5)
    memory = step.lower(state, ids, lengths).compile().memory_analysis()
    all_rows = batch * prompt_len * 8192 * 4  # 32 MiB; the program with all rows needs 33.7 MB of temporaries
    assert memory.temp_size_in_bytes + memory.output_size_in_bytes < all_rows / 2  # 9.1 MB: attention, cache


def test_a_chunked_prefill_gives_the_same_tokens_in_a_fraction_of_the_memory():
    """Prompts prefilled in chunks (a lax.scan over 64-token pieces) decode to the same tokens and
    steps as whole prompts, for target-only, DFlash and XPress; the compiled prefill's
    temporaries fall with the chunk (attention scores and activations of one chunk)."""
    from xpress_jax.decoding.speculative import prefill
    models = random_models("xpress", seed=3)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 48, 150).tolist(), rng.integers(0, 48, 90).tolist()]
    for decoder in ("target", "dflash", "xpress"):
        whole, chunked = (generate(models, prompts, decoder=decoder, max_new_tokens=12, prefill_chunk=c)
                          for c in (0, 64))
        assert whole.tokens == chunked.tokens, decoder
        np.testing.assert_array_equal(whole.stats["per_step"], chunked.stats["per_step"])
    ids = jnp.asarray(rng.integers(0, 48, (2, 1024)), jnp.int32)
    lengths = jnp.asarray([1024, 700], jnp.int32)
    graphdef, state = nnx.split(models)

    def compiled(chunk):
        fn = jax.jit(lambda state, ids, lengths: prefill(nnx.merge(graphdef, state).target, nnx.merge(graphdef, state)
                                                         .drafter, ids, lengths, 1040, chunk))
        return fn, fn.lower(state, ids, lengths).compile().memory_analysis().temp_size_in_bytes

    (whole_fn, whole_bytes), (chunk_fn, chunk_bytes) = compiled(0), compiled(128)
    assert chunk_bytes < whole_bytes / 3, (chunk_bytes, whole_bytes)
    (lw, cw, xw), (lc, cc, xc) = whole_fn(state, ids, lengths), chunk_fn(state, ids, lengths)
    np.testing.assert_allclose(lw, lc, atol=1e-5)
    np.testing.assert_array_equal(cw.lengths, cc.lengths)
    for b, n in enumerate([1024, 700]):  # the committed slots of every cache
        for x, y in ((cw.k[0], cc.k[0]), (cw.v[-1], cc.v[-1]), (xw.k[0], xc.k[0])):
            np.testing.assert_allclose(x[b, :n], y[b, :n], atol=1e-5)


def test_prompts_compile_at_a_fixed_set_of_buckets_and_reuse_them():
    """2,048-token prompts with buckets of 64 and prefill chunks of 512 compile at 11 lengths;
    batches of other sizes, prompt lengths in one bucket and token budgets reuse one compiled
    program and give the tokens of an unpadded call."""
    from xpress_jax.decoding.padding import bucket_length, prompt_buckets
    from xpress_jax.decoding.speculative import _decode
    buckets = prompt_buckets(2048, 64, 512)
    assert buckets == [64, 128, 192, 256, 320, 384, 448, 512, 1024, 1536, 2048]
    for n in range(1, 2049):
        padded = bucket_length(n, 64, 512)
        assert padded >= n and padded in buckets and (padded <= 512 or padded % 512 == 0)
    models = random_models("dflash", seed=4)
    rng = np.random.default_rng(1)
    batches = [[rng.integers(0, 48, n).tolist() for n in lengths] for lengths in ([5], [40, 9], [64, 1, 33])]
    exact = [target_only(models, prompts, max_new_tokens=6).tokens for prompts in batches]
    before = _decode._cache_size()
    for prompts, tokens in zip(batches, exact):
        padded = generate(DecodingModels(models.target), prompts, decoder="target", max_new_tokens=6,
                          pad_multiple=64, min_rows=4)
        assert padded.tokens == tokens and len(padded.stopped) == len(prompts)
    # the token budget is traced: a smaller one with the same cache runs the same program
    for budget in (1, 3):
        short = generate(DecodingModels(models.target), batches[2], decoder="target", max_new_tokens=budget,
                         pad_multiple=64, min_rows=4, max_len=64 + 6 + 1)
        assert short.tokens == [t[:budget] for t in exact[2]] and short.stats["per_step"].shape == (3, budget)
    assert _decode._cache_size() == before + 1


def test_an_iteration_sweep_runs_one_program():
    """The Jacobi iteration bound is traced: XPress at 1, 2 and 8 iterations compiles once, each
    run stays within its own bound, and every one gives target-only decoding's tokens."""
    from xpress_jax.decoding.speculative import _decode
    models = random_models("xpress", seed=4)
    prompts = [[3, 9, 4, 11], [7, 1]]
    exact = target_only(models, prompts, max_new_tokens=12, max_len=SLOTS).tokens
    before = _decode._cache_size()
    per_step = {}
    for k in (1, 2, 8):
        out = generate(models, prompts, decoder="xpress", max_new_tokens=12, max_len=SLOTS, max_iters=k)
        assert out.tokens == exact, k
        per_step[k] = out.stats["iterations"] / out.stats["steps"]
        assert (per_step[k] <= min(k, BLOCK - 1)).all(), (k, per_step[k])
    assert (per_step[1] == 1).all() and (per_step[8] > 1).any()  # the larger bound runs more iterations
    assert _decode._cache_size() == before + 1


def test_a_warm_up_runs_the_full_calls_program_for_one_token():
    """generate(warm_up=True), as eval does before timing: the program the full call then runs
    (no second compile), with a one-token budget."""
    from xpress_jax.decoding.speculative import _decode
    models = random_models("markov", seed=5)
    prompts = [[3, 9, 4, 11], [7, 1]]
    before = _decode._cache_size()
    warm = generate(models, prompts, decoder="markov", max_new_tokens=20, warm_up=True)
    compiled = _decode._cache_size()
    full = generate(models, prompts, decoder="markov", max_new_tokens=20)
    assert compiled <= before + 1 and _decode._cache_size() == compiled
    assert warm.tokens == [t[:1] for t in full.tokens] and all(len(t) == 20 for t in full.tokens)
    assert (warm.stats["steps"] == 0).all() and (full.stats["steps"] > 0).all()


def test_answers_of_the_recipes_length_are_lossless_after_a_2000_token_prompt():
    """The 8B recipe's lengths: a 2,000-token prompt (prefilled in chunks of 512) and 2,048 new
    tokens through a cache of 4,112 slots. The counting target's drafts are (nearly) all accepted,
    so the loop commits several tokens a step across the long cache; its 2,048
    tokens are target-only decoding's. (Random weights at these prompt lengths: tests/test_eval.py.)"""
    models = counting_models("markov")
    prompt = [np.random.default_rng(0).integers(0, models.target.cfg.vocab_size, 2000).tolist()]
    base = generate(DecodingModels(models.target), prompt, decoder="target", max_new_tokens=2048, pad_multiple=64)
    spec = generate(models, prompt, decoder="markov", max_new_tokens=2048, pad_multiple=64)
    assert len(base.tokens[0]) == 2048 and spec.tokens == base.tokens
    assert spec.stats["steps"][0] <= 2048 // 3  # at least three tokens a step over the long cache
