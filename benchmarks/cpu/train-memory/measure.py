"""Per-device memory of the Qwen3-8B train step on the meshes of one 8xH200 host and of a v5p-8,
compiled from abstract weights on simulated CPU devices (nothing is allocated), and for each
device the largest batch measured whose peak stays within 80% of its memory.

    python benchmarks/cpu/train-memory/measure.py --out=benchmarks/cpu/train-memory/memory.json

XLA's CPU compiler upcasts bf16 operands to f32, so these peaks bound an accelerator's from above.
"""

import os

os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    + ["--xla_force_host_platform_device_count=8"])
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from xpress_jax import atomic  # noqa: E402
from xpress_jax.cli import config_path, with_overrides  # noqa: E402
from xpress_jax.report.tables import markdown_table  # noqa: E402
from xpress_jax.sharding import subset_meshes_expected  # noqa: E402
from xpress_jax.train.dry_run import compile_step, peak_bytes  # noqa: E402

GIB = 2**30
# device -> (memory per device in bytes, [(mesh, global batch), ...])
DEVICES = {
    "8xH200 (141 GB each)": (141e9, [((1, 8, 1), b) for b in (16, 32, 48, 64, 80, 96)]
                             + [((2, 4, 1), 32), ((1, 4, 2), 32), ((1, 2, 4), 32), ((8, 1, 1), 8)]),
    "v5p-8 (4 chips, 95 GB each)": (95e9, [((1, 4, 1), b) for b in (8, 16, 24, 32, 40)]
                                     + [((1, 2, 2), 16), ((1, 1, 4), 16)]),
}


def measure(config: str, mesh: tuple, batch: int) -> dict:
    point = with_overrides(config, **{"mesh.shape": str(mesh), "train.batch_size": batch})
    t0 = time.perf_counter()
    with subset_meshes_expected():
        mem = compile_step(point)[1].memory_analysis()
    peak = peak_bytes(mem)
    return {"mesh": list(mesh), "batch_size": batch, "argument_gib": round(mem.argument_size_in_bytes / GIB, 2),
            "temp_gib": round(mem.temp_size_in_bytes / GIB, 2), "peak_gib": round(peak / GIB, 2),
            "compile_s": round(time.perf_counter() - t0, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=config_path("qwen3_8b.py"))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    result = {"config": args.config, "devices": {}}
    rows = []
    for device, (memory, points) in DEVICES.items():
        measured = [measure(args.config, mesh, batch) for mesh, batch in points]
        budget_gib = 0.8 * memory / GIB
        fitting = [m for m in measured if m["peak_gib"] <= budget_gib and m["mesh"][2] == 1 and m["mesh"][0] == 1]
        largest = max((m["batch_size"] for m in fitting), default=None)
        result["devices"][device] = {"memory_gib": round(memory / GIB, 1), "budget_80_gib": round(budget_gib, 1),
                                     "largest_fsdp_batch_within_80": largest, "points": measured}
        for m in measured:
            rows.append([device, "(" + ",".join(map(str, m["mesh"])) + ")", m["batch_size"], m["argument_gib"],
                         m["temp_gib"], m["peak_gib"], "yes" if m["peak_gib"] <= budget_gib else "no"])
            print(device, m, flush=True)
    table = markdown_table(["device", "mesh (data,fsdp,tensor)", "global batch", "arguments GiB",
                            "temporaries GiB", "peak GiB", "within 80%"], rows)
    print(table)
    if args.out:
        atomic.write_text(args.out, json.dumps(result, indent=1) + "\n")
        atomic.write_text(os.path.splitext(args.out)[0] + ".md", table + "\n")


if __name__ == "__main__":
    main()
