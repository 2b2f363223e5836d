#!/usr/bin/env bash
# The accelerator checks and measurements as one prepared command, run from the repository root
# on a fresh machine; everything lands in OUT (default benchmarks/gpu/DEVICE), with the date.
#
#   benchmarks/gpu.sh [--dry_run] [--install_only] [--wheels=DIR] [OUT]
#
# The whole run, install included, ends within 600 s (GPU_SH_BUDGET_S), counted from the start.
# First one line: jax's version, backend and devices, python's, and the packages missing
# (benchmarks/gpu_preflight.py). The project runs from this checkout (PYTHONPATH, no build step).
# jax is never reinstalled where it sees an accelerator (an image with jax 0.11 and CUDA 13, say);
# only what is missing is installed, within GPU_SH_INSTALL_S (60 s): from --wheels=DIR alone
# (pip --no-index --find-links DIR: nothing waits on a network), else from the index with short
# timeouts and no retries. Where jax sees no accelerator, jax[cuda12] is added to the list.
# --install_only stops after the install (exit 1 if anything is still missing). Then the stages,
# most important first, each under its own time limit. The limits sum to 530 s, each grounded in
# what this project's 2-core CPU measured at the same shapes (2026-12-06):
#   parity   90 s   the parity tests that matter on a GPU: Qwen3 against transformers, greedy
#                   decoding equal to target-only decoding, the chi-square test of speculative
#                   sampling, the bf16 verify-pass reference (73 s on the CPU, compiles included)
#   decode  120 s   one decode-loop step of DFlash against target-only decoding at Qwen3-8B shapes,
#                   batch 1, a 1,024-token context, on random weights: two 8B loops, which compile in
#                   11-13 s each on the CPU (17-29 s on a slower day; benchmarks/cpu/eval-compile),
#                   then 8B random weights and 3 x 2 timed runs of 64 tokens
#   dry_run  90 s   the Qwen3-8B train step compiled on this backend at batch 2: per-device memory,
#                   FLOPs (three compiles) and the attention kernel; 35 s on the CPU
#   heads    80 s   the draft step at Qwen3-8B shapes in bfloat16, batch 1 and 8, with its roofline
#                   (86 s on the CPU in float32 at one repetition, compiles and runs together)
#   e2e      25 s   the shipped tiny target and DFlash drafter against target-only decoding (eval;
#                   9 s on the CPU at 2 prompts of 16 tokens: tiny programs, the rest is run time)
#   train   125 s   train-step throughput (tiny config), then the 8B step's memory on 8 simulated
#                   devices, which the host's CPU compiles (171 s for the whole stage on the 2-core
#                   CPU under load; the scaling table comes last, the figures before it are kept)
# OUT/stages.jsonl gets one line per stage as it ends (ok, failed, timed_out, or skipped when the
# budget is spent). Each stage writes what it has as it goes (the suites' JSON after each
# measurement with "complete": false, the dry run's after each compile, pytest one line a test),
# so a stage cut by its limit keeps what it finished. --dry_run rehearses on a CPU: nothing is
# installed, OUT defaults to a new temporary directory, the decode, dry_run and heads stages
# compile their real 8B programs on abstract weights (nothing allocated), train compiles the 8B
# step's scaling table on 8 simulated devices after one timed step of each tiny variant, parity
# only collects its tests, and e2e runs as it does on the device (the shipped tiny checkpoints,
# fewer prompts). benchmarks/cpu/gpu-dry-run/ records a whole --dry_run on this CPU;
# GPU_SH_TINY=1 runs every stage at the tiny config's shapes instead (the test suite's plumbing
# check); GPU_SH_LIMIT_SCALE=N multiplies every stage limit (the suite sets 4: its CPU is shared
# with other tests). The exit code is 1 if a stage failed or timed out.
set -uo pipefail
started=$SECONDS  # the budget counts from here, the install included
dry_run=0 install_only=0 wheels=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry_run) dry_run=1 ;;
    --install_only) install_only=1 ;;
    --wheels=*) wheels=${1#--wheels=} ;;
    -*) set -- bad; break ;;
    *) break ;;
  esac
  shift
done
if [ $# -gt 1 ] || [ "${1:-}" = bad ] || { [ -n "$wheels" ] && [ ! -d "$wheels" ]; }; then
  echo "usage: $0 [--dry_run] [--install_only] [--wheels=DIR] [OUT]  (DIR: an existing folder of wheels)" >&2
  exit 2
fi
budget=${GPU_SH_BUDGET_S:-600}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project from this checkout

missing=$(python benchmarks/gpu_preflight.py) || exit 1  # its one line goes to the console
if [ $dry_run = 1 ]; then
  export JAX_PLATFORMS=cpu
  out=${1:-$(mktemp -d)/gpu}
  tiny=configs/tiny.py
else
  if [ -n "$wheels" ]; then
    source=(--no-index --find-links "$wheels")
  else
    source=(--timeout 10 --retries 0)
  fi
  install() {  # install PACKAGE...: within what is left of GPU_SH_INSTALL_S; a failure is reported, not fatal
    local left=$(( ${GPU_SH_INSTALL_S:-60} - (SECONDS - started) ))
    [ "$left" -lt 5 ] && { echo "gpu.sh: no install time left for $*" >&2; return; }
    timeout -k 5 "$left" python -m pip install -q --disable-pip-version-check "${source[@]}" "$@" >&2 \
      || echo "gpu.sh: pip could not install $* (what needs it will fail)" >&2
  }
  # shellcheck disable=SC2086  # one word per package
  [ -n "${missing// /}" ] && install $missing
  if ! python -c "import jax, sys; sys.exit(jax.default_backend() == 'cpu')" 2> /dev/null; then
    install "jax[cuda12]"  # the CUDA jaxlib: a CPU-only or absent jax would measure nothing
  fi
  missing=$(python benchmarks/gpu_preflight.py) || exit 1
  if [ $install_only = 1 ]; then
    [ -z "${missing// /}" ]
    exit $?
  fi
  python -c "import jax, sys; sys.exit(0 if jax.default_backend() != 'cpu' else 'gpu.sh: jax sees no accelerator')" \
    || exit 1
  device=$(python -c "import jax; print(jax.devices()[0].device_kind.replace(' ', '_'))")
  out=${1:-benchmarks/gpu/${device}}
fi
mkdir -p "$out"
python -c "import datetime, jax, json, platform; print(json.dumps({'date': datetime.datetime.now(datetime.timezone.utc)
  .isoformat(timespec='minutes'), 'device': jax.devices()[0].device_kind, 'device_count': jax.device_count(),
  'jax': jax.__version__, 'python': platform.python_version(), 'dry_run': $dry_run == 1}))" > "$out/machine.json"
: > "$out/stages.jsonl"
failed=0

# stage NAME LIMIT_S COMMAND...: runs COMMAND (stdout and stderr to OUT/NAME.log) for at most
# LIMIT_S seconds or what is left of the budget, and records how it ended
stage() {
  local name=$1 limit=$2 status rc t0 left
  shift 2
  left=$((budget - (SECONDS - started)))
  if [ "$left" -lt 20 ]; then
    echo "{\"stage\": \"$name\", \"status\": \"skipped\", \"seconds\": 0}" >> "$out/stages.jsonl"
    echo "gpu.sh: $name skipped, the ${budget} s budget is spent" >&2
    return
  fi
  limit=$((limit * ${GPU_SH_LIMIT_SCALE:-1}))
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status=timed_out; failed=1 ;;
    *) status=failed; failed=1 ;;
  esac
  echo "{\"stage\": \"$name\", \"status\": \"$status\", \"exit_code\": $rc, \"seconds\": $((SECONDS - t0)), \"limit_s\": $limit}" \
    >> "$out/stages.jsonl"
  echo "gpu.sh: $name $status in $((SECONDS - t0)) s (log: $out/$name.log)" >&2
}

parity_tests=(
  tests/test_qwen3.py::test_prefill_logits_and_taps_match_transformers
  tests/test_qwen3.py::test_greedy_generation_equals_hf_generate
  tests/test_speculative.py::test_greedy_equals_target_only_random_models
  tests/test_speculative.py::test_sampling_preserves_the_target_distribution
  tests/test_eval.py::test_the_verify_pass_reference_is_exact_in_bf16
)
target=xpress_jax/assets/tiny/target
dflash=xpress_jax/assets/tiny/dflash
decode_8b=(--suite=decode --decode_config=configs/qwen3_8b.py --contexts=1024 --batches=1 --decode_tokens=64
           --decode_variants=dflash --out="$out")
dry_run_8b=(--config=configs/qwen3_8b.py --dry_run --config.mesh.shape="(1,1,1)" --config.train.batch_size=2
            --dry_run_out="$out/dry_run.json")
if [ $dry_run = 1 ]; then
  # the accelerator run's 8B programs, compiled on abstract weights; GPU_SH_TINY=1 (the test suite)
  # compiles the same stages at the tiny config's shapes, since the 8B ones take the CPU minutes
  decode_dry=("${decode_8b[@]}") dry_run_dry=("${dry_run_8b[@]}") heads_dry=(--dtype=bfloat16)
  scaling=(--scaling_devices=8)
  if [ "${GPU_SH_TINY:-0}" = 1 ]; then
    decode_dry=(--suite=decode --decode_config=$tiny --contexts=128 --batches=1 --decode_tokens=16
                --decode_variants=dflash --out="$out")
    dry_run_dry=(--config=$tiny --dry_run --config.mesh.shape="(1,1,1)" --dry_run_out="$out/dry_run.json")
    heads_dry=(--config=$tiny --batches=2 --context=32)
    scaling=(--config=$tiny --scaling_devices=4)
  fi
  stage parity 90 python -m pytest -q --collect-only "${parity_tests[@]}"
  stage decode 120 python -m xpress_jax.bench "${decode_dry[@]}" --compile_only
  stage dry_run 90 python -m xpress_jax.train "${dry_run_dry[@]}"
  stage heads 80 python -m xpress_jax.bench --suite=heads "${heads_dry[@]}" --compile_only --out="$out"
  stage e2e 25 python -m xpress_jax.eval --config=configs/tiny_heads.py --config.target.hf_dir=$target \
    --checkpoint=$dflash --decoders=dflash --datasets=gsm8k --num_prompts=2 --max_new_tokens=16 \
    --config.eval.iteration_sweep="()" --config.eval.time_split=false --check_lossless --out="$out/e2e"
  stage train 125 python -m xpress_jax.bench --suite=train --train_config=$tiny --train_steps=1 \
    --anchor_chunks=4 --frozen_heads=markov "${scaling[@]}" --out="$out"
else
  stage parity 90 python -m pytest -v "${parity_tests[@]}"
  stage decode 120 python -m xpress_jax.bench "${decode_8b[@]}" --reps=3
  stage dry_run 90 python -m xpress_jax.train "${dry_run_8b[@]}"
  stage heads 80 python -m xpress_jax.bench --suite=heads --dtype=bfloat16 --reps=20 --out="$out"
  stage e2e 25 python -m xpress_jax.eval --config=configs/tiny_heads.py --config.target.hf_dir=$target \
    --checkpoint=$dflash --decoders=dflash --datasets=gsm8k --num_prompts=16 --max_new_tokens=256 \
    --config.eval.time_split=false --check_lossless --out="$out/e2e"
  stage train 125 python -m xpress_jax.bench --suite=train --train_steps=20 --scaling_devices=8 --out="$out"
fi
echo "gpu.sh: done in $((SECONDS - started)) s; $out/stages.jsonl" >&2
exit $failed
