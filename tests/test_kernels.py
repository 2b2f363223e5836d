"""Fused attention (models/kernels.py): which kernel each platform gets, splash attention on a
simulated mesh equal to the einsum path, and the programs lowered for TPU holding the kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xpress_jax import sharding
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.models import kernels
from xpress_jax.models.kernels import CUDNN, EINSUM, SPLASH, choose_kernel, lowering_for


def test_each_platform_gets_its_kernel_where_the_shapes_allow_it():
    with lowering_for("tpu"):
        assert choose_kernel(2048, 2048, 128, jnp.bfloat16) == SPLASH
        assert choose_kernel(512, 2048, 128, jnp.float32, offset=1536) == SPLASH  # any dtype, offsets too
        assert choose_kernel(192, 192, 128, jnp.bfloat16) == EINSUM  # not whole 128-key tiles
    with lowering_for("gpu"):
        assert choose_kernel(2048, 2048, 128, jnp.bfloat16) == CUDNN
        assert choose_kernel(2048, 2048, 128, jnp.float32) == EINSUM  # cuDNN's flash kernel is fp16/bf16
        assert choose_kernel(2048, 2048, 256, jnp.bfloat16) == EINSUM
        assert choose_kernel(512, 2048, 128, jnp.bfloat16, offset=1536) == EINSUM  # top-left causal only
    with lowering_for("cpu"):
        assert choose_kernel(2048, 2048, 128, jnp.bfloat16) == EINSUM
    assert kernels.platform() == jax.default_backend()
    with pytest.raises(ValueError, match="top-left"):
        kernels.causal_attention(*(jnp.zeros((1, 8, 2, 8), jnp.bfloat16),) * 3, CUDNN, offset=4)


def test_a_splash_kernel_built_inside_one_trace_serves_the_next():
    """The kernel is cached per shape; built while a jitted pass is traced (training's step, say),
    its mask tables are constants, not that trace's values, so a second trace (a backward pass, a
    second program at the same lengths) can use it."""
    kernels._splash_kernel.cache_clear()
    q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 128, 2, 8))  # [batch, seq, heads, head_dim] each

    def attend(q, k, v):
        return kernels.causal_attention(q, k, v, SPLASH)

    with lowering_for("tpu", interpret=True):
        forward = jax.jit(attend)(q, k, v)
        grad = jax.jit(jax.grad(lambda q: attend(q, k, v).sum()))(q)
    scores = jnp.einsum("bthd,bshd->bhts", q, k) * 8 ** -0.5
    causal = jnp.tril(jnp.ones((128, 128), bool))
    expected = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), -1), v)
    np.testing.assert_allclose(np.asarray(forward), np.asarray(expected), atol=1e-5)
    assert np.isfinite(np.asarray(grad)).all() and np.abs(np.asarray(grad)).max() > 0


@pytest.mark.parametrize("mesh_shape, kv_heads", [((1, 4, 2), 2), ((2, 1, 4), 1)],
                         ids=["fsdp-tensor", "data-tensor-mqa"])
def test_splash_on_a_mesh_runs_per_device_and_equals_the_einsum_path(tmp_path, mesh_shape, kv_heads):
    """Inside a jitted pass on 8 simulated devices, splash attention runs in a shard_map over the
    batch and head splits (KV heads the tensor axis cannot split are repeated per query head first);
    its logits equal the einsum path's, and the program gathers no activations over the batch."""
    from conftest import make_hf_qwen3
    path = make_hf_qwen3(str(tmp_path / "m"), num_layers=2, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=kv_heads, head_dim=16)
    model = load_qwen3(path, scan=True)
    mesh = sharding.make_mesh(mesh_shape)
    batch_split = jax.sharding.NamedSharding(mesh, sharding.logical_to_spec(("batch", None), (8, 128), mesh))
    tokens = jax.device_put(jnp.asarray(np.random.default_rng(0).integers(0, 128, (8, 128)), jnp.int32), batch_split)
    logits, hlo = {}, {}
    for k in (EINSUM, SPLASH):
        def forward(tokens, k=k):
            with sharding.activations_on(mesh), lowering_for("tpu", interpret=True):
                return model(tokens, attention=k).logits
        lowered = jax.jit(forward).lower(tokens)
        hlo[k] = lowered.compile().as_text()
        logits[k] = np.asarray(jax.jit(forward)(tokens))
    np.testing.assert_allclose(logits[SPLASH], logits[EINSUM], atol=1e-5, rtol=0)
    assert "all-gather" not in hlo[SPLASH] or "all-gather" in hlo[EINSUM]  # no gather the einsum path lacks
    assert not [line for line in hlo[SPLASH].splitlines() if "all-gather" in line and "s32[8,128]" in line]


def test_the_prefill_and_the_train_step_lowered_for_tpu_hold_splash_attention(tmp_path):
    """jax.export for TPU from this CPU: the prefill of a 1,024-token prompt (chunks of 512 asked
    for: a fused kernel takes the prompt whole) and the train step at 128 tokens hold the splash
    kernel as a tpu_custom_call; the same programs lowered for this CPU hold none, and a train
    step at 192 tokens (not whole 128-key tiles) holds none on TPU either: read from the programs."""
    from conftest import make_hf_qwen3
    from train_helpers import train_config

    from xpress_jax.decoding.speculative import prefill
    from xpress_jax.train.dry_run import fused_attention
    model = load_qwen3(make_hf_qwen3(str(tmp_path / "m"), num_layers=2, hidden_size=64, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, vocab_size=256))
    prompt = jax.ShapeDtypeStruct((2, 1024), jnp.int32)
    lengths = jax.ShapeDtypeStruct((2,), jnp.int32)
    text = {}
    for platform in ("tpu", "cpu"):
        with lowering_for(platform):
            fn = jax.jit(lambda p, n: prefill(model, None, p, n, 1040, chunk=512)[0])
            text[platform] = (jax.export.export(fn, platforms=[platform])(prompt, lengths).mlir_module())
    assert kernels.kernels_in(text["tpu"]) == [SPLASH]
    assert kernels.kernels_in(text["cpu"]) == []
    config = train_config(tmp_path, **{"mesh.shape": "(1,4,1)", "data.max_len": "128", "train.batch_size": "4"})
    assert fused_attention(config, "tpu") == [SPLASH]
    assert fused_attention(config, "cpu") == []
    assert fused_attention(train_config(tmp_path, **{"mesh.shape": "(1,4,1)", "data.max_len": "192",
                                                     "train.batch_size": "4"}), "tpu") == []


def test_the_qwen3_8b_prefill_lowered_for_tpu_holds_splash_attention():
    """configs/qwen3_8b.py's target on abstract weights (nothing allocated): the prefill of a batch
    of 8 prompts padded to 2,048 tokens, into a cache for 2,048 new tokens, lowered for TPU."""
    from flax import nnx

    from xpress_jax.cli import config_path, load_config
    from xpress_jax.decoding.speculative import prefill
    from xpress_jax.models.build import build_target
    config = load_config(config_path("qwen3_8b.py"))
    target = build_target(config, abstract=True)
    graphdef, state = nnx.split(target)
    prompt, lengths = jax.ShapeDtypeStruct((8, 2048), jnp.int32), jax.ShapeDtypeStruct((8,), jnp.int32)

    def run(state, p, n):
        return prefill(nnx.merge(graphdef, state), None, p, n, 2048 + 2048 + 16, config.eval.prefill_chunk)[0]
    with lowering_for("tpu"):
        text = jax.export.export(jax.jit(run), platforms=["tpu"])(state, prompt, lengths).mlir_module()
    assert target.cfg.num_hidden_layers == 36 and kernels.kernels_in(text) == [SPLASH]
