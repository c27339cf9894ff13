#!/usr/bin/env bash
# `dtrain import` / `dtrain export` of Hugging Face LLaMA-family folders
# (plugins/llama/llama_hf.c behind the model table's hf_* slots), with
# folders written by numpy alone (hf_llama.py; the float64 oracle
# tests/reference/llama_ref.py writes model.safetensors and config.json):
#  - three models: GQA (4 query heads on 2 kv heads) untied, one file;
#    Qwen2 (q/k/v biases, head_dim 16 != n_embd / n_head) tied, with
#    rope_theta 500000 and Llama 3.1's rope_scaling, in 3 shards with
#    model.safetensors.index.json; a tied llama with one kv head in 2
#    shards; and the first as MistralForCausalLM (sliding_window null);
#  - each imported: `dtrain eval` of the import on the oracle's tokens
#    gives the oracle's float64 loss within 1e-5 relative; the Qwen2 one
#    also under tensor parallelism (2 ranks, within 1e-6 of one rank);
#  - exported back: the HF folder's tensors bit for bit under HF's names
#    (no lm_head.weight when tied); import(export(x)) is x exactly (the
#    dtrain-layout exports and the second HF export byte for byte);
#  - where torch and transformers import (python3, or $DT_HF_PYTHON),
#    transformers' AutoModelForCausalLM loads each export with the
#    oracle's loss (1e-5) and its greedy continuation; skipped otherwise;
#  - config.json settings dtrain's llama does not compute: refused by name,
#    exit 2, with the value and what dtrain computes; a config no model
#    plugin reads, and weights that do not fit their config, likewise.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
ref=$here/../reference/llama_ref.py
tpy=${DT_HF_PYTHON:-python3}
rm -rf "$work"; mkdir -p "$work"; cd "$work"
hf() { "$py" "$here/hf_llama.py" "$@"; }
# rel_ok A B TOL: |A - B| <= TOL |B|
rel_ok() { awk -v a="$1" -v b="$2" -v t="$3" \
  'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(a != "" && d <= t * m) }'; }
eval_loss() { # CKPT VAL [--set ...]: the loss dtrain eval prints for the tokens
  local ck=$1 val=$2; shift 2
  "$bin" eval "$ck" --data "$val" --set train.seq_len=8 --set train.global_batch=2 \
    --batches 1 "$@" 2>&1 | sed -n 's/.*: loss \([^,]*\),.*/\1/p' | tail -n 1
}
have_torch=0
if "$tpy" -c 'import torch, transformers' 2>/dev/null; then have_torch=1; fi

variant() { # NAME H K HEAD_DIM TIED QKV_BIAS SHARDS [llama_ref.py options]
  local name=$1 H=$2 K=$3 d=$4 tied=$5 qkv=$6 shards=$7; shift 7
  hf make "$name" "$H" "$K" "$d" "$tied" "$qkv"
  expect_exit 0 "$name: the float64 oracle and its HF folder" "$py" "$ref" \
    --params "$name.p.safetensors" --tokens "$name.tok.bin" --out "$name.ref.safetensors" \
    --n-layer 2 --n-head "$H" --n-kv-head "$K" --tied "$tied" --qkv-bias "$qkv" \
    --generate 6 --write-hf-to "hf-$name" "$@"
  if [ "$shards" -gt 1 ]; then hf shard "hf-$name" "$shards"; fi
  expect_exit 0 "$name: import" "$bin" import "hf-$name" "imp-$name"
  want=$(hf loss "$name.ref.safetensors")
  got=$(eval_loss "imp-$name" "$name.val.bin" --set train.micro_batch=2)
  if rel_ok "$got" "$want" 1e-5; then ok "$name: eval loss $got = the oracle's $want (1e-5)"
  else bad "$name: eval loss $got, the oracle's $want" ""; fi
  expect_exit 0 "$name: export" "$bin" export "imp-$name" "exp-$name/model.safetensors"
  if out=$(hf same "hf-$name" "exp-$name" "$tied" 2>&1); then
    ok "$name: the export holds the HF folder's tensors bit for bit ($out)"
  else bad "$name: export differs from the HF folder" "$out"; fi
  "$bin" import "exp-$name" "imp2-$name" >/dev/null
  "$bin" export "imp-$name" "n1-$name.st" --layout dtrain >/dev/null
  "$bin" export "imp2-$name" "n2-$name.st" --layout dtrain >/dev/null
  "$bin" export "imp2-$name" "exp2-$name/model.safetensors" >/dev/null
  if cmp -s "n1-$name.st" "n2-$name.st" &&
     cmp -s "exp-$name/model.safetensors" "exp2-$name/model.safetensors" &&
     cmp -s "exp-$name/config.json" "exp2-$name/config.json"; then
    ok "$name: import(export(x)) is x (weights and config.json byte for byte)"
  else bad "$name: import(export(x)) differs from x" ""; fi
  if [ "$have_torch" = 1 ]; then
    local r tl tg
    r=$("$tpy" "$here/hf_llama.py" torch "exp-$name" "$name.tok.bin" 6 2>/dev/null) || r=""
    tl=$(sed -n 1p <<<"$r") tg=$(sed -n 2p <<<"$r")
    if rel_ok "$tl" "$want" 1e-5; then
      ok "$name: transformers loads the export: loss $tl (oracle $want, dtrain $got)"
    else bad "$name: transformers' loss $tl, the oracle's $want" "$r"; fi
    [ "$tg" = "$(hf gen "$name.ref.safetensors")" ] &&
      ok "$name: transformers' greedy continuation is the oracle's ($tg)" ||
      bad "$name: transformers' greedy continuation" "$tg vs $(hf gen "$name.ref.safetensors")"
  else skip "$name: transformers loads the export" "$tpy has no torch/transformers"; fi
}

variant gqa 4 2 8 0 0 1
variant qwen2 4 2 16 1 1 3 --rope-theta 500000 --rope-scaling \
  '{"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 4}'
grep -q '"architectures":.*"Qwen2ForCausalLM"' <(tr -d '\n\t ' < exp-qwen2/config.json) &&
  ok "q/k/v biases export as a Qwen2ForCausalLM" || bad "qwen2 export's architectures" "$(cat exp-qwen2/config.json)"
variant tied 4 1 8 1 0 2

# after training in dtrain: the gqa import fine-tuned a few steps, exported;
# the export's loss (the float64 oracle on its weights, and transformers'
# where installed) is dtrain's on the trained checkpoint, and not the
# import's (the weights moved)
hf tokens 4000 7 ft.bin
cat > ft.toml <<'T'
[run]
name = "ft"
out_dir = "runs"
comm = "self"
[model]
arch = "llama"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 32
head_dim = 8
intermediate_size = 64
vocab_size = 96
context = 14
tie_embeddings = false
[data]
train = "ft.bin"
[train]
steps = 6
micro_batch = 2
seq_len = 8
lr = 1e-2
warmup_steps = 1
[checkpoint]
resume = "imp-gqa/step-00000000"
[cpu]
threads = 1
T
expect_exit 0 "gqa: fine-tuned from the import" "$bin" run ft.toml
expect_exit 0 "gqa: the trained checkpoint exported" "$bin" export runs/ft/ckpt ft-hf/model.safetensors
hf params ft-hf ft.p.safetensors
expect_exit 0 "gqa: the float64 oracle on the export's weights" "$py" "$ref" \
  --params ft.p.safetensors --tokens gqa.tok.bin --out ft.ref.safetensors \
  --n-layer 2 --n-head 4 --n-kv-head 2 --tied 0 --qkv-bias 0
want=$(hf loss ft.ref.safetensors) before=$(hf loss gqa.ref.safetensors)
got=$(eval_loss runs/ft/ckpt gqa.val.bin --set train.micro_batch=2)
if rel_ok "$got" "$want" 1e-5 && ! rel_ok "$want" "$before" 1e-3; then
  ok "gqa after training: dtrain's loss $got = the export's $want (1e-5; the import's $before)"
else bad "gqa after training: dtrain $got, the export's $want, the import's $before" ""; fi
if [ "$have_torch" = 1 ]; then
  tl=$("$tpy" "$here/hf_llama.py" torch ft-hf gqa.tok.bin 6 2>/dev/null | sed -n 1p) || tl=""
  rel_ok "$tl" "$want" 1e-5 && ok "gqa after training: transformers' loss on the export $tl" ||
    bad "gqa after training: transformers' loss $tl, the oracle's $want" ""
else skip "gqa after training: transformers loads the export" "$tpy has no torch/transformers"; fi

# any layout resumes the import: tensor parallelism over 2 ranks
one=$(eval_loss imp-qwen2 qwen2.val.bin --set train.micro_batch=2)
tp=$(eval_loss imp-qwen2 qwen2.val.bin --set train.micro_batch=2 --set run.comm=shm \
  --set parallel.tensor=2 --nproc 2)
rel_ok "$tp" "$one" 1e-6 && ok "qwen2: the import evaluated at tp2: $tp (one rank $one)" ||
  bad "qwen2 at tp2: $tp, one rank $one" ""

# config.json edits: `cfg NAME KEY=JSON...` writes cfg-NAME/config.json from
# hf-gqa's with the keys set (null deletes), its weights linked
cfg() {
  local name=$1; shift
  mkdir -p "cfg-$name"; ln -sf "$PWD/hf-gqa/model.safetensors" "cfg-$name/model.safetensors"
  "$py" - hf-gqa/config.json "cfg-$name/config.json" "$@" <<'P'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    v = json.loads(v)
    if v is None:
        c.pop(k, None)
    else:
        c[k] = v
json.dump(c, open(sys.argv[2], "w"), indent=2)
P
}
cfg mistral 'architectures=["MistralForCausalLM"]' 'model_type="mistral"' \
  'sliding_window=null'
expect_exit 0 "MistralForCausalLM without a sliding window imports" "$bin" import cfg-mistral imp-m
got=$(eval_loss imp-m gqa.val.bin --set train.micro_batch=2) want=$(hf loss gqa.ref.safetensors)
rel_ok "$got" "$want" 1e-5 && ok "mistral: the oracle's loss ($got)" || bad "mistral loss $got vs $want" ""
cfg v5 'rope_theta=null' 'rope_parameters={"rope_type": "default", "rope_theta": 10000.0}'
expect_exit 0 "transformers 5's rope_parameters import" "$bin" import cfg-v5 imp-v5
refuse() { # NAME MESSAGE-TAIL KEY=JSON...
  local name=$1 msg=$2; shift 2
  cfg "$name" "$@"
  expect_exit 2 "refused: $name" "$bin" import "cfg-$name" "imp-$name"
  expect_out "... naming the key, its value and what dtrain computes" \
    "dtrain import: error: 'cfg-$name/config.json'$msg"
  [ ! -e "imp-$name" ] && ok "... nothing written" || bad "$name: imp-$name written" ""
}
refuse act ': "hidden_act" is "gelu"; dtrain'"'"'s llama computes SwiGLU with "silu"' \
  'hidden_act="gelu"'
refuse attn_bias ': "attention_bias" is true; dtrain'"'"'s llama computes q/k/v biases only as Qwen2 does (Qwen2ForCausalLM), never an o_proj bias' \
  'attention_bias=true'
refuse mlp_bias ': "mlp_bias" is true; dtrain'"'"'s llama computes its MLP without biases' \
  'mlp_bias=true'
refuse yarn ': "rope_scaling" is {"rope_type":"yarn","factor":4}; dtrain'"'"'s llama computes rotary embeddings without scaling ("default") or with Llama 3.1'"'"'s (rope_type "llama3")' \
  'rope_scaling={"rope_type": "yarn", "factor": 4}'
refuse window ': "sliding_window" is 4096; dtrain'"'"'s llama computes full causal attention (sliding_window null)' \
  'architectures=["MistralForCausalLM"]' 'model_type="mistral"' 'sliding_window=4096'
refuse qwen_window ': "use_sliding_window" is true; dtrain'"'"'s llama computes full causal attention' \
  'architectures=["Qwen2ForCausalLM"]' 'model_type="qwen2"' 'use_sliding_window=true'
refuse tp ': "pretraining_tp" is 2; dtrain'"'"'s llama computes each projection as one matmul (pretraining_tp 1)' \
  'pretraining_tp=2'
refuse partial ': "partial_rotary_factor" is 0.5; dtrain'"'"'s llama rotates every channel of a head' \
  'partial_rotary_factor=0.5'
refuse falcon ': "architectures" is ["FalconForCausalLM"], "model_type" is "falcon"; no model plugin reads it' \
  'architectures=["FalconForCausalLM"]' 'model_type="falcon"'
refuse no_layers ' has no "num_hidden_layers": is it a LLaMA-family config.json?' \
  'num_hidden_layers=null'
# weights that do not fit their config: a Qwen2 config has q/k/v biases
cfg qwen 'architectures=["Qwen2ForCausalLM"]' 'model_type="qwen2"'
expect_exit 1 "weights without the config's tensors" "$bin" import cfg-qwen imp-q
expect_out "... names the tensor" \
  "dtrain import: error: importing 'cfg-qwen' into 'imp-q': 'cfg-qwen' has no tensor layers.0.self_attn.q_proj.bias"
finish
