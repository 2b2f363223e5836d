"""Fused attention (models/kernels.py): which kernel each platform gets, splash attention on a
simulated mesh equal to the einsum path, flash_gpu (Pallas GPU) likewise in interpret mode, and
the programs lowered for TPU and CUDA holding the kernels."""

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xpress_jax import sharding
from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
from xpress_jax.models import flash_gpu, kernels
from xpress_jax.models.kernels import CUDNN, EINSUM, FLASH_GPU, SPLASH, choose_kernel, lowering_for


def test_each_platform_gets_its_kernel_where_the_shapes_allow_it(monkeypatch):
    with lowering_for("tpu"):
        assert choose_kernel(2048, 2048, 128, jnp.bfloat16) == SPLASH
        assert choose_kernel(512, 2048, 128, jnp.float32, offset=1536) == SPLASH  # any dtype, offsets too
        assert choose_kernel(192, 192, 128, jnp.bfloat16) == EINSUM  # not whole 128-key tiles
    with lowering_for("gpu"):
        assert not kernels.cudnn_available()  # no GPU here: cuDNN cannot be traced
        assert choose_kernel(2048, 2048, 128, jnp.bfloat16) == FLASH_GPU
        monkeypatch.setattr(kernels, "cudnn_available", lambda: True)  # as on a GPU
        assert choose_kernel(2048, 2048, 128, jnp.bfloat16) == CUDNN
        # what cuDNN does not take goes to flash_gpu: float32, head_dim 256 is neither's
        assert choose_kernel(2048, 2048, 128, jnp.float32) == FLASH_GPU
        assert choose_kernel(2048, 2048, 256, jnp.bfloat16) == EINSUM
        assert choose_kernel(512, 2048, 128, jnp.bfloat16, offset=1536) == FLASH_GPU  # cuDNN: top-left causal only
        assert choose_kernel(200, 200, 128, jnp.bfloat16, offset=1) == EINSUM  # no 16-token tiles
        with sharding.activations_on(sharding.make_mesh((1, 4, 2))):  # a tensor split of 2
            assert choose_kernel(2048, 2048, 128, jnp.bfloat16, kv_heads=4) == CUDNN
            assert choose_kernel(2048, 2048, 128, jnp.bfloat16, kv_heads=1) == FLASH_GPU  # KV heads not split alike
    with lowering_for("cpu"):
        assert choose_kernel(2048, 2048, 128, jnp.bfloat16) == EINSUM
    assert kernels.platform() == jax.default_backend()
    with pytest.raises(ValueError, match="top-left"):
        kernels.causal_attention(*(jnp.zeros((1, 8, 2, 8), jnp.bfloat16),) * 3, CUDNN, offset=4)


@pytest.mark.parametrize("q_len, kv_len, offset, kv_heads", [(64, 64, 0, 2), (32, 96, 64, 1), (48, 64, 16, 4)],
                         ids=["causal-gqa", "chunk-offset-mqa", "offset-mha"])
def test_flash_gpu_causal_equals_the_einsum_path_forward_and_gradient(q_len, kv_len, offset, kv_heads):
    """The Pallas GPU kernel in interpret mode: a causal pass from the first key, and a chunk placed
    after other keys (query i sees keys 0..i + offset), against softmax attention in einsums."""
    rng = np.random.default_rng(q_len + offset)
    q = jnp.asarray(rng.normal(size=(2, q_len, 4, 16)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, kv_len, kv_heads, 16)), jnp.float32) for _ in range(2))

    def einsum(q, k, v):
        kk, vv = (jnp.repeat(x, 4 // kv_heads, axis=2) for x in (k, v))
        scores = jnp.einsum("bthd,bshd->bhts", q, kk) * 16 ** -0.5
        visible = jnp.arange(kv_len)[None, :] <= jnp.arange(q_len)[:, None] + offset
        return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), -1), vv)

    def fused(q, k, v):
        with lowering_for("gpu", interpret=True):
            return kernels.causal_attention(q, k, v, FLASH_GPU, offset=offset)

    np.testing.assert_allclose(np.asarray(fused(q, k, v)), np.asarray(einsum(q, k, v)), atol=2e-6)
    grads = [jax.grad(lambda *x: jnp.sum(jnp.sin(f(*x))), argnums=(0, 1, 2))(q, k, v) for f in (fused, einsum)]
    for got, expected in zip(*grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)


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
    # no device gathers the queries, keys or values of other sequences or heads: no all-gather of an
    # array with the sequence (128) and head_dim (16) axes; without the shard_map, XLA gathers them
    gathered = [tuple(map(int, dims.split(","))) for dims in re.findall(r"= \w+\[([\d,]+)\][^\n]*? all-gather\(",
                                                                       hlo[SPLASH])]
    assert not [shape for shape in gathered if 128 in shape and 16 in shape], gathered


def test_flash_gpu_reads_overlapping_key_intervals_once():
    """Two key intervals per query that overlap (keys 0..i and i//2..i+16, say) are their union:
    a key block both reach is read once, not counted twice in the softmax."""
    rng = np.random.default_rng(7)
    q = jnp.asarray(rng.normal(size=(1, 64, 2, 16)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(1, 96, 2, 16)), jnp.float32) for _ in range(2))  # 3 key tiles of 32
    i = jnp.arange(64, dtype=jnp.int32)[None]
    bounds = flash_gpu.Bounds(end1=i + 1, start2=i // 2, end2=i + 17)
    with lowering_for("gpu", interpret=True):
        got = flash_gpu.flash_attention(q, k, v, bounds, interpret=True)
    j = jnp.arange(96)[None, :]
    visible = (j < bounds.end1[0][:, None]) | ((j >= bounds.start2[0][:, None]) & (j < bounds.end2[0][:, None]))
    scores = jnp.where(visible, jnp.einsum("bthd,bshd->bhts", q, k) * 16 ** -0.5, -jnp.inf)
    expected = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, -1), v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-6)

def _drafter_and_blocks(kv_heads: int, batch: int = 2):
    """A scanned 2-layer drafter over 128 context tokens and 8 anchored blocks of 16 per sequence:
    anchors at the first position and the last valid one of a right-padded sequence (100 valid
    tokens), anywhere between, and a padding anchor."""
    from flax import nnx

    from xpress_jax.models.drafter import DFlashDrafter, DrafterConfig
    cfg = DrafterConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=kv_heads, head_dim=16, num_target_layers=4, target_layer_ids=(1, 2),
                        vocab_size=300, block_size=16, mask_token_id=5)
    drafter = DFlashDrafter(cfg, rngs=nnx.Rngs(0), scan=True)
    rng = np.random.default_rng(kv_heads)
    taps = jnp.asarray(rng.normal(size=(batch, 128, 2, 64)), jnp.float32)
    embeds = jnp.asarray(rng.normal(size=(batch, 8, 16, 64)), jnp.float32)
    anchors = jnp.asarray([[0, 99, 5, 60, 17, 3, 25, 84]] * batch, jnp.int32).at[1, :4].set([1, 2, 30, 0])
    valid = jnp.ones((batch, 8), bool).at[1, 7].set(False)
    return drafter, taps, embeds, anchors, valid


@pytest.mark.parametrize("platform, kv_heads, mesh_shape", [("tpu", 2, None), ("tpu", 1, (1, 4, 2)),
                                                             ("gpu", 2, None), ("gpu", 1, (1, 4, 2))],
                         ids=["splash-gqa", "splash-mqa-mesh", "flash_gpu-gqa", "flash_gpu-mqa-mesh"])
def test_the_anchored_pass_on_a_kernel_equals_the_einsum_path(platform, kv_heads, mesh_shape):
    """The drafter's anchored training pass through splash with its run-time mask, and through
    flash_gpu with two key intervals per query (Pallas interpret mode), against the einsum path:
    forward and every gradient (parameters, context features, block embeddings), GQA and MQA, on
    one device and inside a shard_map on 8 simulated devices (a tensor split of 2 that cannot
    divide one KV head)."""
    from flax import nnx
    batch = 4 if mesh_shape else 2
    drafter, taps, embeds, anchors, valid = _drafter_and_blocks(kv_heads, batch)
    mesh = sharding.make_mesh(mesh_shape) if mesh_shape else None
    with lowering_for("tpu"):
        assert kernels.choose_anchored_kernel(8 * 16, 128, 16) == SPLASH
        assert kernels.choose_anchored_kernel(8 * 16, 192, 16) == EINSUM  # the context not in whole tiles
    with lowering_for("gpu"):
        assert kernels.choose_anchored_kernel(8 * 16, 192, 16) == FLASH_GPU  # 16-key tiles suffice
        assert kernels.choose_anchored_kernel(8 * 16, 200, 16) == EINSUM

    def loss(drafter, taps, embeds):
        with sharding.activations_on(mesh) if mesh else contextlib.nullcontext():
            return jnp.sum(jnp.sin(drafter.train_blocks(taps, embeds, anchors, valid)))

    grad = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1, 2)))
    expected = grad(drafter, taps, embeds)
    with lowering_for(platform, interpret=True):
        got = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1, 2)))(drafter, taps, embeds)
    np.testing.assert_allclose(float(got[0]), float(expected[0]), rtol=1e-6)
    pairs = list(zip(jax.tree.leaves(got[1]), jax.tree.leaves(expected[1])))
    assert len(pairs) > 10
    for g, e in pairs:
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=2e-5, rtol=1e-4)


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


def test_the_qwen3_8b_prefill_lowered_for_tpu_and_cuda_holds_its_kernel():
    """configs/qwen3_8b.py's target on abstract weights (nothing allocated): the prefill of a batch
    of 8 prompts padded to 2,048 tokens, into a cache for 2,048 new tokens, lowered for TPU (splash)
    and for CUDA (flash_gpu, where a GPU would run cuDNN: it cannot be traced here)."""
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
    with lowering_for("gpu"):  # a new function: jit's trace cache does not key on the platform
        text = flash_gpu.lowered_for_cuda(jax.jit(lambda *a: run(*a)), state, prompt, lengths)
    assert kernels.kernels_in(text) == [FLASH_GPU]


def test_the_qwen3_8b_train_step_runs_its_attention_in_kernels_for_tpu_and_gpu():
    """configs/qwen3_8b.py's train step on a 4-device mesh (simulated, abstract weights), traced and
    lowered for TPU and for CUDA from this CPU: the target's attention and every drafter layer's
    anchored pass are splash kernels on TPU and flash_gpu kernels (Triton custom calls) on GPU, and
    at least 95% of each part's attention FLOPs (as the einsum program counts them) run in them;
    the same step for this CPU runs none."""
    from xpress_jax.cli import config_path, with_overrides
    from xpress_jax.train.dry_run import attention_in_kernels
    config = with_overrides(config_path("qwen3_8b.py"), **{"mesh.shape": "(1,4,1)", "train.batch_size": 8})
    with sharding.subset_meshes_expected():
        report = attention_in_kernels(config, ["cpu", "tpu", "gpu"])
    tpu, gpu, cpu = report["tpu"], report["gpu"], report["cpu"]
    assert tpu["kernels"] == [SPLASH] and gpu["kernels"] == [FLASH_GPU] and cpu["kernels"] == []
    for platform, kernel in ((tpu, SPLASH), (gpu, FLASH_GPU)):
        assert set(platform["parts"]) == {"target", "drafter"}
        for part in platform["parts"].values():
            assert part["kernels"] == [kernel] and part["in_kernels"] >= 0.95
        assert platform["in_kernels"] >= 0.95
    assert cpu["in_kernels"] == 0.0 and "cuDNN" in gpu["cudnn"]
    # the drafter's anchored pass is most of the step's attention: forward, recompute and backward
    assert tpu["parts"]["drafter"]["attention_gflops"] > tpu["parts"]["target"]["attention_gflops"]
