"""Training losses and anchored blocks against numpy: CE, TV, w_k, D-Loop's weights, prefix
lengths and fallback anchor, simulated acceptance, and compute_loss's terms recomputed by hand."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from train_helpers import train_config
from xpress_jax.train import losses
from xpress_jax.train.anchors import eligible, make_blocks, previous_anchor, sample_anchors


# ---- losses against numpy ----

def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_cross_entropy_total_variation_and_weights_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5, 11)).astype(np.float32)
    labels = rng.integers(0, 11, size=(2, 3, 5))
    p_t = np.exp(np_log_softmax(rng.normal(size=(2, 3, 5, 11))))
    ce = -np.take_along_axis(np_log_softmax(logits), labels[..., None], -1)[..., 0]
    np.testing.assert_allclose(losses.cross_entropy(jnp.asarray(logits), jnp.asarray(labels)), ce, rtol=1e-5)
    tv = 0.5 * np.abs(np.exp(np_log_softmax(logits)) - p_t).sum(-1)
    np.testing.assert_allclose(losses.total_variation(jnp.asarray(logits), jnp.asarray(p_t)), tv, rtol=1e-5)
    w = np.exp(-np.arange(5) / 7.0)
    np.testing.assert_allclose(losses.position_weights(5, 7.0), w, rtol=1e-6)
    mask = rng.random((2, 3, 5)) > 0.3
    num, den = losses.ce_tv_terms(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(p_t), jnp.asarray(w * mask), 0.5)
    np.testing.assert_allclose(float(num / den), ((ce + 0.5 * tv) * w * mask).sum() / (w * mask).sum(), rtol=1e-5)


def test_dloop_weights_match_the_paper():
    """Eq. 7 for l >= 2; eq. 13's fallback (full anchor-only block) for l < 2."""
    m, gamma, tau_s = 6, 7.0, 3.0
    ell = np.array([[0, 1, 2, 5]])
    ones = np.ones((1, 4, m), bool)
    w_s, w_p = map(np.asarray, losses.dloop_weights(jnp.asarray(ell), jnp.asarray(ones), jnp.asarray(ones), gamma, tau_s))
    for i, l in enumerate(ell[0]):
        for k in range(1, m + 1):
            assert w_s[0, i, k - 1] == pytest.approx(np.exp(-(k - l - 1) / tau_s) if k > l else 0.0)
            if l >= 2:
                assert w_p[0, i, k - 1] == pytest.approx(np.exp(-(k - 1) / gamma) if k <= l else 0.0)
            else:
                assert w_p[0, i, k - 1] == pytest.approx(np.exp(-(k - 1) / gamma))


def test_prefix_lengths_follow_pi_beta():
    m, beta = 8, 0.7
    draws = np.asarray(losses.sample_prefix_lengths(jax.random.key(0), (200_000,), m, beta))
    expected = (1 - beta) * beta ** np.arange(m) / (1 - beta**m)
    assert expected.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(np.bincount(draws, minlength=m) / draws.size, expected, atol=4e-3)


def test_simulated_acceptance_matches_a_loop():
    rng = np.random.default_rng(1)
    correct = rng.random((3, 4, 6)) > 0.3
    mask = np.ones((3, 4, 6), bool)
    mask[0, 1] = False
    mask[2, 2, 3:] = False
    total, blocks = losses.simulated_acceptance(jnp.asarray(correct), jnp.asarray(mask))
    expect, count = 0, 0
    for b in range(3):
        for a in range(4):
            if not mask[b, a, 0]:
                continue
            run = 0
            while run < 6 and correct[b, a, run] and mask[b, a, run]:
                run += 1
            expect += run + 1
            count += 1
    assert int(total) == expect and int(blocks) == count


def test_anchors_are_distinct_eligible_positions():
    mask = np.zeros((2, 40), bool)
    mask[0, 10:30] = True
    mask[1, 5:8] = True  # only positions 5 and 6 are eligible
    anchors, valid = sample_anchors(jax.random.key(3), jnp.asarray(mask), 8)
    anchors, valid = np.asarray(anchors), np.asarray(valid)
    ok = np.asarray(eligible(jnp.asarray(mask)))
    assert valid[0].all() and len(set(anchors[0])) == 8 and ok[0, anchors[0]].all()
    assert sorted(anchors[1][valid[1]]) == [5, 6] and valid[1].sum() == 2
    ids = np.arange(80).reshape(2, 40)
    blocks = make_blocks(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(anchors), jnp.asarray(valid), 4)
    a = anchors[0, 0]
    assert np.asarray(blocks.labels)[0, 0].tolist() == [a + 1, a + 2, a + 3]
    assert np.asarray(blocks.anchor_tokens)[0, 0] == a


def test_train_loss_terms_match_a_manual_computation(tmp_path):
    """compute_loss's DFlash CE and XPress teacher-forced term, recomputed by hand in numpy."""
    from xpress_jax.models.drafter import block_inputs
    from xpress_jax.train.step import LossSettings, compute_loss
    from xpress_jax.models.build import build_target, build_trainable
    config = train_config(tmp_path)
    target = build_target(config)
    model = build_trainable(config, target.cfg)
    model.xpress.W_r.set_value(0.1 * jax.random.normal(jax.random.key(0), model.xpress.W_r.shape))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 256, (2, 40)), jnp.int32)
    mask = jnp.asarray(np.arange(40)[None] >= 8).repeat(2, 0)
    s = dataclasses.replace(LossSettings.from_config(config.train), num_anchors=6, anchor_chunk=3, tv=0.5)
    key = jax.random.key(7)
    _, metrics = nnx.jit(compute_loss, static_argnums=5)(model, target, ids, mask, key, s)  # one program, not per op
    # by hand
    cfg = model.drafter.cfg
    n = cfg.block_size - 1
    out = target(ids, tap_layers=tuple(cfg.target_layer_ids) + (target.cfg.num_hidden_layers - 1,))
    anchors, valid = sample_anchors(jax.random.split(key)[0], mask, 6)
    blocks = make_blocks(ids, mask, anchors, valid, cfg.block_size)
    embeds = target.embed(block_inputs(blocks.anchor_tokens, cfg.block_size, cfg.mask_token_id))
    h = model.drafter.train_blocks(out.taps[:, :, :-1], embeds, anchors, valid)[:, :, 1:]
    s_logits = np.asarray(target.logits(h.reshape(2, -1, h.shape[-1]))).reshape(2, 6, n, -1)
    labels, lmask = np.asarray(blocks.labels), np.asarray(blocks.label_mask)
    w = np.exp(-np.arange(n) / 7.0) * lmask
    ce = -np.take_along_axis(np_log_softmax(s_logits.astype(np.float64)), labels[..., None], -1)[..., 0]
    assert float(metrics["loss/dflash_ce"]) == pytest.approx((ce * w).sum() / (w.sum() + 1e-6), rel=1e-4)
    prev = np.concatenate([np.asarray(blocks.anchor_tokens)[..., None], labels[..., :-1]], -1)
    l_tf = np.asarray(model.xpress(jnp.asarray(s_logits.reshape(12, n, -1)), h.reshape(12, n, -1),
                                   jnp.asarray(prev.reshape(12, n)))).reshape(s_logits.shape).astype(np.float64)
    final = np.asarray(out.taps[:, :, -1])
    pos = np.minimum(np.asarray(anchors)[..., None] + np.arange(n), 39)
    p_t = np.exp(np_log_softmax(np.asarray(target.logits(jnp.asarray(
        np.take_along_axis(final[:, None], pos[..., None], 2).reshape(2, -1, final.shape[-1])))).reshape(s_logits.shape)))
    ce_r = -np.take_along_axis(np_log_softmax(l_tf), labels[..., None], -1)[..., 0]
    tv_r = 0.5 * np.abs(np.exp(np_log_softmax(l_tf)) - p_t).sum(-1)
    expect = ((ce_r + 0.5 * tv_r) * w).sum() / (w.sum() + 1e-6)
    assert float(metrics["loss/xpress_teacher_forced"]) == pytest.approx(expect, rel=1e-4)


def test_fallback_anchor_is_the_nearest_earlier_one():
    anchors = jnp.asarray([[40, 7, 90, 23, 0], [5, 3, 9, 0, 0]])
    valid = jnp.asarray([[True, True, True, True, False], [True, True, True, False, False]])
    prev = np.asarray(previous_anchor(anchors, valid))
    picked = np.take_along_axis(np.asarray(anchors), prev, axis=1)
    # 40 <- 23, 7 <- wraps to the latest (90), 90 <- 40, 23 <- 7; padding is never picked
    assert picked[0, :4].tolist() == [23, 90, 40, 7]
    assert picked[1, :3].tolist() == [3, 9, 5]
    assert np.asarray(valid)[np.arange(2)[:, None], prev].all()
