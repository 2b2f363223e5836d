#!/usr/bin/env bash
# The accelerator measurements, as one short script (run from the repository root on the device).
# Writes benchmarks/<device>/heads-*.json and an eval run with tiny random models (a timing check
# of the jitted loop; acceptance needs trained weights).
set -euo pipefail
python -m pip install -q -e . 2>/dev/null || true
device=$(python -c "import jax; print(jax.devices()[0].device_kind.replace(' ', '_'))")
out=benchmarks/${device}
mkdir -p "$out"
python -m xpress_jax.bench heads --reps=20 --out="$out"
python -m xpress_jax.eval --num_prompts=4 --max_new_tokens=64 --check_lossless --out="$out/eval-tiny"
