"""The jitted Jacobi solver: exact agreement with the sequential decode, early stop, candidates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from head_fixtures import N, V, inputs, make_head
from xpress_jax.decoding.jacobi import (jacobi_solve, pick_from, sequential_solve, token_agreement,
                                        top_k_candidates)


def solve_both(head, s, h, anchor, embed, **kw):
    step = lambda prev: head(s, h, prev, embed)  # noqa: E731
    jac = jax.jit(lambda: jacobi_solve(step, s, anchor, **kw))()
    seq = jax.jit(lambda: sequential_solve(step, anchor, N))()
    return jac, seq


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("name", ["xpress", "markov", "gru"])
def test_jacobi_with_b_minus_1_iterations_equals_sequential(seed, name):
    head = make_head(name, seed)
    s, h, _, embed = inputs(seed, batch=4)
    anchor = jax.random.randint(jax.random.key(seed), (4,), 0, V)
    full, seq = solve_both(head, s, h, anchor, embed, max_iters=N, early_stop=False)
    np.testing.assert_array_equal(np.asarray(full.tokens), np.asarray(seq.tokens))
    np.testing.assert_allclose(np.asarray(full.logits), np.asarray(seq.logits), atol=1e-4)
    stopped, _ = solve_both(head, s, h, anchor, embed, max_iters=N, early_stop=True)
    np.testing.assert_array_equal(np.asarray(stopped.tokens), np.asarray(full.tokens))
    assert int(stopped.iterations.max()) <= N


def test_serial_worst_case_needs_all_iterations_and_early_stop_counts_them():
    """A pure-shift head (token k = previous token + 1) settles one position per iteration."""
    n = 6
    shift = lambda prev: jax.nn.one_hot((prev + 1) % V, V) * 10.0  # noqa: E731
    anchor = jnp.array([0, 5])
    seed = jnp.zeros((2, n, V))
    exact = sequential_solve(shift, anchor, n)
    assert np.asarray(exact.tokens).tolist() == [[1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 10, 11]]
    short = jacobi_solve(shift, seed, anchor, max_iters=n - 2)
    assert not np.array_equal(np.asarray(short.tokens), np.asarray(exact.tokens))
    enough = jacobi_solve(shift, seed, anchor, max_iters=n + 3)
    np.testing.assert_array_equal(np.asarray(enough.tokens), np.asarray(exact.tokens))
    # n updates settle every position, one more confirms the fixed point
    assert np.asarray(enough.iterations).tolist() == [n + 1, n + 1]


def test_zero_iterations_return_the_seed():
    head = make_head("xpress", 0)
    s, h, _, _ = inputs(0)
    out = jacobi_solve(lambda prev: head(s, h, prev), s, jnp.array([1, 2, 3]), max_iters=0)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(jnp.argmax(s, -1)))
    assert np.asarray(out.iterations).tolist() == [0, 0, 0]


@pytest.mark.parametrize("seed", range(4))
def test_candidate_mode_with_every_token_equals_full_vocabulary(seed):
    head = make_head("xpress", seed)
    s, h, _, _ = inputs(seed)
    anchor = jnp.array([1, 2, 3])
    folded = head.fold()
    c = folded.block_constant(h)
    full = jacobi_solve(lambda prev: folded.logits(s, c, prev), s, anchor, max_iters=N)
    for k in (V, 12):
        s_cand, ids = top_k_candidates(s, k)
        w = folded.candidate_readout(ids)
        cand = jacobi_solve(lambda prev: folded.candidate_logits(s_cand, w, c, prev), s_cand, anchor,
                            max_iters=N, pick=pick_from(ids))
        agreement = float(token_agreement(full.tokens, cand.tokens))
        if k == V:
            assert agreement == 1.0
        else:  # a restricted choice can only differ where the full winner lies outside the top-k
            full_in_cand = np.any(np.asarray(ids) == np.asarray(full.tokens)[..., None], axis=-1)
            same = np.asarray(cand.tokens) == np.asarray(full.tokens)
            assert 0.0 <= agreement <= 1.0
            assert same[np.all(full_in_cand, axis=1)].all()


def test_refine_block_dispatches_every_head():
    from xpress_jax.decoding.refine import refine_block
    from xpress_jax.decoding.settings import DecodeSettings
    from xpress_jax.errors import InputError
    s, h, _, embed = inputs(5)
    anchor = jnp.array([4, 5, 6])
    out = refine_block(None, None, s, h, anchor)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(jnp.argmax(s, -1)))
    for name in ("markov", "gru"):
        head = make_head(name, 5)
        got = refine_block(name, head, s, h, anchor, embed)
        expect, _ = head.decode_serial(s, h, anchor, embed)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expect))
    head = make_head("xpress", 5)
    exact = sequential_solve(lambda prev: head(s, h, prev), anchor, N)
    got = refine_block("xpress", head, s, h, anchor, settings=DecodeSettings(max_iters=N))
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(exact.tokens))
    cand = refine_block("xpress", head, s, h, anchor, settings=DecodeSettings(max_iters=N, top_k=V))
    np.testing.assert_array_equal(np.asarray(cand.tokens), np.asarray(exact.tokens))
    np.testing.assert_allclose(np.asarray(cand.logits), np.asarray(got.logits), atol=1e-4)
    few = refine_block("xpress", head, s, h, anchor, settings=DecodeSettings(max_iters=N, top_k=3))
    assert np.isinf(np.asarray(few.logits)).sum(-1).min() == V - 3
    with pytest.raises(InputError, match="unknown head"):
        refine_block("medusa", None, s, h, anchor)
