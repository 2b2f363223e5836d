"""Seconds to trace + lower and to compile the Qwen3-8B train step on 8 fake CPU devices
((1,8,1) mesh, batch 16), its per-device temporaries and its HLO's length. Run from the
repository root: python benchmarks/cpu/scanned-layers/compile_time.py"""
import json
import os
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
from xpress_jax.cli import with_overrides  # noqa: E402
from xpress_jax.train.setup import Setup  # noqa: E402

config = with_overrides("configs/qwen3_8b.py", **{"mesh.shape": (1, 8, 1), "train.batch_size": 16})
t0 = time.perf_counter()
setup = Setup(config, abstract=True)
t1 = time.perf_counter()
lowered = setup.step.lower(setup.abstract_state, setup.target_params, setup.abstract_batch())
t2 = time.perf_counter()
compiled = lowered.compile()
t3 = time.perf_counter()
mem = compiled.memory_analysis()
print(json.dumps({"setup_s": round(t1 - t0, 1), "lower_s": round(t2 - t1, 1), "compile_s": round(t3 - t2, 1),
                  "temp_gib": round(mem.temp_size_in_bytes / 2**30, 2),
                  "hlo_lines": len(compiled.as_text().splitlines())}))
