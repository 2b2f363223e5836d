"""The Qwen3 port against transformers on random tiny configs (float32, CPU)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from compiled import jit_call
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.decoding.speculative import generate_greedy
from xpress_jax.errors import ConfigError, InputError
from xpress_jax.models.qwen3 import KVCache, Qwen3, Qwen3Config


def hf_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def random_tokens(vocab, shape, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=shape).astype(np.int32)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_prefill_logits_and_taps_match_transformers(tiny_dir, scan):
    model = load_qwen3(tiny_dir, scan=scan)
    hf = hf_model(tiny_dir)
    tokens = random_tokens(model.cfg.vocab_size, (2, 11))
    with torch.no_grad():
        ref = hf(torch.from_numpy(tokens.astype(np.int64)), output_hidden_states=True)
    layers = tuple(range(model.cfg.num_hidden_layers))
    out = jit_call(model, jnp.asarray(tokens), tap_layers=layers)
    np.testing.assert_allclose(np.asarray(out.logits), ref.logits.numpy(), atol=1e-4, rtol=0)
    for i in layers:  # tap i == HF hidden_states[i + 1]
        np.testing.assert_allclose(np.asarray(out.taps[:, :, i]), ref.hidden_states[i + 1].numpy(), atol=1e-4, rtol=0)


def test_cached_token_by_token_equals_full_forward(tiny_dir):
    model = load_qwen3(tiny_dir)
    tokens = jnp.asarray(random_tokens(model.cfg.vocab_size, (2, 9), seed=1))
    full = np.asarray(jit_call(model, tokens, tap_layers=(0,)).logits)
    cache = KVCache.init(model.cfg, batch=2, max_len=16)
    step_logits = []
    for t in range(tokens.shape[1]):
        out = jit_call(model, tokens[:, t:t + 1], cache=cache)
        cache = out.cache
        step_logits.append(np.asarray(out.logits[:, 0]))
    np.testing.assert_allclose(np.stack(step_logits, 1), full, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(cache.lengths), [9, 9])


def test_block_append_and_rollback(tiny_dirs):
    """Prefill, append a 4-token block, roll back 3 and append other tokens: same as a fresh forward."""
    model = load_qwen3(tiny_dirs["untied_gqa2"])
    vocab = model.cfg.vocab_size
    prompt = jnp.asarray(random_tokens(vocab, (1, 5), seed=2))
    block = jnp.asarray(random_tokens(vocab, (1, 4), seed=3))
    other = jnp.asarray(random_tokens(vocab, (1, 4), seed=4))
    cache = jit_call(model, prompt, cache=KVCache.init(model.cfg, 1, 32)).cache
    cache = jit_call(model, block, cache=cache).cache
    assert int(cache.lengths[0]) == 9
    cache = cache.rollback(cache.lengths - 3)  # keep one block token
    out = jit_call(model, other, cache=cache)
    expect = jit_call(model, jnp.concatenate([prompt, block[:, :1], other], 1)).logits[:, -4:]
    np.testing.assert_allclose(np.asarray(out.logits), np.asarray(expect), atol=1e-5, rtol=0)


def test_right_padded_batch_prefill(tiny_dirs):
    """Sequences of different lengths in one prefill give each its own unpadded logits."""
    model = load_qwen3(tiny_dirs["untied_gqa4"])
    a = random_tokens(model.cfg.vocab_size, (7,), seed=5)
    b = random_tokens(model.cfg.vocab_size, (4,), seed=6)
    padded = np.zeros((2, 7), np.int32)
    padded[0], padded[1, :4] = a, b
    out = jit_call(model, jnp.asarray(padded), cache=KVCache.init(model.cfg, 2, 16), num_new=jnp.asarray([7, 4]))
    np.testing.assert_array_equal(np.asarray(out.cache.lengths), [7, 4])
    alone = jit_call(model, jnp.asarray(b[None])).logits
    np.testing.assert_allclose(np.asarray(out.logits[1, :4]), np.asarray(alone[0]), atol=1e-5, rtol=0)


def test_greedy_generation_equals_hf_generate(tiny_dir):
    model = load_qwen3(tiny_dir)
    hf = hf_model(tiny_dir)
    prompts = [random_tokens(model.cfg.vocab_size, (n,), seed=n).tolist() for n in (6, 3, 10)]
    ours = generate_greedy(model, prompts, max_new_tokens=32)
    for prompt, got in zip(prompts, ours.tokens):
        ids = torch.tensor([prompt])
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False)[0, len(prompt):].tolist()
        assert got == ref


def test_generation_stops_on_stop_token(tiny_dirs):
    model = load_qwen3(tiny_dirs["tied_gqa1"])
    prompt = random_tokens(model.cfg.vocab_size, (5,), seed=7).tolist()
    free = generate_greedy(model, [prompt], max_new_tokens=12).tokens[0]
    stop = free[4]
    first = free.index(stop)
    out = generate_greedy(model, [prompt, prompt], max_new_tokens=12, stop_ids=[stop])
    assert out.tokens[0] == free[:first + 1] and out.stopped == [True, True]


def test_generation_rejects_bad_requests(tiny_dirs):
    model = load_qwen3(tiny_dirs["tied_gqa1"])
    with pytest.raises(InputError, match="empty"):
        generate_greedy(model, [[1, 2], []], max_new_tokens=4)
    with pytest.raises(InputError, match="cache holds 8"):
        generate_greedy(model, [[1] * 6], max_new_tokens=4, max_len=8)


def base_hf(**kw):
    d = dict(model_type="qwen3", vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1)
    d.update(kw)
    return d


def test_config_reads_rope_theta_from_either_place():
    assert Qwen3Config.from_hf(base_hf(rope_theta=5e5)).rope_theta == 5e5
    assert Qwen3Config.from_hf(base_hf(rope_parameters={"rope_theta": 2e4, "rope_type": "default"})).rope_theta == 2e4
    cfg = Qwen3Config.from_hf(base_hf(rope_theta=1e6))
    assert cfg.head_dim == 4 and not cfg.tie_word_embeddings


@pytest.mark.parametrize("bad, message", [
    (dict(model_type="llama"), "model_type is 'llama'"),
    (dict(model_type="qwen3_moe"), "expected 'qwen3'"),
    (dict(rope_theta=1e6, rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_type 'yarn'"),
    (dict(rope_theta=1e6, use_sliding_window=True), "use_sliding_window"),
    (dict(), "no rope_theta"),
])
def test_config_refuses_what_is_not_qwen3_dense(bad, message):
    with pytest.raises(ConfigError, match=message):
        Qwen3Config.from_hf(base_hf(**bad))


def test_config_to_hf_reads_back_in_transformers(tmp_path, tiny_dirs):
    cfg = Qwen3Config.from_dir(tiny_dirs["untied_gqa2"])
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf()))
    hf_cfg = transformers.AutoConfig.from_pretrained(tmp_path)
    assert Qwen3Config.from_hf(hf_cfg.to_dict()) == cfg


@pytest.mark.parametrize("name", ["tied_gqa1", "untied_gqa2", "untied_gqa4"])
def test_splash_attention_equals_the_einsum_path(tiny_dirs, name):
    """TPU's splash attention (Pallas, run here in interpret mode) against the einsum path: a
    training pass (causal) with its gradient, and a right-padded prefill into a cache followed by a
    verification block over it, for GQA ratios 1, 2 and 4; the einsum path matches transformers above."""
    import jax
    from flax import nnx

    from xpress_jax.models.kernels import EINSUM, SPLASH, lowering_for
    model = load_qwen3(tiny_dirs[name])
    tokens = jnp.asarray(random_tokens(model.cfg.vocab_size, (2, 128), seed=3))  # splash's tile is 128 keys
    taps = (0, model.cfg.num_hidden_layers - 1)
    with lowering_for("tpu", interpret=True):
        a, b = (jit_call(model, tokens, tap_layers=taps, attention=k) for k in (EINSUM, SPLASH))
        graphdef, params = nnx.split(model)
        grad = jax.jit(jax.grad(lambda p, k: nnx.merge(graphdef, p)(tokens, attention=k).logits.sum()), static_argnums=1)
        grads = [jax.tree.leaves(grad(params, k)) for k in (EINSUM, SPLASH)]  # every weight's, as training takes it
    np.testing.assert_allclose(np.asarray(a.logits), np.asarray(b.logits), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(a.taps), np.asarray(b.taps), atol=1e-5, rtol=0)
    assert all(np.abs(g).max() > 0 for g in grads[0])
    for g_einsum, g_splash in zip(*grads):  # to 1e-5 of each weight's largest gradient
        scale = float(np.abs(g_einsum).max())
        np.testing.assert_allclose(np.asarray(g_splash), np.asarray(g_einsum), atol=1e-5 * scale, rtol=0)
    lengths = jnp.asarray([128, 77])  # the second prompt right-padded
    caches = {}
    for k in (EINSUM, SPLASH):
        with lowering_for("tpu", interpret=True):
            out = jit_call(model, tokens, cache=KVCache.init(model.cfg, 2, 160), num_new=lengths, attention=k)
        block = jit_call(model, tokens[:, :5], cache=out.cache)  # 5 more tokens over 128 and 77 committed (einsum)
        caches[k] = (out, block)
    for x, y in zip(caches[EINSUM], caches[SPLASH]):
        np.testing.assert_allclose(np.asarray(x.logits[0]), np.asarray(y.logits[0]), atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(x.logits[1, :77]), np.asarray(y.logits[1, :77]), atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(x.logits[1, :5]), np.asarray(y.logits[1, :5]), atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.asarray(x.cache.k[0]), np.asarray(y.cache.k[0]), atol=1e-5, rtol=0)


def test_a_scanned_layer_stack_compiles_one_layer_body():
    """Scanned (training's layout), the compiled forward pass of a 12-layer target and a 12-layer
    drafter's training pass hold as many matmuls as 2-layer ones; unrolled, they grow with depth."""
    import re

    from flax import nnx

    from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig

    def dots(num_layers, scan):
        cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=num_layers,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=1e4)
        target = Qwen3(cfg, rngs=nnx.Rngs(0), scan=scan)
        dcfg = DrafterConfig.from_target(cfg, num_layers=num_layers, target_layer_ids=(0, 1), block_size=4,
                                         mask_token_id=63)
        drafter = DFlashDrafter(dcfg, rngs=nnx.Rngs(1), scan=scan)

        def step(target, drafter):
            out = target(jnp.ones((2, 8), jnp.int32), tap_layers=(0, 1))
            ctx = drafter.training_context(out.taps)
            blocks = drafter.anchored_blocks(ctx, jnp.ones((2, 2, 4, 32)), jnp.array([[1, 3], [2, 4]]))
            return out.logits.sum() + blocks.sum()

        hlo = nnx.jit(step).lower(target, drafter).compile().as_text()
        return len(re.findall(r" dot\(| convolution\(", hlo))

    assert dots(12, scan=True) == dots(2, scan=True) > 0
    assert dots(12, scan=False) > 3 * dots(2, scan=False)


def test_both_row_orders_attend_alike_and_the_cache_writes_in_its_own():
    """Attention over rows in either order gives the same outputs; KVCache.write places each
    sequence's new keys in the rows its order assigns, at that sequence's offset."""
    from xpress_jax.models.layers import BATCH_MAJOR, HEADS_MAJOR
    from xpress_jax.models.qwen3 import KVCache
    rng = np.random.default_rng(0)
    batch, seq, heads, kv_heads, head_dim = 3, 5, 4, 2, 8
    q = jnp.asarray(rng.normal(size=(batch, seq, heads, head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(batch, seq, kv_heads, head_dim)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(rng.random((batch, seq, seq)) < 0.7).at[:, :, 0].set(True)
    outs = [order.attend(q, order.rows(k), order.rows(v), mask) for order in (BATCH_MAJOR, HEADS_MAJOR)]
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(outs[1]), atol=1e-6)
    offsets = jnp.array([0, 2, 1])
    buf = KVCache.write(jnp.zeros((batch * kv_heads, 8, head_dim)), k, offsets)
    rows = KVCache.ORDER.rows(k)  # [rows, seq, head_dim]
    for r, o in enumerate(np.asarray(KVCache.ORDER.per_row(offsets, kv_heads))):
        np.testing.assert_array_equal(np.asarray(buf[r, o:o + seq]), np.asarray(rows[r]))
    assert KVCache.ORDER is HEADS_MAJOR


@pytest.mark.parametrize("filled", [1, 7, 40, 64, 100, 130])
def test_attention_over_the_filled_slots_equals_attention_over_all(filled):
    """attend_filled reads the first `filled` slots in chunks (the last one overlapping, 130 slots in
    chunks of 16) with an online softmax, then a segment read whole: the outputs equal `attend` over
    the concatenated keys, where the slots past `filled` are masked, to float32 rounding; in both
    row orders, with GQA and a mask that hides some filled slots."""
    from xpress_jax.models.layers import BATCH_MAJOR, HEADS_MAJOR
    rng = np.random.default_rng(filled)
    batch, q_len, heads, kv_heads, head_dim, slots, tail = 2, 5, 4, 2, 8, 130, 6
    q = jnp.asarray(rng.normal(size=(batch, q_len, heads, head_dim)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(batch, slots + tail, kv_heads, head_dim)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(rng.random((batch, q_len, slots + tail)) < 0.6)
    mask = mask.at[:, :, filled:slots].set(False).at[:, :, 0].set(True)
    for order in (BATCH_MAJOR, HEADS_MAJOR):
        kr, vr = order.rows(k), order.rows(v)
        whole = order.attend(q, kr, vr, mask)
        parts = [(kr[:, :slots], vr[:, :slots], mask[..., :slots], jnp.int32(filled)),
                 (kr[:, slots:], vr[:, slots:], mask[..., slots:], None)]
        read = jax.jit(lambda q, parts: order.attend_filled(q, parts, chunk=16))(q, parts)  # 130 > 4 chunks
        np.testing.assert_allclose(np.asarray(read), np.asarray(whole), atol=2e-6, rtol=1e-5)
