"""A batch split over local devices (decoding/devices.py): the same tokens as one device, an
eighth of the work on each of eight, and no collective in the compiled loop."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spec_fixtures import random_models
from xpress_jax.decoding.devices import batch_mesh, replicate
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodeOptions, _decode, _decode_split, generate
from xpress_jax.errors import InputError


def test_eight_devices_decode_the_same_tokens_as_one():
    models = random_models("xpress")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 47, rng.integers(3, 12)).tolist() for _ in range(11)]  # 11: rows are padded to 16
    one = generate(models, prompts, decoder="xpress", max_new_tokens=24, stop_ids=(5,))
    split = generate(models, prompts, decoder="xpress", max_new_tokens=24, stop_ids=(5,), devices=8)
    assert split.tokens == one.tokens and split.stopped == one.stopped
    for k, v in one.stats.items():
        np.testing.assert_array_equal(split.stats[k], v, err_msg=k)
    assert len({len(t) for t in one.tokens}) > 2 and any(one.stopped)  # rows that end at different steps


def test_each_of_eight_devices_does_an_eighth_of_the_work_with_no_collective():
    models = random_models("xpress")
    graphdef, state = nnx.split(models)
    opts = DecodeOptions(decoder="xpress", max_new_tokens=24, max_len=64, settings=DecodeSettings())
    ids, lengths = jnp.zeros((16, 16), jnp.int32), jnp.full((16,), 8, jnp.int32)
    rest = (jnp.asarray([5], jnp.int32), jax.random.key(0), jnp.float32(1.0))
    mesh = batch_mesh(8)
    one = _decode.lower(graphdef, state, ids, lengths, *rest, opts).compile()
    split = _decode_split.lower(graphdef, replicate(state, mesh), ids, lengths, *rest, opts, mesh).compile()

    def flops(compiled):
        cost = compiled.cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    assert flops(split) / flops(one) < 1.25 / 8, (flops(split), flops(one))
    temps = split.memory_analysis().temp_size_in_bytes / one.memory_analysis().temp_size_in_bytes
    assert temps < 0.2, temps  # the KV cache and the loop's buffers hold each device's rows only
    assert not re.findall(r"all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter", split.as_text())


def test_more_devices_than_this_process_has_are_refused():
    with pytest.raises(InputError, match=r"devices=9: this process has 8 device"):
        generate(random_models("dflash"), [[1, 2, 3]], max_new_tokens=4, devices=9)
