#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: the same command on every worker; jax.distributed finds the
# others from the TPU metadata (train.distributed=true).
#   launch/tpu_pod.sh TPU_NAME ZONE /ckpt/Qwen3-8B /data/regen/data.jsonl gs-or-local-run-dir [extra --config.* flags]
set -euo pipefail
name=$1 zone=$2 target=$3 data=$4 out=$5
shift 5
gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command "
  cd ~/xpress_jax && pip install -q -e . &&
  python -m xpress_jax.train --config=configs/qwen3_8b.py --config.train.distributed=true \
    --config.target.hf_dir=$target --config.data.train_files=\"('$data',)\" --config.train.out_dir=$out \
    --config.mesh.shape='(1,-1,1)' $*"
