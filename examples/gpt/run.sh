#!/usr/bin/env bash
# GPT tiny on CPU ranks under three plans, each planned first (no processes) and then trained
# through loomrun: data parallel 2, Megatron tensor parallel 2 with sequence parallelism, and a
# 2-stage 1F1B pipeline.
# Usage: examples/gpt/run.sh [key=value ...]   (extra overrides go to every run)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/loom ] && [ -x build/bin/loomrun ] || ./scripts/build
out=${LOOM_EXAMPLE_DIR:-runs/examples/gpt}

run_plan() {
  local name=$1
  shift
  local dir="$out/$name"
  local args=(configs/gpt-tiny.yaml run.output_dir="$dir" run.steps=20 logging.every=10
    logging.tensorboard="$dir/tensorboard" "logging.trace_steps=[10]" "$@")
  echo
  echo "== GPT tiny, $name =="
  rm -rf "$dir"  # a run starts over (loom train refuses a directory holding a previous run)
  ./build/bin/loom plan "${args[@]}" --out "$dir/plan" | tail -n +2
  ./build/bin/loomrun --nproc-per-node 2 --master-port 0 ./build/bin/loom train "${args[@]}"
  echo "plan dump: $dir/plan (programs/rank_K.txt, summary.txt)   metrics: $dir/metrics.jsonl"
  echo "tensorboard --logdir $dir/tensorboard   step 10 measured: $dir/trace_step_10.json (beside $dir/plan/timeline.json)"
}

run_plan dp2 parallel.dp=2 "$@"
run_plan tp2-sp parallel.tp=2 parallel.sp=true "$@"
run_plan pp2 parallel.pp=2 parallel.schedule=1f1b "$@"
