"""The pure train step: one frozen target forward per batch (context features and p^t), anchored
blocks through the drafter in chunks (rematerialised), every configured loss, one AdamW update.
A non-finite loss or gradient leaves parameters and optimizer state untouched."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from xpress_jax.config import LOSS, TRAIN
from xpress_jax.methods import HEADS, head_loss_weights
from xpress_jax.sharding import constrain
from xpress_jax.models.drafter import block_inputs
from xpress_jax.train import losses
from xpress_jax.train.anchors import Blocks, make_blocks, previous_anchor, sample_anchors, target_positions
from xpress_jax.train.state import apply_update, merge

EPS = 1e-6
LOGITS_AXES = ("batch", None, None, "vocab")  # [batch, C, n, vocab]: per-chunk logits, batch-split


_ANCHOR_FIELDS = ("num_anchors", "anchor_chunk", "remat", "layer_remat")  # of `train`, beside `train.loss`


class _FromConfig:
    @classmethod
    def from_config(cls, train) -> "LossSettings":
        """From a config's `train` section."""
        loss = dict(train.loss)
        terms = head_loss_weights()
        return cls(**{k: train[k] for k in _ANCHOR_FIELDS}, **{k: loss[k] for k in LOSS},
                   head_weights=tuple((k, loss[k]) for k in terms if k in loss))


# What the objective reads of a config's `train` section: the drafter's losses (config.LOSS), the
# anchor fields, and (loss term, weight) of every registered head; typed as declared there.
LossSettings = dataclasses.make_dataclass(
    "LossSettings", [(k, TRAIN[k].type) for k in _ANCHOR_FIELDS] + [(k, f.type) for k, f in LOSS.items()]
    + [("head_weights", tuple)], bases=(_FromConfig,), frozen=True)
LossSettings.__module__ = __name__


def _chunk(x, n_chunks):
    """[batch, A, ...] -> [n_chunks, batch, A / n_chunks, ...] (scan over the first axis)."""
    b, a = x.shape[:2]
    return jnp.moveaxis(x.reshape((b, n_chunks, a // n_chunks) + x.shape[2:]), 1, 0)


def _pad_anchors(anchors, valid, multiple):
    extra = -anchors.shape[1] % multiple
    return jnp.pad(anchors, ((0, 0), (0, extra))), jnp.pad(valid, ((0, 0), (0, extra)))


def compute_loss(model, target, ids, loss_mask, key, settings: LossSettings):
    """Returns (total loss, metrics). ids, loss_mask: [batch, T]."""
    drafter = model.drafter
    cfg = drafter.cfg
    block, n = cfg.block_size, cfg.block_size - 1
    batch, seq = ids.shape
    feat = tuple(cfg.target_layer_ids)
    out = target(ids, tap_layers=feat + (target.cfg.num_hidden_layers - 1,), return_logits=False)
    taps = jax.lax.stop_gradient(out.taps[:, :, :len(feat)])  # [batch, T, n_feat, hidden]
    final_h = jax.lax.stop_gradient(out.taps[:, :, -1])  # [batch, T, hidden] normed: the target's logits input
    ctx_kv = drafter.training_context(taps)

    k_anchor, k_prefix = jax.random.split(key)
    anchors, valid = sample_anchors(k_anchor, loss_mask, settings.num_anchors)
    chunk = min(settings.anchor_chunk, anchors.shape[1])
    anchors, valid = _pad_anchors(anchors, valid, chunk)
    n_chunks = anchors.shape[1] // chunk
    blocks = make_blocks(ids, loss_mask, anchors, valid, block)
    dloop = settings.dloop > 0
    if dloop:  # D-Loop: prefix length per block; short prefixes fall back to the previous anchor (eq. 13)
        prefix_len = losses.sample_prefix_lengths(k_prefix, anchors.shape, n, settings.dloop_beta)
        prev = previous_anchor(anchors, valid)
        p_anchors = jnp.where(prefix_len >= 2, anchors, jnp.take_along_axis(anchors, prev, axis=1))
        p_valid = valid & jnp.where(prefix_len >= 2, True, jnp.take_along_axis(valid, prev, axis=1))
        p_blocks = make_blocks(ids, loss_mask, p_anchors, p_valid, block)
    else:
        prefix_len, p_blocks = jnp.zeros_like(anchors), blocks
    w = losses.position_weights(n, settings.gamma)  # [n]
    heads = model.head_names()
    need_target_probs = settings.tv > 0 and bool(heads)

    def run_view(b: Blocks, reveal=None):
        tokens = block_inputs(b.anchor_tokens, block, cfg.mask_token_id)  # [batch, C, B]
        if reveal is not None:  # suffix view: the ground-truth prefix of length l is visible
            k = jnp.arange(1, block)[None, None, :]
            tokens = tokens.at[:, :, 1:].set(jnp.where(k <= reveal[:, :, None], b.labels, cfg.mask_token_id))
        h = drafter.anchored_blocks(ctx_kv, target.embed(tokens), b.anchors, b.valid,
                                    settings.layer_remat)[:, :, 1:]  # [b, C, n, H]
        c = h.shape[1]
        s_logits = target.logits(h.reshape(batch, c * n, -1)).reshape(batch, c, n, -1)  # [b, C, n, vocab]
        return h, constrain(s_logits, LOGITS_AXES)

    def chunk_loss(xs):
        b, pb, ell = xs
        c = b.anchors.shape[1]
        sums = {}
        h, s_logits = run_view(pb)  # the anchor-only pass (at the prefix-view anchors under D-Loop)
        weights = w * b.label_mask
        correct = jnp.argmax(s_logits, -1) == pb.labels
        if dloop:
            w_s, w_p = losses.dloop_weights(ell, b.label_mask, pb.label_mask, settings.gamma, settings.dloop_tau_s)
            num_p, den_p = losses.weighted(losses.cross_entropy(s_logits, pb.labels), w_p)
            _, s_suffix = run_view(b, reveal=ell)
            num_s, den_s = losses.weighted(losses.cross_entropy(s_suffix, b.labels), w_s)
            sums["dloop"] = (num_p + num_s, den_p + den_s)
        else:
            sums["dflash_ce"] = losses.weighted(losses.cross_entropy(s_logits, b.labels), weights)
        mask = pb.label_mask
        sums["acc_pos"] = (jnp.sum(correct & mask, axis=(0, 1)).astype(jnp.float32), jnp.sum(mask, axis=(0, 1)))
        sums["sim_tau_drafter"] = losses.simulated_acceptance(correct, mask)
        if heads:
            p_t = None
            if need_target_probs:
                pos = target_positions(b.anchors, block, seq)  # [b, C, n]
                h_t = jnp.take_along_axis(final_h[:, None], pos[..., None], axis=2)  # [b, C, n, H]
                p_t = jax.nn.softmax(target.logits(h_t.reshape(batch, c * n, -1)), -1).reshape(s_logits.shape)
                p_t = constrain(jax.lax.stop_gradient(p_t), LOGITS_AXES)
            flat = lambda x: x.reshape((batch * c,) + x.shape[2:])  # noqa: E731  heads take [rows, n, ...]
            labels_f = flat(b.labels)
            head_batch = losses.HeadBatch(
                s=flat(s_logits), h=flat(h), labels=labels_f, target_probs=None if p_t is None else flat(p_t),
                prev=jnp.concatenate([flat(b.anchor_tokens[..., None]), labels_f[:, :-1]], axis=1),  # x_{k-1}
                weights=flat(weights), label_mask=flat(b.label_mask), embed=target.embed, tv=settings.tv)
            for name in heads:
                sums.update(HEADS[name].loss_terms(getattr(model, name), head_batch))
        return sums

    body = jax.checkpoint(chunk_loss) if settings.remat else chunk_loss
    xs = (jax.tree.map(lambda x: _chunk(x, n_chunks), blocks), jax.tree.map(lambda x: _chunk(x, n_chunks), p_blocks),
          _chunk(prefix_len, n_chunks))
    probe = jax.eval_shape(body, jax.tree.map(lambda x: x[0], xs))
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), probe)
    totals, _ = jax.lax.scan(lambda acc, x: (jax.tree.map(jnp.add, acc, body(x)), None), zeros, xs)

    # losses normalise as D-Loop's eq. 8 (+ eps); metrics by their plain counts
    terms = {k: num / (den + EPS) if not k.startswith("sim_tau") else num / jnp.maximum(den, 1.0)
             for k, (num, den) in totals.items() if k != "acc_pos"}
    weights = {"dflash_ce": settings.dflash_ce, "dloop": settings.dloop, **dict(settings.head_weights)}
    if any(HEADS[name].trains_drafter_logits for name in heads) and not settings.dflash_ce_with_heads:
        weights["dflash_ce"] = 0.0  # logged, not added: that head's drafter-anchor term already trains p^b
    total = sum(weights[k] * v for k, v in terms.items() if k in weights)
    metrics = {f"loss/{k}": v for k, v in terms.items() if k in weights}
    metrics.update({k: v for k, v in terms.items() if k.startswith("sim_tau")})
    num, den = totals["acc_pos"]
    metrics["draft_accuracy"] = num / jnp.maximum(den, 1.0)  # [n] per position
    metrics["blocks"] = totals["sim_tau_drafter"][1]
    return total, metrics


def make_train_step(graphdef, target_graphdef, tx, schedule, settings: LossSettings,
                    frozen: frozenset[str] = frozenset()):
    """step(state, target_params, batch) -> (state, metrics); jit it with shardings and donation.

    `frozen`: parameter keys that do not train (train.trainable). They are not differentiated at
    all, so a head trained on a frozen drafter runs the drafter forward only, with no backward
    pass through it; their gradient is zero for the optimizer (which leaves them unchanged)."""

    def step(state, target_params, batch):
        key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), state["step"])  # resume-exact
        fixed = {k: v for k, v in state["params"].items() if k in frozen}
        learned = {k: v for k, v in state["params"].items() if k not in frozen}

        def loss_fn(learned):
            model = merge(graphdef, {**fixed, **learned})
            target = merge(target_graphdef, target_params)
            return compute_loss(model, target, batch["ids"], batch["loss_mask"], key, settings)

        (loss, metrics), learned_grads = jax.value_and_grad(loss_fn, has_aux=True)(learned)
        grads = {**learned_grads, **{k: jnp.zeros_like(v) for k, v in fixed.items()}}
        new_state, finite = apply_update(state, grads, loss, tx)
        metrics.update(loss=loss, grad_norm=optax.tree.norm(learned_grads), lr=schedule(state["step"]),
                       finite=finite)
        return new_state, metrics

    return step
