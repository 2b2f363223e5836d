#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: the same command on every worker; jax.distributed finds the
# coordinator (worker 0) and each process id from the TPU metadata (train.distributed=true).
#   launch/tpu_pod.sh TPU_NAME ZONE /ckpt/Qwen3-8B /data/regen/data.jsonl RUN_DIR [--config.* ...]
#   launch/tpu_pod.sh --dry_run TPU_NAME ZONE TARGET DATA RUN_DIR   # print the commands, run nothing
# A dry run takes the worker count from XPRESS_TPU_WORKERS (default 4, a v5p-32).
set -euo pipefail
dry_run=0
if [ "${1:-}" = "--dry_run" ]; then dry_run=1; shift; fi
if [ $# -lt 5 ]; then
  echo "usage: $0 [--dry_run] TPU_NAME ZONE TARGET_HF_DIR DATA_JSONL RUN_DIR [--config.* flags...]" >&2
  exit 2
fi
name=$1 zone=$2 target=$3 data=$4 out=$5
shift 5
train="python -m xpress_jax.train --config=configs/qwen3_8b.py --config.train.distributed=true \
--config.target.hf_dir=$target --config.data.train_files=\"('$data',)\" --config.train.out_dir=$out \
--config.mesh.shape='(1,-1,1)' $*"
remote="cd ~/xpress_jax && pip install -q -e . && $train"
if [ $dry_run = 1 ]; then
  workers=${XPRESS_TPU_WORKERS:-4}
  echo "gcloud compute tpus tpu-vm ssh $name --zone $zone --worker=all --command \"$remote\""
  for ((i = 0; i < workers; i++)); do
    echo "[worker $i] coordinator=worker 0 (TPU metadata) process_id=$i num_processes=$workers: $remote"
  done
  exit 0
fi
gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command "$remote"
