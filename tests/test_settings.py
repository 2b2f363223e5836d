"""One place per field: each default beside its rule (config.py), the typed views made from those
declarations; and one optimizer factory and one checkpoint policy read the `train` and
`pretrain` sections alike."""

import dataclasses

import pytest

from xpress_jax.config import dflash_recipe, drafter_section, heads_section, target_arch
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.eval.settings import EvalSettings
from xpress_jax.models.drafter import DrafterConfig


@pytest.fixture(scope="module")
def recipe():
    """The recipe's own defaults: nothing overridden but the target's shape (Qwen3's vocabulary; nothing is built)."""
    return dflash_recipe(target=target_arch(vocab_size=151_936, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6,
                                            tie_word_embeddings=True, max_position_embeddings=512),
                         drafter=drafter_section(), heads=heads_section())


def test_every_declared_default_passes_its_own_rule(recipe):
    """A field's default and rule sit side by side (config.py); a default its rule refuses fails here."""
    from xpress_jax.config import REQUIRED, fields
    bad = {k: f.default for k, f in fields().items() if f.default is not REQUIRED and f.rule(f.default)}
    assert not bad


def test_the_typed_views_are_made_from_the_declarations(recipe):
    """EvalSettings has the eval section's fields with its defaults; DecodeSettings the eval knobs'
    defaults; LossSettings reads train.loss and every registered head's weight."""
    from xpress_jax.train.step import LossSettings
    s = EvalSettings.from_config(recipe.eval)
    assert s == EvalSettings() and s.decode() == DecodeSettings()
    assert s.as_dict() == {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.eval.items()}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_iters = 8  # changed with dataclasses.replace, never in place
    changed = recipe.train.copy_and_resolve_references()
    changed.loss.tv, changed.loss.markov = 0.25, 0.5
    loss = LossSettings.from_config(changed)
    assert loss.tv == 0.25 and dict(loss.head_weights)["markov"] == 0.5 and loss.gamma == recipe.train.loss.gamma


def test_decode_settings_are_checked_by_the_eval_fields_rules():
    from xpress_jax.errors import InputError
    with pytest.raises(InputError, match="max_iters must be an integer >= 1, got 0"):
        DecodeSettings(max_iters=0).check("xpress", block=16)
    with pytest.raises(InputError, match="verify_tokens must lie in 0..15"):
        DecodeSettings(verify_tokens=16).check("dflash", block=16)


def test_the_drafter_sections_defaults_are_the_drafters(recipe):
    from xpress_jax.models.qwen3 import Qwen3Config
    target = Qwen3Config.from_hf({**recipe.target.arch.to_dict(), "model_type": "qwen3"})
    from xpress_jax.config import MASK_FROM_TOKENIZER
    from xpress_jax.models.build import drafter_config
    built = DrafterConfig.from_target(target)
    assert (recipe.drafter.num_layers, recipe.drafter.block_size) == (built.num_hidden_layers, built.block_size)
    # the mask token comes from the target's tokenizer; a random target without one gets Qwen3's, as DFlash's
    assert recipe.drafter.mask_token_id == MASK_FROM_TOKENIZER
    assert drafter_config(recipe, target).mask_token_id == built.mask_token_id


def test_train_and_pretrain_share_the_run_sections_fields(recipe, tmp_path):
    from xpress_jax.config import RUN
    shared = set(RUN)
    assert shared <= set(recipe.train.keys()) and shared <= set(recipe.pretrain.keys())
    # the loop and the optimizer read only these fields, so both sections drive them alike
    from xpress_jax.train import loop, state
    import optax
    tx = state.make_optimizer(recipe.pretrain, state.make_schedule(recipe.pretrain, 10))
    assert isinstance(tx, optax.GradientTransformation)
    for section in (recipe.train, recipe.pretrain):
        ckpt = loop.checkpointer(section, str(tmp_path / section.out_dir))
        options = ckpt.manager._options  # noqa: SLF001 - the policy as configured
        assert (options.max_to_keep, options.save_interval_steps, options.enable_async_checkpointing) == (
            section.keep, section.save_every, section.async_checkpointing)
        ckpt.close()
