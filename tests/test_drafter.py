"""The DFlash drafter: parity with the official PyTorch model, training mode = per-block inference,
the block-sparse mask, the context cache, and the checkpoint layout the loaders accept."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from dflash import model as dflash_model  # the official PyTorch drafter (PyPI dflash 0.1.0)
from flax import nnx

from compiled import jit_call
from xpress_jax.checkpoints.hf_drafter import load_drafter, save_drafter
from xpress_jax.errors import ConfigError
from xpress_jax.models.drafter import (ContextCache, DFlashDrafter, DrafterConfig, block_inputs,
                                       default_target_layer_ids)
from xpress_jax.models.qwen3 import Qwen3Config


HIDDEN, N_FEAT = 32, 3


def official_drafter(path, seed=0, block_size=8):
    """A tiny random DFlashDraftModel (norm weights randomised), saved with save_pretrained."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(vocab_size=96, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   initializer_range=0.2, rope_theta=10_000.0)
    cfg.num_target_layers, cfg.block_size = 6, block_size
    cfg.dflash_config = {"mask_token_id": 95, "target_layer_ids": [0, 2, 4]}
    cfg.architectures = ["DFlashDraftModel"]
    model = dflash_model.DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return model


def test_default_target_layer_ids():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 1) == [18]
    assert default_target_layer_ids(28, 5) == [1, 7, 13, 19, 25]


@pytest.mark.parametrize("ctx", [1, 6])
def test_parity_with_official_dflash(tmp_path, ctx):
    ref_model = official_drafter(tmp_path)
    ours = load_drafter(str(tmp_path))
    block = ours.cfg.block_size
    rng = torch.Generator().manual_seed(ctx)
    feats = torch.randn(2, ctx, N_FEAT * HIDDEN, generator=rng)
    noise = torch.randn(2, block, HIDDEN, generator=rng)
    lm_head = torch.randn(96, HIDDEN, generator=rng)
    with torch.no_grad():
        ref_hidden = ref_model(position_ids=torch.arange(ctx + block)[None], noise_embedding=noise, target_hidden=feats)
        ref_logits = ref_model.compute_logits(ref_hidden[:, 1:], lambda x: x @ lm_head.T).numpy()
    cache = ours.extend_context(ContextCache.init(ours.cfg, 2, 32),
                                jnp.asarray(feats.numpy()).reshape(2, ctx, N_FEAT, HIDDEN))
    hidden = jit_call(ours, jnp.asarray(noise.numpy()), cache)
    logits = np.asarray(hidden[:, 1:] @ jnp.asarray(lm_head.numpy()).T)
    np.testing.assert_allclose(np.asarray(hidden), ref_hidden.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-4, rtol=0)


def test_export_round_trip_loads_in_official_dflash(tmp_path):
    official_drafter(tmp_path / "src")
    ours = load_drafter(str(tmp_path / "src"))
    save_drafter(ours, str(tmp_path / "out"), dtype=np.float32)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["target_layer_ids"] == [0, 2, 4]
    assert "sliding_attention" not in json.dumps(cfg) and "is_causal" not in cfg
    reloaded = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path / "out")).eval()
    original = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path / "src")).eval()
    for (name, a), (_, b) in zip(original.state_dict().items(), reloaded.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert reloaded.target_layer_ids == [0, 2, 4] and reloaded.mask_token_id == 95 and reloaded.block_size == 8


def tiny_drafter(seed=0, block_size=4):
    target = Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, rope_theta=10_000.0)
    cfg = DrafterConfig.from_target(target, num_layers=2, block_size=block_size, mask_token_id=39)
    return DFlashDrafter(cfg, rngs=nnx.Rngs(seed))


def test_training_mode_equals_inference_per_block(tmp_path):
    """Training's anchored blocks equal decoding's one block at a time, and the scanned layout
    (the same drafter saved and loaded back stacked, as training holds it) gives the same blocks."""
    drafter = tiny_drafter()
    cfg = drafter.cfg
    save_drafter(drafter, str(tmp_path), dtype=np.float32)
    scanned = load_drafter(str(tmp_path), scan=True)
    seq, n_feat, block = 12, len(cfg.target_layer_ids), cfg.block_size
    keys = jax.random.split(jax.random.key(0), 3)
    taps = jax.random.normal(keys[0], (2, seq, n_feat, cfg.hidden_size))
    anchors = jnp.array([[0, 3, 7, 11], [2, 5, 5, 9]])  # repeated and edge anchors too
    embeds = jax.random.normal(keys[1], (2, 4, block, cfg.hidden_size))
    trained = jit_call(drafter, taps, embeds, anchors, method="train_blocks")  # [2, 4, B, hidden]
    np.testing.assert_allclose(np.asarray(jit_call(scanned, taps, embeds, anchors, method="train_blocks")),
                               np.asarray(trained),
                               atol=1e-5, rtol=0)
    for b in range(2):
        for a in range(4):
            p = int(anchors[b, a])
            cache = ContextCache.init(cfg, 1, 32)
            if p:
                cache = jit_call(drafter, cache, taps[b:b + 1, :p], method="extend_context")
            alone = jit_call(drafter, embeds[b:b + 1, a], cache)
            np.testing.assert_allclose(np.asarray(trained[b, a]), np.asarray(alone[0]), atol=1e-5, rtol=0)


def test_block_sparse_mask_sees_exactly_context_before_anchor_and_own_block():
    """Perturb one context position or another block: only the blocks that may see it change."""
    drafter = tiny_drafter(seed=1)
    cfg = drafter.cfg
    seq, block = 10, cfg.block_size
    keys = jax.random.split(jax.random.key(2), 3)
    taps = jax.random.normal(keys[0], (1, seq, len(cfg.target_layer_ids), cfg.hidden_size))
    embeds = jax.random.normal(keys[1], (1, 3, block, cfg.hidden_size))
    anchors = jnp.array([[2, 5, 8]])
    base = jit_call(drafter, taps, embeds, anchors, method="train_blocks")
    changed = lambda out: np.abs(np.asarray(out - base)).max(axis=(0, 2, 3)) > 1e-6  # noqa: E731  per block
    # context position 5: visible to the block anchored at 8 only (5 < 8), not to the one at 5 (strictly before)
    poked = jit_call(drafter, taps.at[:, 5].add(1.0), embeds, anchors, method="train_blocks")
    assert changed(poked).tolist() == [False, False, True]
    # block 1's own tokens: no other block sees them
    poked = jit_call(drafter, taps, embeds.at[:, 1, 2].add(1.0), anchors, method="train_blocks")
    assert changed(poked).tolist() == [False, True, False]


def test_context_cache_rollback_and_regrow():
    drafter = tiny_drafter(seed=3)
    cfg = drafter.cfg
    keys = jax.random.split(jax.random.key(4), 3)
    taps = jax.random.normal(keys[0], (1, 9, len(cfg.target_layer_ids), cfg.hidden_size))
    other = jax.random.normal(keys[1], (1, 3, len(cfg.target_layer_ids), cfg.hidden_size))
    embeds = jax.random.normal(keys[2], (1, cfg.block_size, cfg.hidden_size))
    cache = drafter.extend_context(ContextCache.init(cfg, 1, 16), taps)
    cache = drafter.extend_context(cache.rollback(jnp.array([6])), other)
    fresh = drafter.extend_context(ContextCache.init(cfg, 1, 16), jnp.concatenate([taps[:, :6], other], 1))
    np.testing.assert_allclose(np.asarray(drafter(embeds, cache)), np.asarray(drafter(embeds, fresh)), atol=1e-6)


def test_block_inputs_and_config_errors():
    assert block_inputs(jnp.array([7, 8]), 4, 99).tolist() == [[7, 99, 99, 99], [8, 99, 99, 99]]
    target = Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    with pytest.raises(ConfigError, match="outside the target"):
        DrafterConfig.from_target(target, num_layers=2, target_layer_ids=[1, 4], mask_token_id=39)
    with pytest.raises(ConfigError, match="mask_token_id"):
        DrafterConfig.from_target(target, num_layers=2, mask_token_id=151669)
    cfg = DrafterConfig.from_target(target, num_layers=2, mask_token_id=39)
    with pytest.raises(ConfigError, match="hidden_size is 16 but the target's is 32"):
        cfg.check_target(Qwen3Config(**{**target.__dict__, "hidden_size": 32}))


def test_what_depends_on_the_target_is_derived_from_it(tmp_path):
    """A recipe applied to another target: unless set, the drafter's target layers follow DFlash's
    spacing over that target's layers, and its mask token comes from that target's tokenizer."""
    from tokenizer_fixture import build_qwen3_tokenizer
    from xpress_jax import assets
    from xpress_jax.cli import with_overrides
    from xpress_jax.errors import ConfigError
    from xpress_jax.models.build import drafter_config
    from xpress_jax.models.drafter import default_target_layer_ids
    recipe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "qwen3_8b.py")
    own = drafter_config(with_overrides(recipe))  # random Qwen3-8B: DFlash's published choices
    assert own.target_layer_ids == (1, 9, 17, 25, 33) and own.mask_token_id == 151669
    tiny = drafter_config(with_overrides(recipe, **{"target.hf_dir": assets.TINY_TARGET}))  # 6 layers, its own BPE
    assert tiny.target_layer_ids == tuple(default_target_layer_ids(6, 5)) and tiny.mask_token_id == 5
    # Qwen3's tokenizer has no <|mask|>: the first id after its own (151669), refused where the vocabulary ends first
    qwen3_tokenizer = build_qwen3_tokenizer(str(tmp_path / "tok"))
    with pytest.raises(ConfigError, match=r"the first id after .* is 151669, outside the target's vocabulary of 2048"):
        drafter_config(with_overrides(recipe, **{"target.hf_dir": assets.TINY_TARGET,
                                                 "data.tokenizer_dir": qwen3_tokenizer}))
