"""Causal heads: causality, folded = unfolded, serial decodes = a plain Python loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from head_fixtures import H, N, R, V, inputs, make_head
from xpress_jax.models.heads import XPressRefiner


@pytest.mark.parametrize("name", ["xpress", "markov", "gru"])
@pytest.mark.parametrize("k", [0, 3, N - 1])
def test_causality_positions_at_or_after_k_do_not_change_delta_k(name, k):
    """delta_k reads x_0..x_{k-1} = prev_tokens[:k+1]; tokens x_k.. (prev_tokens[k+1:]) are invisible."""
    head = make_head(name)
    s, h, prev, embed = inputs(0)
    other = prev.at[:, k + 1:].set((prev[:, k + 1:] + 7) % V)
    a, b = head(s, h, prev, embed), head(s, h, other, embed)
    np.testing.assert_array_equal(np.asarray(a[:, :k + 1]), np.asarray(b[:, :k + 1]))
    if k < N - 1:
        assert np.abs(np.asarray(a[:, k + 1:] - b[:, k + 1:])).max() > 1e-3  # the change is seen later on


def test_xpress_hidden_states_enter_every_position_through_g():
    """g = mean_j h_j: changing a later h moves earlier positions too (h and g are inputs, not tokens)."""
    head = make_head("xpress")
    s, h, prev, _ = inputs(1)
    a, b = head(s, h, prev), head(s, h.at[:, -1].add(1.0), prev)
    assert np.abs(np.asarray(a[:, 0] - b[:, 0])).max() > 1e-4


def test_xpress_folded_equals_unfolded():
    head = make_head("xpress", seed=2)
    s, h, prev, _ = inputs(2)
    folded = head.fold()
    got = folded.logits(s, folded.block_constant(h), prev)
    np.testing.assert_allclose(np.asarray(got), np.asarray(head(s, h, prev)), atol=1e-4, rtol=1e-5)


def test_untrained_xpress_is_the_identity():
    """W_r starts at zero, so a fresh refiner leaves the drafter's logits as they are."""
    head = XPressRefiner(vocab_size=V, hidden_size=H, num_positions=N, rank=R, rngs=nnx.Rngs(0))
    s, h, prev, _ = inputs(3)
    np.testing.assert_array_equal(np.asarray(head(s, h, prev)), np.asarray(s))


@pytest.mark.parametrize("name", ["markov", "gru"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_serial_decode_equals_python_loop(name, seed):
    head = make_head(name, seed)
    s, h, _, embed = inputs(seed)
    anchor = jnp.array([3, 14, 59])
    tokens, logits = jax.jit(lambda s, h, a: head.decode_serial(s, h, a, embed))(s, h, anchor)
    # plain loop: position by position, each from the parallel head on the realised prefix
    expect = np.zeros((3, N), np.int32)
    for b in range(3):
        prev = [int(anchor[b])]
        for k in range(N):
            padded = jnp.asarray([prev + [0] * (N - len(prev))])
            l_k = head(s[b:b + 1], h[b:b + 1], padded, embed)[0, k]
            expect[b, k] = int(jnp.argmax(l_k))
            np.testing.assert_allclose(np.asarray(logits[b, k]), np.asarray(l_k), atol=1e-4)
            prev.append(expect[b, k])
    np.testing.assert_array_equal(np.asarray(tokens), expect)
