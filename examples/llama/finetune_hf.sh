#!/usr/bin/env bash
# Fine-tuning a Hugging Face Llama folder on CPU ranks, from text to an exported model:
#   1. text (JSONL) -> `loom data prepare` with the folder's own tokenizer -> indexed datasets
#   2. tp2 x pp2 through loomrun, from the folder's weights (checkpoint.init_from, model.args
#      from its config.json with model.from_hf), validating on the held-out documents
#   3. `loom checkpoint export-hf`, loaded by transformers, whose loss on the held-out windows
#      must equal loom's last val_loss
# Usage: examples/llama/finetune_hf.sh [HF_FOLDER [TRAIN.jsonl HELDOUT.jsonl]]
# (default: a random tiny Llama with a small BPE tokenizer, and English-like text, made here)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/loom ] && [ -x build/bin/loomrun ] || ./scripts/build
source scripts/torch-env
python=$(loom_torch_python)
out=${LOOM_EXAMPLE_DIR:-runs/examples/llama-hf}
steps=${LOOM_EXAMPLE_STEPS:-40}
mkdir -p "$out"
hf=${1:-$out/hf-tiny}
[ -n "${1:-}" ] || [ -f "$hf/config.json" ] || "$python" examples/llama/hf_tools.py make-model "$hf"
train=${2:-$out/text/train.jsonl}
heldout=${3:-$out/text/heldout.jsonl}
[ -n "${2:-}" ] || [ -f "$train" ] || "$python" examples/llama/hf_tools.py make-text "$out/text"

./build/bin/loom data prepare --tokenizer "$hf" --out "$out/train" --no-progress "$train"
./build/bin/loom data prepare --tokenizer "$hf" --out "$out/heldout" --no-progress "$heldout"
./build/bin/loom data inspect "$out/heldout"

seq=64
eval_steps=2
global=8
cat >"$out/finetune.yaml" <<YAML
run: {name: llama-finetune, output_dir: $out/run, steps: $steps}
model: {type: llama, from_hf: $hf, args: {seq: $seq}}
parallel: {tp: 2, pp: 2, schedule: 1f1b}
batch: {global: $global, micro: 2}
optimizer: {type: adamw, lr: 1.0e-2}
data: {type: indexed, path: $out/train}
eval: {every: 10, steps: $eval_steps, data: $out/heldout}
checkpoint: {init_from: $hf, every: $steps}
logging: {every: 10}
YAML
rm -rf "$out/run" "$out/exported"
./build/bin/loomrun --nproc-per-node 4 --master-port 0 ./build/bin/loom train "$out/finetune.yaml"
./build/bin/loom checkpoint export-hf "$out/run/checkpoints" "$out/exported"

# transformers on the exported folder, over the windows loom's validation read: eval.steps
# batches of batch.global samples of seq + 1 tokens, the held-out documents in order.
loom_val=$("$python" -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%.8f" % [r["val_loss"] for r in rows if "val_loss" in r][-1])' "$out/run/metrics.jsonl")
hf_val=$("$python" examples/llama/hf_tools.py eval-indexed "$out/exported" "$out/heldout" "$seq" \
  $((eval_steps * global)))
# Both are float32 forwards of the same weights over the same 1,024 tokens; their sums differ by
# float32 rounding (about 1e-6 relative). 1e-4 leaves two decades, while a window shifted by one
# token or weights one step apart move the loss by 1e-2 or more.
"$python" - "$loom_val" "$hf_val" <<'PY'
import sys
loom, hf = float(sys.argv[1]), float(sys.argv[2])
rel = abs(loom - hf) / hf
print("held-out loss: loom val_loss %.6f, transformers on the export %.6f (relative difference %.2e)"
      % (loom, hf, rel))
sys.exit(0 if rel < 1e-4 else 1)
PY
