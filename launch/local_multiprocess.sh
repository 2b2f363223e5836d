#!/usr/bin/env bash
# N processes of one command (train, the default, or eval) on one machine (CPU devices),
# coordinated through localhost: a rehearsal of a multi-host run. Extra arguments go to every process.
#   launch/local_multiprocess.sh 2 --config.train.steps=20 --config.train.out_dir=runs/mp
#   launch/local_multiprocess.sh 2 eval --datasets=gsm8k --out=runs/mp_eval
#   launch/local_multiprocess.sh --dry_run 2 ...     # print each process's command, run nothing
# XPRESS_PORT fixes the coordinator port (default: a random free-looking one). Each process sees
# two CPU devices; XLA flags already in XLA_FLAGS are kept.
set -euo pipefail
dry_run=0
if [ "${1:-}" = "--dry_run" ]; then dry_run=1; shift; fi
if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [--dry_run] NUM_PROCESSES [train|eval] [flags of that command...]" >&2
  exit 2
fi
n=$1
shift
module=train
if [ "${1:-}" = train ] || [ "${1:-}" = eval ]; then module=$1; shift; fi
port=${XPRESS_PORT:-$((20000 + RANDOM % 20000))}
pids=()
for ((i = 0; i < n; i++)); do
  env_vars=(XPRESS_COORDINATOR=localhost:$port XPRESS_NUM_PROCESSES=$n XPRESS_PROCESS_ID=$i JAX_PLATFORMS=cpu
            "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=2")
  if [ $dry_run = 1 ]; then
    echo "[process $i] $(printf '%q ' "${env_vars[@]}")python -m xpress_jax.$module $*"
    continue
  fi
  env "${env_vars[@]}" python -m xpress_jax.$module "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
