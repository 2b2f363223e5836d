#!/usr/bin/env bash
# The accelerator measurements as one prepared command (run from the repository root on the device):
# every benchmark suite, written with the device and date to benchmarks/<device>/.
#   heads  the draft step at Qwen3-8B shapes in bfloat16 (the papers' setting), batch 1 and 8
#   train  train-step throughput (tiny config, remat and anchor chunks) and the 8B step's memory
#          on 8 simulated devices (the scaling table's 8-device row; the full table takes minutes)
#   e2e    the tiny reproduction's trained checkpoints, when REPRO_DIR (default runs/repro) holds a
#          finished run: the exports and target/ are about 35 MB, so they can travel with the checkout
set -euo pipefail
# the CUDA jaxlib (a plain install would run on the CPU); offline, the jax already installed
if ! python -m pip install -q -e ".[cuda]"; then
  echo "gpu.sh: pip could not install .[cuda]; using the installed jax" >&2
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python -c "import jax, sys; sys.exit(0 if jax.default_backend() != 'cpu' else 'gpu.sh: jax sees no accelerator')"
device=$(python -c "import jax; print(jax.devices()[0].device_kind.replace(' ', '_'))")
out=benchmarks/${device}
mkdir -p "$out"
python -m xpress_jax.bench --suite=heads --dtype=bfloat16 --reps=20 --out="$out"
python -m xpress_jax.bench --suite=train --train_steps=20 --scaling_devices=8 --out="$out"
repro=${REPRO_DIR:-runs/repro}
if [ -f "$repro/xpress.frozen/DONE.json" ] && [ -f "$repro/dloop+xpress/DONE.json" ]; then
  python -m xpress_jax.bench --suite=e2e --run_dir="$repro" --reps=20 --out="$out"
else
  echo "e2e skipped: $repro holds no finished reproduction (python -m xpress_jax.reproduce)" >&2
fi
date -u +"%Y-%m-%dT%H:%MZ" > "$out/DATE"
