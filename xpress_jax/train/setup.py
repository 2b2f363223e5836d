"""The drafter's training state, built once from a config: the mesh, the frozen target and the
trainable bundle placed by their logical axes, the optimizer, the state's shardings and the jitted
step. `train` runs it; `dry_run` compiles the step on abstract arrays and reports per-device memory."""

from __future__ import annotations

import copy
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from xpress_jax import sharding
from xpress_jax.errors import ConfigError
from xpress_jax.models import kernels
from xpress_jax.models.build import build_target, build_trainable, target_config
from xpress_jax.models.layers import unrolled_loops
from xpress_jax.train import state as st
from xpress_jax.train.step import LossSettings, make_train_step


def loss_settings(config) -> LossSettings:
    t = config.train
    s = LossSettings.from_config(t)
    if s.dloop > 0 and tuple(t.heads):
        raise ConfigError("D-Loop trains the drafter alone: set train.heads=() with train.loss.dloop > 0")
    return s


def place(params: dict, axes: dict, mesh) -> tuple[dict, dict]:
    shardings = st.param_shardings(axes, {k: v.shape for k, v in params.items()}, mesh)
    if isinstance(next(iter(params.values())), jax.ShapeDtypeStruct):
        placed = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in params.items()}
    else:
        placed = {k: jax.device_put(v, shardings[k]) for k, v in params.items()}
    return placed, shardings


def refuse_uneven_mesh(config) -> None:
    """The config's mesh, refused in one line when it cannot split the batch, the heads, the
    vocabulary or the widths (`sharding.refuse_uneven_splits`). Training and dry runs check it;
    reading a run's checkpoints (export) on other devices need not."""
    sharding.refuse_uneven_splits(sharding.make_mesh(tuple(config.mesh.shape)), split_sizes(config))


def split_sizes(config) -> dict[str, tuple[str, int]]:
    """The config fields the mesh splits, with their logical axes (`sharding.refuse_uneven_splits`)."""
    arch = target_config(config)
    return {"train.batch_size": ("batch", config.train.batch_size),
            "target.arch.num_attention_heads": ("heads", arch.num_attention_heads),
            "target.arch.vocab_size": ("vocab", arch.vocab_size),
            "target.arch.intermediate_size": ("mlp", arch.intermediate_size),
            "target.arch.hidden_size": ("embed", arch.hidden_size)}


def total_steps(config, num_records: int | None) -> int:
    t = config.train
    if t.steps > 0:
        return t.steps
    if not num_records:
        raise ConfigError("train.steps is 0 and the data size is unknown: set train.steps")
    return max(1, math.ceil(t.epochs * num_records / t.batch_size))


class Setup:
    """Everything the loop needs, built once (shared by train and dry_run)."""

    def __init__(self, config, *, abstract: bool, num_records: int | None = None):
        self.config = config
        self.mesh = sharding.make_mesh(tuple(config.mesh.shape))
        target = build_target(config, mesh=self.mesh, abstract=abstract, scan=True)
        trainable = build_trainable(config, target.cfg, abstract=abstract)
        trainable.drafter.cfg.check_target(target.cfg)
        self.drafter_cfg = trainable.drafter.cfg
        self.graphdef, params = st.split_params(trainable)
        self.target_graphdef, target_params = st.split_params(target)
        self.params, self.param_sharding = place(params, st.flat_axes(trainable), self.mesh)
        self.target_params, self.target_sharding = place(target_params, st.flat_axes(target), self.mesh)
        # the schedule's length does not change the compiled step, so a dry run needs no data size
        self.steps = 1 if abstract and not config.train.steps else total_steps(config, num_records)
        self.schedule = st.make_schedule(config.train, self.steps)
        labels = st.trainable_labels(self.params, config.train.trainable)
        self.tx = st.make_optimizer(config.train, self.steps, labels)
        replicated = NamedSharding(self.mesh, P())
        abstract_state = jax.eval_shape(lambda p: st.init_state(p, self.tx, config.seed), self.params)
        self.state_sharding = {
            "step": replicated, "params": self.param_sharding, "key": replicated, "bad_steps": replicated,
            "opt_state": st.opt_state_shardings(self.tx, abstract_state["opt_state"], self.param_sharding, self.mesh)}
        self.abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                           abstract_state, self.state_sharding)
        self.batch_sharding = NamedSharding(self.mesh, sharding.logical_to_spec(
            ("batch", None), (config.train.batch_size, 1), self.mesh))
        frozen = frozenset(k for k, label in labels.items() if label == "freeze")
        step = make_train_step(self.graphdef, self.target_graphdef, self.tx, self.schedule, loss_settings(config),
                               frozen)
        step = sharding.with_activations_on(self.mesh, step)
        self.step = jax.jit(step, in_shardings=(self.state_sharding, self.target_sharding, self.batch_sharding),
                            out_shardings=(self.state_sharding, None), donate_argnums=(0,))

    def init_state(self):
        return jax.jit(lambda p: st.init_state(p, self.tx, self.config.seed), out_shardings=self.state_sharding)(
            self.params)

    def abstract_batch(self):
        shape = (self.config.train.batch_size, self.config.data.max_len)
        return {"ids": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=self.batch_sharding),
                "loss_mask": jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=self.batch_sharding)}

    def global_batch(self, local: dict) -> dict:
        t = self.config.train
        shape = (t.batch_size, self.config.data.max_len)
        return {k: jax.make_array_from_process_local_data(self.batch_sharding, np.asarray(v), shape)
                for k, v in local.items()}


def peak_bytes(mem) -> int:
    """A compiled program's peak per device from its memory analysis: arguments and outputs (less
    the donated buffers they share) and temporaries."""
    return mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes


def compiled_flops(compiled) -> float | None:
    """XLA's flop count of a compiled program, per device for a partitioned one (a dict, or a list
    of one per program in older jax; None where the backend does not count)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    flops = (analysis or {}).get("flops")
    return float(flops) if flops is not None else None


def largest_f32_bytes(hlo_text: str, axis_size: int, except_shape: tuple[int, ...] = ()) -> int:
    """Bytes of the largest f32 array in a compiled program's HLO that has an axis of `axis_size`,
    other than arrays of `except_shape` (in any axis order). Arrays inside fusions count too, so
    this bounds what a device holds at once."""
    shapes = [tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"f32\[([\d,]+)\]", hlo_text)]
    return 4 * max((math.prod(s) for s in shapes if axis_size in s and sorted(s) != sorted(except_shape)), default=0)


# With the anchors in one unrolled chunk, XLA's CSE can merge the forward pass's target logits (p^t)
# with their rematerialisation in the backward pass, which the running step (forward and backward
# in separate loops) cannot. It does so on one device and not on a mesh, which at 8B shapes would
# read as 6% of the work repeated on every device. FLOPs are counted with CSE off in every program.
FLOPS_COUNTING = {"xla_disable_hlo_passes": "cse"}


def compile_step(config, compiler_options: dict | None = None):
    """The train step compiled on abstract arrays (no weights, no data): (Setup, compiled)."""
    setup = Setup(config, abstract=True)
    lowered = setup.step.lower(setup.abstract_state, setup.target_params, setup.abstract_batch())
    return setup, lowered.compile(compiler_options=compiler_options)


def fused_attention(config, platform: str) -> list[str]:
    """The fused attention kernels (`models.kernels`) in the train step lowered for `platform`, read
    from the lowered program's text: on this backend as it compiles, elsewhere through jax.export
    (a TPU program lowers from any host; cuDNN's kernel lowers only with a GPU present)."""
    with kernels.lowering_for(platform):
        setup = Setup(config, abstract=True)  # traced anew: jit's trace cache does not key on the platform
        args = (setup.abstract_state, setup.target_params, setup.abstract_batch())
        if platform == jax.default_backend():
            text = setup.step.lower(*args).as_text()
        else:
            text = jax.export.export(setup.step, platforms=[platform])(*args).mlir_module()
    return kernels.kernels_in(text)


def dry_run(config, *, model_flops: float | None = None, platforms=("tpu",), progress=lambda partial: None) -> dict:
    """Compiles the train step on abstract arrays and reports, per device: argument, output,
    temporary and peak memory, and XLA's FLOPs. The same step compiled for one device gives the
    step's model FLOPs (forward of the target, forward and backward of the drafter and heads,
    the update), and `flops_ratio` = per-device FLOPs * devices / model FLOPs: 1 when the mesh
    splits the work, up to the device count when every device repeats it. Memory comes from the
    step as it runs; FLOPs from the same step with its loops unrolled and its anchors in one
    chunk (the same work), since XLA counts a loop body once, and with CSE off
    (`FLOPS_COUNTING`). A caller that knows the model FLOPs passes them and saves the one-device
    compile. `largest_vocab_f32_bytes` is at most `chunk_logits_bytes` when no f32 logits beyond
    one anchor chunk's are held. `fused_attention`: per platform (this backend and `platforms`),
    the fused attention kernels the step's lowered program holds. `progress(report so far)` after
    each compile, so a run cut short keeps what it measured."""
    refuse_uneven_mesh(config)
    setup, compiled = compile_step(config)
    mem = compiled.memory_analysis()
    gib = lambda b: round(b / 2**30, 3)  # noqa: E731
    devices = int(np.prod(list(setup.mesh.shape.values())))
    report = {"backend": jax.default_backend(), "devices": devices, "mesh": dict(setup.mesh.shape),
              "batch_size": config.train.batch_size, "max_len": config.data.max_len,
              "trainable_params": int(sum(math.prod(v.shape) for v in setup.params.values())),
              "target_params": int(sum(math.prod(v.shape) for v in setup.target_params.values()))}
    if mem is not None:
        report.update(argument_gib=gib(mem.argument_size_in_bytes), output_gib=gib(mem.output_size_in_bytes),
                      alias_gib=gib(mem.alias_size_in_bytes), temp_gib=gib(mem.temp_size_in_bytes),
                      peak_gib=gib(peak_bytes(mem)))
    # the losses hold f32 [tokens, vocab] arrays of one anchor chunk at a time: the largest such
    # array in the program against one chunk's logits [local batch, chunk, n, local vocab]. The
    # [vocab, hidden] output projection is a weight, not logits (the CPU compiler upcasts it to f32).
    t, mesh, arch = config.train, setup.mesh.shape, target_config(config)
    local_vocab = arch.vocab_size // mesh["tensor"]
    rows = t.batch_size // (mesh["data"] * mesh["fsdp"]) * min(t.anchor_chunk, t.num_anchors) \
        * (setup.drafter_cfg.block_size - 1)
    report.update(chunk_logits_bytes=4 * rows * local_vocab,
                  largest_vocab_f32_bytes=largest_f32_bytes(compiled.as_text(), local_vocab,
                                                            except_shape=(local_vocab, arch.hidden_size)))
    progress(report)
    report["fused_attention"] = {p: fused_attention(config, p) for p in dict.fromkeys((jax.default_backend(),
                                                                                      *platforms))}
    progress(report)
    counted = copy.deepcopy(config)
    with counted.unlocked():
        counted.train.anchor_chunk = config.train.num_anchors
    with unrolled_loops():
        flops = compiled_flops(compile_step(counted, FLOPS_COUNTING)[1])
    progress({**report, "flops_per_device": flops})
    if model_flops is None:
        one_device = copy.deepcopy(counted)
        with one_device.unlocked():
            one_device.mesh.shape = (1, 1, 1)
        with unrolled_loops(), sharding.subset_meshes_expected():
            model_flops = compiled_flops(compile_step(one_device, FLOPS_COUNTING)[1]) if devices > 1 else flops
    report.update(flops_per_device=flops, model_flops=model_flops,
                  flops_ratio=round(flops * devices / model_flops, 3) if flops and model_flops else None)
    return report
