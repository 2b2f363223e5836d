"""Strong and weak scaling of the train step, read from compiled programs on 1, 2, 4 and 8
simulated CPU devices over fsdp meshes: per-device memory (XLA's memory analysis of the step as
it runs) and per-device FLOPs (cost analysis of the same step with its loops unrolled, as
`--dry_run` counts them). Strong: one global batch on every mesh, so ideal per-device FLOPs fall
as 1/devices. Weak: one batch per device, so they stay flat. Wall time on devices that share
two cores means nothing and is not reported.

    python -m xpress_jax.bench.scaling CONFIG [--devices=1,2,4,8]   # prints the JSON
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the simulated devices must exist before jax is imported
    flags_ = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags_ + ["--xla_force_host_platform_device_count=8"])
    os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402

from xpress_jax.report.tables import markdown_table  # noqa: E402

DEVICES = (1, 2, 4, 8)


def scaling(config_path: str, devices=DEVICES) -> dict:
    """{"strong": [...], "weak": [...]}, one row per device count: the step's per-device memory
    and FLOPs, and `flops_vs_ideal` = per-device FLOPs over the one-device FLOPs split evenly
    (1.0: no work repeated). The global batch of the strong rows is the config's, rounded up to
    a multiple of the largest device count; the weak rows give each device that batch's share."""
    from xpress_jax.cli import load_config, with_overrides
    from xpress_jax.decoding.padding import round_up
    from xpress_jax.sharding import subset_meshes_expected
    from xpress_jax.train.dry_run import dry_run
    devices = sorted(devices)
    most = devices[-1]
    strong_batch = round_up(load_config(config_path).train.batch_size, most)
    per_device = strong_batch // most
    out = {"config": config_path, "strong_global_batch": strong_batch, "weak_batch_per_device": per_device,
           "strong": [], "weak": []}
    measured = {}  # (devices, batch) -> row: the weak row at the most devices is the strong one
    for kind, batch_of in (("strong", lambda n: strong_batch), ("weak", lambda n: per_device * n)):
        first_model_flops = None
        for n in devices:
            if (n, batch_of(n)) not in measured:
                point = with_overrides(config_path, **{"mesh.shape": f"(1,{n},1)", "train.batch_size": batch_of(n)})
                # the first row's model FLOPs are compiled for one device; the step's grow with the batch
                model = None if first_model_flops is None else first_model_flops * batch_of(n) / batch_of(devices[0])
                with subset_meshes_expected():
                    r = dry_run(point, model_flops=model, platforms=())  # memory and FLOPs only
                measured[n, batch_of(n)] = {
                    "devices": n, "batch_size": batch_of(n), "argument_gib": r.get("argument_gib"),
                    "temp_gib": r.get("temp_gib"), "peak_gib": r.get("peak_gib"),
                    "flops_per_device": r["flops_per_device"], "model_flops": r["model_flops"],
                    "flops_vs_ideal": r["flops_ratio"]}
            row = measured[n, batch_of(n)]
            first_model_flops = first_model_flops or row["model_flops"]
            out[kind].append(row)
    return out


def scaling_table(result: dict) -> str:
    rows = [[kind, r["devices"], r["batch_size"], f"{r['argument_gib']:.3f}", f"{r['temp_gib']:.3f}",
             f"{r['peak_gib']:.3f}", f"{r['flops_per_device']:.3g}", f"{r['flops_vs_ideal']:.2f}"]
            for kind in ("strong", "weak") for r in result[kind]]
    return markdown_table(["scaling", "devices", "global batch", "arguments GiB", "temporaries GiB", "peak GiB",
                           "FLOPs per device", "FLOPs / ideal"], rows)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--devices=")]
    chosen = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--devices=")), None)
    if len(args) != 1:
        print("usage: python -m xpress_jax.bench.scaling CONFIG [--devices=1,2,4,8]", file=sys.stderr)
        sys.exit(2)
    result = scaling(args[0], tuple(int(d) for d in chosen.split(",")) if chosen else DEVICES)
    print(json.dumps(result))
