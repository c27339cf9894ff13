#!/usr/bin/env bash
# examples/finetune-llama/run.sh as a user runs it, in a scratch folder
# with this build's dtrain first on PATH: a tiny random Hugging Face
# LlamaForCausalLM made with numpy, `dtrain import`ed, the GPL-3 text
# encoded with the example's tokenizer.json, 200 fine-tuning steps from the
# import, `dtrain eval` and `dtrain sample --tokenizer`.  Checked: the
# import names the llama's shape, the data is BPE ids, training starts
# from the imported weights (step 1's loss is the random model's, near
# ln(1280) = 7.15) and lowers the validation loss, eval gives the run's
# final validation loss, and sample prints the prompt and a continuation.
# Exit 77 (skipped) without numpy in /usr/bin/python3 or where `dtrain
# import` does not read Hugging Face llama folders.
set -euo pipefail
bin=$1 work=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/lib.sh"
bindir=$(cd "$(dirname "$bin")" && pwd)
ex=$src/examples/finetune-llama
rm -rf "$work"; mkdir -p "$work"; cd "$work"
if ! /usr/bin/python3 -c "import numpy" 2>/dev/null; then
  echo "SKIP: make_tiny_llama.py needs numpy in /usr/bin/python3"; exit 77
fi
/usr/bin/python3 "$ex/make_tiny_llama.py" probe >/dev/null
if ! out=$("$bin" import probe/model.safetensors probe/config.json probe-import 2>&1); then
  echo "SKIP: this dtrain import does not read a Hugging Face llama folder: $out"; exit 77
fi
rm -rf probe probe-import

set +e
out=$(PATH="$bindir:$PATH" PYTHON=/usr/bin/python3 sh "$ex/run.sh" 2>&1)
rc=$?
set -e
[ $rc = 0 ] && ok "run.sh runs (exit 0)" || bad "run.sh failed (exit $rc)" "$(tail -30 <<<"$out")"
expect_out "the import names the shape" "(arch=llama n_layer=2 n_head=4 n_kv_head=2 n_embd=64"
expect_out "BPE ids of the tokenizer" "tokenizer.json, vocab 1202"
first=$(grep -o '^step  *1/200 | loss [0-9.]*' <<<"$out" | awk '{ print $NF }')
vals=$(grep -o 'val [0-9.]*' <<<"$out" | awk '{ print $2 }' | tr '\n' ' ')
read -r v1 v2 _ <<<"$vals"
if awk -v f="${first:-0}" 'BEGIN { exit !(f > 6.9 && f < 7.4) }'; then
  ok "step 1 from the imported (random) weights: loss $first"
else bad "step 1's loss '$first', expected near ln(1280) = 7.15" "$(grep '^step' <<<"$out" | head -3)"; fi
if awk -v a="${v1:-0}" -v b="${v2:-9}" 'BEGIN { exit !(b < a) }'; then
  ok "validation loss falls: $v1 at step 100, $v2 at step 200"
else bad "validation loss did not fall: '$vals'"; fi
ev=$(grep -o '^eval: .*loss [0-9.]*' <<<"$out" | awk '{ print $NF }')
if awk -v e="${ev:-0}" -v v="${v2:-1}" 'BEGIN { d = e - v; exit !(d < 1e-4 && d > -1e-4) }'; then
  ok "eval's loss $ev is the run's last validation loss $v2"
else bad "eval's loss '$ev' is not the run's '$v2'" "$(grep '^eval' <<<"$out")"; fi
s=$(tail -n 4 <<<"$out")
case $s in *"This License"?*) ok "sample prints the prompt and a continuation" ;;
  *) bad "sample's output" "$s" ;; esac
finish
