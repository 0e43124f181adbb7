#!/usr/bin/env bash
# Fine-tuning a Hugging Face Llama folder on CPU ranks: tp2 x pp2 through loomrun, starting from
# the folder's weights (checkpoint.init_from, model.args from its config.json with
# model.from_hf), then exported with `loom checkpoint export-hf` and loaded by transformers.
# Usage: examples/llama/finetune_hf.sh [HF_FOLDER] (default: a random tiny Llama made here)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/loom ] && [ -x build/bin/loomrun ] || ./scripts/build
source scripts/torch-env
python=$(loom_torch_python)
out=${LOOM_EXAMPLE_DIR:-runs/examples/llama-hf}
mkdir -p "$out"
hf=${1:-$out/hf-tiny}
[ -n "${1:-}" ] || [ -f "$hf/config.json" ] || "$python" examples/llama/hf_tools.py make-model "$hf"
vocab=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
  "$hf/config.json")
[ -f "$out/tokens.bin" ] ||
  "$python" examples/llama/hf_tools.py make-tokens "$out/tokens.bin" "$vocab"

cat >"$out/finetune.yaml" <<YAML
run: {name: llama-finetune, output_dir: $out/run, steps: 40}
model: {type: llama, from_hf: $hf, args: {seq: 64}}
parallel: {tp: 2, pp: 2, schedule: 1f1b}
batch: {global: 8, micro: 2}
optimizer: {type: adamw, lr: 1.0e-2}
data: {type: tokens, path: $out/tokens.bin}
checkpoint: {init_from: $hf, every: 40}
logging: {every: 10}
YAML
rm -rf "$out/run" "$out/exported"
./build/bin/loomrun --nproc-per-node 4 --master-port 0 ./build/bin/loom train "$out/finetune.yaml"
./build/bin/loom checkpoint export-hf "$out/run/checkpoints" "$out/exported"
"$python" examples/llama/hf_tools.py eval "$hf" "$out/tokens.bin" 64
"$python" examples/llama/hf_tools.py eval "$out/exported" "$out/tokens.bin" 64
