#!/usr/bin/env bash
# Llama tiny on CPU ranks under three plans, each planned first (no processes) and then trained
# through loomrun: tensor parallel 2 (query heads split with their kv heads), tensor parallel 2
# with sequence parallelism over 2 data-parallel replicas, and tensor parallel 2 x a 2-stage 1F1B
# pipeline.
# Usage: examples/llama/run.sh [key=value ...]   (extra overrides go to every run)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/loom ] && [ -x build/bin/loomrun ] || ./scripts/build
out=${LOOM_EXAMPLE_DIR:-runs/examples/llama}

run_plan() {
  local name=$1 ranks=$2
  shift 2
  local dir="$out/$name"
  local args=(configs/llama-tiny.yaml run.output_dir="$dir" run.steps=20 logging.every=10 "$@")
  echo
  echo "== Llama tiny, $name =="
  rm -rf "$dir"  # a run starts over (loom train refuses a directory holding a previous run)
  ./build/bin/loom plan "${args[@]}" --out "$dir/plan" | tail -n +2
  ./build/bin/loomrun --nproc-per-node "$ranks" --master-port 0 ./build/bin/loom train "${args[@]}"
  echo "plan dump: $dir/plan (programs/rank_K.txt, summary.txt)   metrics: $dir/metrics.jsonl"
}

run_plan tp2 2 parallel.tp=2 "$@"
run_plan dp2-tp2-sp 4 parallel.dp=2 parallel.tp=2 parallel.sp=true "$@"
run_plan tp2-pp2 4 parallel.tp=2 parallel.pp=2 parallel.schedule=1f1b "$@"
