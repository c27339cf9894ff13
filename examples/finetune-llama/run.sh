#!/bin/sh
# examples/finetune-llama/run.sh - fine-tune a Hugging Face Llama with
# dtrain, start to end, in the current folder: a tiny random
# LlamaForCausalLM made here (make_tiny_llama.py, numpy) stands in for a
# downloaded one; `dtrain import` makes it a checkpoint, `dtrain data
# prepare --tokenizer` encodes text with its tokenizer.json, `dtrain run`
# fine-tunes it (config.toml), `dtrain eval` scores the result and `dtrain
# sample --tokenizer` generates text.  A real model runs the same commands
# on its own folder, with config.toml's [model] set to its config.json's
# shape (or `preset`).
#
#   examples/finetune-llama/run.sh [TEXT]    (default: the GPL-3 text)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
text=${1:-/usr/share/common-licenses/GPL-3}
python=${PYTHON:-python3}

"$python" "$here/make_tiny_llama.py" tiny-llama
dtrain import tiny-llama/model.safetensors tiny-llama/config.json tiny-import --overwrite
dtrain data prepare "$text" data/train.bin --val data/val.bin --val-fraction 0.1 \
  --tokenizer "$here/tokenizer.json"
dtrain run "$here/config.toml"
dtrain eval runs/finetune-llama/ckpt --data data/val.bin --config "$here/config.toml"
dtrain sample runs/finetune-llama/ckpt --tokenizer "$here/tokenizer.json" \
  --prompt "This License" --tokens 24 --temperature 0.8 --top-k 40 --seed 1
