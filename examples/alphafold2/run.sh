#!/usr/bin/env bash
# The Evoformer tiny preset trained on CPU ranks through loomrun under three plans: dynamic
# axial parallelism over 2 ranks, data parallelism over 2, and 2 pipeline stages. Each plan is
# first made and summarised by `loom plan` (no processes), then trained; all three print the
# same losses as one process would. Extra arguments are config overrides for every run
# (e.g. run.steps=10).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/loom ] || ./scripts/build
out=${LOOM_EXAMPLE_DIR:-runs/examples/alphafold2}
config=configs/alphafold2-tiny.yaml

run_plan() {
  local name=$1 ranks=$2
  shift 2
  local args=("$config" "$@" run.output_dir="$out/$name" logging.tensorboard="$out/$name/tensorboard"
    "logging.trace_steps=[2]")
  echo
  echo "== Evoformer tiny, $name on $ranks CPU ranks =="
  rm -rf "${out:?}/$name"  # a run starts over (loom train refuses a directory holding a previous run)
  ./build/bin/loom plan "${args[@]}" --out "$out/$name/plan"
  ./build/bin/loomrun --nproc-per-node "$ranks" --master-port 0 ./build/bin/loom train "${args[@]}" \
    "${EXTRA[@]}"
  echo "plan dump: $out/$name/plan (programs/rank_K.txt, summary.txt)"
  echo "metrics:   $out/$name/metrics.jsonl"
  echo "tensorboard --logdir $out/$name/tensorboard   step 2 measured: $out/$name/trace_step_2.json"
}

EXTRA=("$@")
# DAP: MSA rows split for row attention, columns for column attention; the pair split along
# its first axis for the starting-node ops and its second for the ending-node ops. The
# all-to-alls between them show up in programs/rank_K.txt.
run_plan dap2 2 parallel.policy=dap parallel.tp=2
run_plan dp2 2 parallel.policy=dp parallel.dp=2
run_plan pp2 2 parallel.policy=pp parallel.pp=2
