"""One place per default: every typed settings object takes its defaults from the config, so a
settings class whose default differs from the config's fails here; and one optimizer factory and
one checkpoint policy read the `train` and `pretrain` sections alike."""

import dataclasses

import pytest

from xpress_jax.config import dflash_recipe, drafter_section, heads_section, run_section, target_arch
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


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_decode_settings_defaults_are_the_eval_sections(recipe):
    where = {"branches": lambda e: e.dloop_branches[0]}
    defaults = _defaults(DecodeSettings)
    assert set(defaults) == {f.name for f in dataclasses.fields(DecodeSettings)}
    for name, value in defaults.items():
        assert value == where.get(name, lambda e: e[name])(recipe.eval), name
    assert EvalSettings.from_config(recipe.eval).decode() == DecodeSettings()


def test_eval_settings_have_exactly_the_eval_sections_fields_and_no_defaults_of_their_own(recipe):
    assert not _defaults(EvalSettings)
    assert {f.name for f in dataclasses.fields(EvalSettings)} == set(recipe.eval.keys())
    s = EvalSettings.from_config(recipe.eval)
    assert s.as_dict() == {k: list(v) if isinstance(v, tuple) else v for k, v in recipe.eval.items()}
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_iters = 8  # changed with dataclasses.replace, never in place


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
    shared = set(run_section())
    assert shared <= set(recipe.train.keys()) and shared <= set(recipe.pretrain.keys())
    # the loop and the optimizer read only these fields, so both sections drive them alike
    from xpress_jax.train import loop, state
    import optax
    tx = state.make_optimizer(recipe.pretrain, 10)
    assert isinstance(tx, optax.GradientTransformation)
    for section in (recipe.train, recipe.pretrain):
        ckpt = loop.checkpointer(section, str(tmp_path / section.out_dir))
        options = ckpt.manager._options  # noqa: SLF001 - the policy as configured
        assert (options.max_to_keep, options.save_interval_steps, options.enable_async_checkpointing) == (
            section.keep, section.save_every, section.async_checkpointing)
        ckpt.close()
