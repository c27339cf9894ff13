#!/usr/bin/env bash
# `dtrain data prepare --tokenizer` and `dtrain sample --tokenizer` with the
# project's own tokenizer.json fixtures (tests/data/tokenizers; the ids
# themselves are checked against the tokenizers library in
# unit.test_tokenizer):
#  - GPT-2-style BPE (800 ids): uint16 token files with a val split in
#    tokens, the same ids on 1 and 2 threads, a tiny GPT-2 trained on them,
#    and sample encoding the prompt and printing text;
#  - Llama 3-style BPE with an id of 70000: uint32 token files (llm.c's
#    magic 20240801, version 7) that a model of vocab_size 70001 trains on;
#  - refusals: --threads without --tokenizer (exit 2), a tokenizer.json of
#    another model (exit 2, naming the key), a missing one (exit 1), a
#    vocabulary larger than the model's for training (naming the
#    token and the vocab_size: exit 1, as any data error).
set -euo pipefail
bin=$1 work=$2 fix=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
cat "$fix/sample.txt" /usr/share/common-licenses/GPL-3 > text.txt

expect_exit 0 "prepare with the GPT-2-style tokenizer" "$bin" data prepare text.txt tr.bin \
  --tokenizer "$fix/gpt2.json" --val va.bin --val-fraction 0.1 --threads 1
expect_out "... says the vocabulary and the width" "vocab 800, uint16 tokens)"
expect_exit 0 "... again on 2 threads" "$bin" data prepare text.txt tr2.bin \
  --tokenizer "$fix/gpt2.json" --val va2.bin --val-fraction 0.1 --threads 2
if cmp -s tr.bin tr2.bin && cmp -s va.bin va2.bin; then ok "the same files on 1 and 2 threads"
else bad "1 and 2 threads wrote different token files"; fi
magic=$(od -An -t d4 -N 8 tr.bin | tr -s ' ')
if [ "$magic" = " 20240520 1" ]; then ok "uint16 header (20240520, 1)"; else bad "header: $magic"; fi

cat > t.toml <<'T'
[run]
out_dir = "out"
name = "gpt2tok"
[model]
n_layer = 1
n_head = 2
n_embd = 16
context = 16
vocab_size = 800
[data]
train = "tr.bin"
val = "va.bin"
[train]
steps = 4
global_batch = 4
micro_batch = 2
seq_len = 16
lr = 1e-2
warmup_steps = 1
[checkpoint]
every = 0
[cpu]
threads = 1
T
expect_exit 0 "a GPT-2 of vocab 800 trains on them" "$bin" run t.toml
expect_exit 0 "sample with the tokenizer" "$bin" sample out/gpt2tok/ckpt \
  --tokenizer "$fix/gpt2.json" --prompt "The GNU General" --tokens 4 --temperature 0
if [ "${out:0:15}" = "The GNU General" ]; then ok "... prints the prompt as text"
else bad "... output does not start with the prompt" "$out"; fi
expect_exit 0 "... --ids prints ids" "$bin" sample out/gpt2tok/ckpt \
  --tokenizer "$fix/gpt2.json" --prompt "T" --tokens 2 --temperature 0 --ids
if grep -qE '^[0-9]+( [0-9]+){2}$' <<<"$out"; then ok "... three ids"; else bad "ids: $out"; fi
expect_exit 1 "a model smaller than the data's vocabulary" "$bin" run t.toml \
  --set run.name=small --set model.vocab_size=100
expect_out "... names the token and the vocab_size" "is outside the vocabulary (vocab_size 100)"

expect_exit 0 "prepare with the Llama 3-style tokenizer" "$bin" data prepare text.txt tr32.bin \
  --tokenizer "$fix/llama3.json"
expect_out "... uint32 tokens" "vocab 70001, uint32 tokens)"
magic=$(od -An -t d4 -N 8 tr32.bin | tr -s ' ')
if [ "$magic" = " 20240801 7" ]; then ok "uint32 header (20240801, 7)"; else bad "header: $magic"; fi
expect_exit 0 "a model of vocab 70001 trains on uint32 tokens" "$bin" run t.toml \
  --set run.name=wide --set model.vocab_size=70001 --set data.train=tr32.bin \
  --set 'data.val=""' --set train.steps=2

expect_exit 2 "--threads without --tokenizer" "$bin" data prepare text.txt x.bin --threads 2
expect_out "... says so" "--threads goes with --tokenizer"
printf '{"model": {"type": "Unigram"}, "normalizer": null}' > unigram.json
expect_exit 2 "a Unigram tokenizer.json" "$bin" data prepare text.txt x.bin --tokenizer unigram.json
expect_out "... names the key" "tokenizer 'unigram.json': model.type: only \"BPE\" is supported, not Unigram"
expect_exit 1 "a missing tokenizer.json" "$bin" data prepare text.txt x.bin --tokenizer none.json
expect_out "... names it" "tokenizer 'none.json': No such file or directory"
[ ! -e x.bin ] && ok "nothing written on failure" || bad "x.bin was written"
finish
