"""The dry run: the train step compiled on abstract arrays (no weights, no data) and read for
per-device memory, FLOPs, the FLOPs ratio to the one-device step, the largest vocabulary-sized
f32 array, and the fused attention kernels its lowered programs hold, per platform."""

from __future__ import annotations

import copy
import math
import re

import jax
from jax.extend import core as jax_core
import numpy as np

from xpress_jax import sharding
from xpress_jax.models import flash_gpu, kernels
from xpress_jax.models.build import target_config
from xpress_jax.models.layers import unrolled_loops
from xpress_jax.train.setup import Setup, refuse_uneven_mesh


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


def compile_step(config, compiler_options: dict | None = None, overridden: frozenset[str] = frozenset()):
    """The train step compiled on abstract arrays (no weights, no data): (Setup, compiled, lowered)."""
    setup = Setup(config, abstract=True, overridden=overridden)
    lowered = setup.step.lower(setup.abstract_state, setup.target_params, setup.abstract_batch())
    return setup, lowered.compile(compiler_options=compiler_options), lowered


def _trace_for(config, platform: str, overridden: frozenset[str]):
    """The train step traced as for `platform` ("cpu", "tpu", "gpu"): (jaxpr, lowered program text).
    TPU and GPU programs lower from any host through jax.export; cuDNN's kernel only with a GPU
    present, so a GPU program lowered without one holds flash_gpu in its place
    (`kernels.choose_kernel`)."""
    with kernels.lowering_for(platform):
        setup = Setup(config, abstract=True, overridden=overridden)  # traced anew: jit's trace cache does not key on the platform
        args = (setup.abstract_state, setup.target_params, setup.abstract_batch())
        jaxpr = jax.make_jaxpr(setup.step)(*args).jaxpr
        if platform == jax.default_backend():
            text = setup.step.lower(*args).as_text()
        elif platform in kernels.GPU_PLATFORMS:
            text = flash_gpu.lowered_for_cuda(setup.step, *args)
        else:
            text = jax.export.export(setup.step, platforms=[platform])(*args).mlir_module()
    return jaxpr, text


def fused_attention(config, platform: str, overridden: frozenset[str] = frozenset()) -> list[str]:
    """The fused attention kernels (`models.kernels`) in the train step lowered for `platform`, read
    from the lowered program's text."""
    return kernels.kernels_in(_trace_for(config, platform, overridden)[1])


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jax_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax_core.Jaxpr):
                yield item


def _kernel_of(eqn) -> str | None:
    """The fused kernel an equation is (a Pallas call, jax's cuDNN attention), or None."""
    if eqn.primitive.name == "pallas_call":
        name = str(eqn.params.get("name", ""))
        return next((k for k in (kernels.SPLASH, kernels.FLASH_GPU) if name.startswith(k)), f"pallas:{name}")
    return kernels.CUDNN if "dot_product_attention" in eqn.primitive.name else None


def attention_work(jaxpr) -> dict[str, dict]:
    """Per model part (the `kernels.attention_scope` its attention runs in): the FLOPs of the
    attention dot products left to XLA, each counted as often as its scans run it (a while loop's
    body once: the train step has none around attention), and the kernels its attention calls are."""
    parts: dict[str, dict] = {}

    def walk(jaxpr, scope: str, times: int):
        for eqn in jaxpr.eqns:
            name = f"{scope}/{eqn.source_info.name_stack}"
            part = re.search(rf"{kernels.ATTENTION_SCOPE}:(\w+)", name)
            if part:
                entry = parts.setdefault(part.group(1), {"xla_flops": 0.0, "kernels": set()})
                kernel = _kernel_of(eqn)
                if kernel:
                    entry["kernels"].add(kernel)
                    continue
                if eqn.primitive.name == "dot_general":
                    (contracting, _), _ = eqn.params["dimension_numbers"]
                    lhs = eqn.invars[0].aval.shape
                    entry["xla_flops"] += times * 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
                        lhs[d] for d in contracting)
            inner = times * eqn.params["length"] if eqn.primitive.name == "scan" else times
            for sub in _sub_jaxprs(eqn):
                walk(sub, name, inner)

    walk(jaxpr, "", 1)
    return parts


def attention_in_kernels(config, platforms, overridden: frozenset[str] = frozenset()) -> dict:
    """Per platform: the kernels its lowered train step holds (`kernels`), and per model part the
    kernels its attention takes and the share of its attention FLOPs that run in them (`parts`;
    `in_kernels`: the same share over every part). The FLOPs are counted as the einsum program
    (this CPU's) does them, masked scores included; a part's share is 1 less the FLOPs its program
    for that platform leaves to XLA's dot products over the einsum program's."""
    traces = {"cpu": _trace_for(config, "cpu", overridden)}  # the einsum program: every share's reference
    reference = attention_work(traces["cpu"][0])
    total = sum(ref["xla_flops"] for ref in reference.values())
    share = lambda left, whole: round(1.0 - left / whole, 4) if whole else None  # noqa: E731
    report = {}
    for platform in platforms:
        jaxpr, text = traces[platform] if platform in traces else _trace_for(config, platform, overridden)
        work = attention_work(jaxpr)
        parts = {part: {"kernels": sorted(work.get(part, {}).get("kernels", ())),
                        "attention_gflops": round(ref["xla_flops"] / 1e9, 3),
                        "in_kernels": share(work.get(part, {}).get("xla_flops", 0.0), ref["xla_flops"])}
                 for part, ref in sorted(reference.items())}
        left = sum(w["xla_flops"] for w in work.values())
        report[platform] = {"kernels": kernels.kernels_in(text), "parts": parts, "in_kernels": share(left, total)}
        if platform in kernels.GPU_PLATFORMS and not kernels.cudnn_available():
            report[platform]["cudnn"] = "no GPU here: the calls a GPU runs on cuDNN lower as flash_gpu"
    return report


def dry_run(config, *, model_flops: float | None = None, platforms=("tpu", "gpu"), progress=lambda partial: None,
            overridden: frozenset[str] = frozenset()) -> dict:
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
    the fused attention kernels the step's lowered program holds; `attention`: per platform, the
    share of the step's attention FLOPs in kernels, per model part (`attention_in_kernels`). `progress(report so far)` after
    each compile, so a run cut short keeps what it measured."""
    refuse_uneven_mesh(config)
    setup, compiled, lowered = compile_step(config, overridden=overridden)
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
    here = jax.default_backend()
    attention = attention_in_kernels(config, list(dict.fromkeys((here, *platforms))), overridden)
    report["fused_attention"] = {p: a["kernels"] for p, a in attention.items()}
    report["attention"] = {p: {k: v for k, v in a.items() if k != "kernels"} for p, a in attention.items()}
    progress(report)
    counted = copy.deepcopy(config)
    with counted.unlocked():
        counted.train.anchor_chunk = config.train.num_anchors
    with unrolled_loops():
        flops = compiled_flops(compile_step(counted, FLOPS_COUNTING, overridden)[1])
    progress({**report, "flops_per_device": flops})
    if model_flops is None:
        one_device = copy.deepcopy(counted)
        with one_device.unlocked():
            one_device.mesh.shape = (1, 1, 1)
        with unrolled_loops(), sharding.subset_meshes_expected():
            model_flops = compiled_flops(compile_step(one_device, FLOPS_COUNTING, overridden)[1]) if devices > 1 else flops
    report.update(flops_per_device=flops, model_flops=model_flops,
                  flops_ratio=round(flops * devices / model_flops, 3) if flops and model_flops else None)
    return report
