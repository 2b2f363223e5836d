#!/usr/bin/env bash
# N processes on one machine (CPU devices), coordinated through localhost: a rehearsal of a
# multi-host run. Extra arguments go to every process.
#   launch/local_multiprocess.sh 2 --config.train.steps=20 --config.train.out_dir=runs/mp
set -euo pipefail
n=$1
shift
port=$((20000 + RANDOM % 20000))
pids=()
for ((i = 0; i < n; i++)); do
  XPRESS_COORDINATOR=localhost:$port XPRESS_NUM_PROCESSES=$n XPRESS_PROCESS_ID=$i JAX_PLATFORMS=cpu \
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m xpress_jax.train "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
