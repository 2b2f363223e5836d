"""Tiny models for speculative-decoding tests: random ones (low acceptance) and hand-built ones
whose drafts the target accepts (near) completely; the exact target law and the chi-square test
that sampling tests compare against."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx
from scipy import stats

from compiled import jit_call
from xpress_jax.decoding.speculative import DecodingModels
from xpress_jax.methods import DECODERS, HEADS, head_of
from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig
from xpress_jax.models.heads import GRUHead, MarkovHead, XPressRefiner
from xpress_jax.models.qwen3 import Qwen3, Qwen3Config

BLOCK = 4
# One cache size for the decode tests' calls: a decode loop compiles once per cache size, and its
# token budget is traced, so calls with other budgets and their target-only references share it.
SLOTS = 64


def target_config(vocab=48, hidden=16):
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=8, rope_theta=10_000.0)


def redraw(module, seed, std=0.3):
    """Peaked random weights (std 0.3; norms in [0.5, 1.5]) so greedy choices have clear margins."""
    keys = iter(jax.random.split(jax.random.key(seed), 512))
    for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param)):
        k = next(keys)
        if "norm" in str(path[-2:]):
            var.set_value(jax.random.uniform(k, var.shape, minval=0.5, maxval=1.5))
        else:
            var.set_value(std * jax.random.normal(k, var.shape))
    return module


SMALL_HEADS = ml_collections.ConfigDict({"rank": 8, "gru_hidden": 8, "proj_dim": 8})


def make_head(decoder, cfg: DrafterConfig, seed):
    """The head `decoder` refines with (methods.head_of), built through the registry; None if none."""
    name = head_of(decoder) if decoder in DECODERS else decoder
    if name is None:
        return None
    return redraw(HEADS[name].module(rngs=nnx.Rngs(seed), **HEADS[name].kwargs(SMALL_HEADS, cfg)), seed)


def random_models(head="dflash", seed=0, vocab=48, block=BLOCK):
    tcfg = target_config(vocab)
    target = redraw(Qwen3(tcfg, rngs=nnx.Rngs(seed)), seed)
    dcfg = DrafterConfig.from_target(tcfg, num_layers=2, target_layer_ids=(1, 0), block_size=block,
                                     mask_token_id=vocab - 1)
    drafter = redraw(DFlashDrafter(dcfg, rngs=nnx.Rngs(seed + 1)), seed + 1)
    return DecodingModels(target, drafter, make_head(head, dcfg, seed + 2))


def counting_models(head, vocab=32, scale=1.0, block=BLOCK):
    """A target whose next token is always x + 1 (mod vocab) with logit margin sqrt(vocab) * scale,
    a drafter with zero output (s = 0), and a head that predicts exactly that shift:
    the drafts are what the target wants, so (nearly) everything is accepted."""
    tcfg = target_config(vocab, hidden=vocab)
    target = Qwen3(tcfg, rngs=nnx.Rngs(0))
    eye = jnp.eye(vocab)
    shift = jnp.roll(eye, 1, axis=1)  # row i -> column i + 1
    target.embed_tokens.set_value(eye)
    target.lm_head.set_value(shift * scale)
    for layer in target.layers:  # attention and MLP add nothing: the residual stream is the embedding
        layer.self_attn.o_proj.set_value(jnp.zeros_like(layer.self_attn.o_proj[...]))
        layer.mlp.down_proj.set_value(jnp.zeros_like(layer.mlp.down_proj[...]))
    dcfg = DrafterConfig.from_target(tcfg, num_layers=1, block_size=block, mask_token_id=vocab - 1)
    drafter = DFlashDrafter(dcfg, rngs=nnx.Rngs(1))
    drafter.norm.weight.set_value(jnp.zeros(vocab))  # s = 0 everywhere
    big = jnp.sqrt(vocab) * scale  # the target's own margin: q == p for the Markov head
    kw = dict(vocab_size=vocab, hidden_size=vocab, rngs=nnx.Rngs(2))
    if head == "markov":
        h = MarkovHead(rank=vocab, **kw)
        h.markov_w1.set_value(eye)
        h.markov_w2.set_value(shift.T * big)  # W1[x] W2^T = big * onehot(x + 1)
    elif head == "xpress":
        h = XPressRefiner(num_positions=block - 1, rank=vocab, **kw)
        h.W_e.set_value(eye)
        h.W_in.set_value(jnp.concatenate([eye, jnp.zeros((2 * vocab, vocab))]))
        for p in (h.mlp_gate, h.mlp_up, h.mlp_down):
            p.set_value(jnp.zeros_like(p[...]))
        h.W_r.set_value(shift * big)
    elif head == "gru":
        h = GRUHead(gru_hidden=vocab, proj_dim=vocab, **kw)
        w_ih = jnp.zeros((vocab, 3, vocab)).at[:, 1].set(-10.0).at[:, 2].set(3.0 * eye)  # z ~ 0, n = tanh(3 x)
        h.gru_w_ih.set_value(w_ih)
        h.gru_w_hh.set_value(jnp.zeros((vocab, 3, vocab)))
        h.proj_in.set_value(jnp.zeros((2 * vocab, vocab)).at[vocab:].set(10.0 * eye))
        h.proj_out.set_value(shift * big)
    else:
        h = None
    return DecodingModels(target, drafter, h)


def zero_logit_models(block=BLOCK):
    """Target and drafter both output all-zero logits: every draft (token 0) is accepted."""
    models = random_models("dflash", seed=5, block=block)
    models.target.norm.weight.set_value(jnp.zeros_like(models.target.norm.weight[...]))
    models.drafter.norm.weight.set_value(jnp.zeros_like(models.drafter.norm.weight[...]))
    return models


def exact_first_two(target, prompt, temperature):
    """P(t1, t2) of the target: [vocab, vocab]."""
    vocab = target.cfg.vocab_size
    p1 = jax.nn.softmax(jit_call(target, jnp.asarray([prompt])).logits[0, -1] / temperature)
    seqs = jnp.asarray([prompt + [t] for t in range(vocab)])
    p2 = jax.nn.softmax(jit_call(target, seqs).logits[:, -1] / temperature, axis=-1)
    return np.asarray(p1[:, None] * p2, np.float64)


def chi_square_p(counts, expected_prob):
    n = counts.sum()
    expected = expected_prob.ravel() * n
    observed = counts.ravel().astype(np.float64)
    small = expected < 5  # pool rare cells so the chi-square approximation holds
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
