#!/usr/bin/env bash
# Swin tiny on CPU ranks under three plans, each planned first (no processes) and then trained
# through loomrun: data parallel 2, Megatron tensor parallel 2 (heads and MLP), and window
# parallel 2 (windows of attention, image rows around it, channels on shifted windows).
# Usage: examples/swin/run.sh [key=value ...]   (extra overrides go to every run)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/loom ] && [ -x build/bin/loomrun ] || ./scripts/build
out=${LOOM_EXAMPLE_DIR:-runs/examples/swin}

run_plan() {
  local name=$1
  shift
  local dir="$out/$name"
  local args=(configs/swin-tiny.yaml run.output_dir="$dir" run.steps=10 logging.every=5
    logging.tensorboard="$dir/tensorboard" "logging.trace_steps=[5]" "$@")
  echo
  echo "== Swin tiny, $name =="
  rm -rf "$dir"  # a run starts over (loom train refuses a directory holding a previous run)
  ./build/bin/loom plan "${args[@]}" --out "$dir/plan" | tail -n +2
  ./build/bin/loomrun --nproc-per-node 2 --master-port 0 ./build/bin/loom train "${args[@]}"
  echo "plan dump: $dir/plan (programs/rank_K.txt, summary.txt)   metrics: $dir/metrics.jsonl"
  echo "tensorboard --logdir $dir/tensorboard   step 5 measured: $dir/trace_step_5.json"
}

run_plan dp2 parallel.dp=2 "$@"
run_plan tp2 parallel.tp=2 "$@"
run_plan window2 parallel.policy=window parallel.tp=2 "$@"
echo
echo "Each plan's losses equal the single-device run's (tests: SwinLocalRanks.*)."
