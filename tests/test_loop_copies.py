"""The decode loop updates its caches in place: no copy of a cache buffer inside the compiled
`while` body (with a 4-D cache that the attention dots read through a bitcast, XLA's CPU compiler
copies every cache buffer four times per step; benchmarks/cpu/cache-copies/)."""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from spec_fixtures import redraw
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodeOptions, DecodingModels, _decode
from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig
from xpress_jax.models.qwen3 import Qwen3, Qwen3Config

SLOTS = 53  # a cache length no other f32 array in the program has
# the fusion emitters users compile with (the suite turns them off to compile faster, tests/conftest.py)
PRODUCTION_FUSION = {"xla_cpu_use_fusion_emitters": True}


def loop_body(hlo: str) -> str:
    """The text of the compiled program's (outermost) while body."""
    name = re.search(r"body=(%[\w.\-]+)", hlo).group(1)
    body = hlo[hlo.index("\n" + name + " "):]
    return body[:body.index("\n}")]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a property of XLA's CPU compiler")
@pytest.mark.parametrize("decoder,settings", [("target", DecodeSettings()), ("dflash", DecodeSettings()),
                                              ("dflash", DecodeSettings(verify_tokens=2)),
                                              ("dloop", DecodeSettings(branches=2))])
@pytest.mark.parametrize("batch", [1, 2])
def test_no_cache_copies_inside_the_decode_loop(decoder, settings, batch):
    # head_dim 48 as in the tiny reproduction: with head_dim 8 the 4-D cache passed too (at these
    # shapes it fails on target-only decoding at batch 1, with 24 copies per step). D-Loop with two
    # branches writes each buffer twice a step (verification, then the kept branch's move); written
    # through a 4-D view of the cache that made 12 copies per step at batch 1
    tcfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=48, rope_theta=10_000.0)
    target = redraw(Qwen3(tcfg, rngs=nnx.Rngs(0)), 0)
    dcfg = DrafterConfig.from_target(tcfg, num_layers=2, block_size=4, mask_token_id=63)
    models = DecodingModels(target, redraw(DFlashDrafter(dcfg, rngs=nnx.Rngs(1)), 1))
    opts = DecodeOptions(decoder=decoder, greedy=True, max_len=SLOTS, settings=settings)
    graphdef, state = nnx.split(models)
    lowered = _decode.lower(graphdef, state, jnp.ones((batch, 8), jnp.int32), jnp.full((batch,), 8, jnp.int32),
                            jnp.array([1], jnp.int32), jax.random.key(0), jnp.float32(1.0), jnp.int32(16),
                            jnp.int32(4), opts)
    hlo = lowered.compile(PRODUCTION_FUSION).as_text()
    body = loop_body(hlo)
    cache_buffer = re.compile(r"= f32\[[0-9,]*\b%d\b[0-9,]*\]\{[0-9,]*\} copy\(" % SLOTS)
    copies = [line.strip()[:120] for line in body.splitlines() if cache_buffer.search(line)]
    assert re.search(r"f32\[[0-9,]*\b%d\b" % SLOTS, body), "the loop body should hold the caches"
    assert not copies, f"{len(copies)} cache copies per step, e.g. {copies[:3]}"
