"""The registry of methods is where heads and decoders are listed: everything that builds,
trains, decodes or saves a head reads it, so a new head is one entry (checked here by
registering a copy of the Markov head under a new name and using it end to end)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from head_fixtures import SHAPE, SIZES, inputs
from train_helpers import train_config
from xpress_jax import methods
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.errors import InputError


def test_every_decoder_names_a_registered_head_and_real_knobs():
    fields = {f.name for f in dataclasses.fields(DecodeSettings)}
    for name, spec in methods.DECODERS.items():
        assert spec.head is None or spec.head in methods.HEADS, name
        assert set(spec.knobs) <= fields, name
        assert DecodeSettings(max_iters=7, top_k=3, branches=2).for_decoder(name) == dataclasses.replace(
            DecodeSettings(), **{k: getattr(DecodeSettings(max_iters=7, top_k=3, branches=2), k) for k in spec.knobs})
    assert methods.decoders_reading("branches") == ("dloop", "dloop+xpress")
    assert methods.decoders_reading("top_k") == ("xpress", "dloop+xpress")
    assert "target" not in methods.SPEC_DECODERS and set(methods.SPEC_DECODERS) < set(methods.DECODERS)


def test_a_new_head_is_one_registry_entry(tmp_path, monkeypatch):
    """'markov2' (the Markov head under another name) is built, trained as a Trainable attribute,
    decoded serially, saved and loaded, and refused knobs it would ignore, with no other change."""
    from xpress_jax.models.build import build_head, build_trainable, new_head, target_config
    from xpress_jax.checkpoints.heads import load_head, save_head
    from xpress_jax.decoding.refine import refine_block

    monkeypatch.setitem(methods.HEADS, "markov2", methods.HEADS["markov"])
    monkeypatch.setitem(methods.DECODERS, "markov2", methods.DecoderSpec(head="markov2"))
    monkeypatch.setitem(methods.HEAD_OF, "markov2", "markov2")

    config = train_config(tmp_path)
    with config.unlocked():
        config.train.heads = ("markov2",)
    model = build_trainable(config, target_config(config))
    assert model.head_names() == ("markov2",) and type(model.markov2) is methods.HEADS["markov"].module

    spec = methods.HEADS["markov2"]
    head = spec.module(rngs=nnx.Rngs(0), **spec.kwargs(SIZES, SHAPE))
    s, h, _, embed = inputs(1)
    anchor = jnp.array([1, 2, 3])
    got = refine_block("markov2", head, s, h, anchor, embed)
    expect, _ = head.decode_serial(s, h, anchor, embed)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expect))

    path = save_head(head, str(tmp_path / "ckpt"), "markov2")
    assert path.endswith("heads/markov2.safetensors")
    loaded = load_head(nnx.eval_shape(lambda: head), str(tmp_path / "ckpt"), "markov2")
    np.testing.assert_array_equal(np.asarray(loaded.markov_w1.get_value()), np.asarray(head.markov_w1.get_value()))

    drafter_cfg = model.drafter.cfg
    assert type(build_head("markov2", config, drafter_cfg)) is type(new_head("markov", config, drafter_cfg))
    with pytest.raises(InputError, match="max_iters=2 would be ignored by decoder 'markov2'"):
        DecodeSettings(max_iters=2).check("markov2", block=4)
