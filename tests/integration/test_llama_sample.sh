#!/usr/bin/env bash
# `dtrain sample` of llama checkpoints (plugins/llama/llama_decode.c, the
# KV-cache decoder): a 2-layer byte-level llama (4 query heads sharing 2
# kv heads, untied; and tied with Qwen2's q/k/v biases) trained 400 AdamW
# steps on one rank, then one step more from that checkpoint on one rank,
# on tp2 and on pp2.  Checkpoints are layout-independent, so sample loads
# each layout's as the whole model: greedy generation from the tp2 and pp2
# checkpoints is the one-rank one's, token for token (one step apart from
# the same weights their parameters agree within test_llama.sh's 2e-5; the 400 steps
# are what makes the greedy continuation more than one repeated byte), and
# sampling is seeded.  The numbers (every position's cached logits against
# the full forward, greedy against its argmax) are
# tests/unit/plugins/llama/test_llama_generate.c's; here the command line.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > ll.toml <<T
[run]
comm = "shm"
out_dir = "out"
[model]
arch = "llama"
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 32
intermediate_size = 64
context = 32
[data]
train = "train.bin"
[train]
steps = 400
global_batch = 4
micro_batch = 2
seq_len = 32
lr = 1e-2
warmup_steps = 2
[launch]
timeout = 30.0
[cpu]
threads = 1
T
greedy() { "$bin" sample "$1" --prompt "License" --tokens 20 --temperature 0 --ids 2>&1; }
for variant in untied tied; do
  if [ $variant = tied ]; then
    sed -i 's/^intermediate_size = 64$/intermediate_size = 64\ntie_embeddings = true\nqkv_bias = true/' \
      ll.toml
  fi
  expect_exit 0 "$variant: 1 rank trained" "$bin" run ll.toml --set run.comm=self \
    --set run.name=n1$variant
  expect_exit 0 "$variant: greedy sample of the 1-rank checkpoint" greedy out/n1$variant/ckpt
  n=$(wc -w <<<"$out")
  [ "$n" = 27 ] && ok "$variant: the prompt's 7 ids and 20 more" || bad "$variant: $n ids" "$out"
  # a continuation, not one id repeated
  k=$(tr ' ' '\n' <<<"$out" | tail -20 | sort -u | wc -l)
  [ "$k" -gt 1 ] && ok "$variant: $k distinct ids generated" || bad "$variant: one id" "$out"
  # step 401 from step 400's checkpoint: one rank, tp2, pp2
  for lay in "r1 run.comm=self" "tp2 parallel.tensor=2" "pp2 parallel.pipeline=2"; do
    name=${lay%% *} set=${lay#* }
    cp -r out/n1$variant out/$name$variant
    args=(ll.toml --set "$set" --set run.name=$name$variant --set train.steps=401
          --set checkpoint.resume=latest)
    if if [ $name = r1 ]; then "$bin" run "${args[@]}" >rank0.log 2>&1; else ranks 2 "${args[@]}"; fi
    then ok "$variant: $name: step 401 trained"
    else bad "$variant: $name: step 401 failed" "$(tail -20 rank*.log)"; fi
    expect_exit 0 "$variant: sample of the $name checkpoint" greedy out/$name$variant/ckpt
    if [ $name = r1 ]; then want=$out; continue; fi
    [ "$out" = "$want" ] && ok "$variant: $name's greedy ids are one rank's" ||
      bad "$variant: $name's greedy ids differ from one rank's" "$out
$want"
  done
  a=$("$bin" sample out/tp2$variant/ckpt --tokens 16 --seed 5 --ids 2>&1)
  b=$("$bin" sample out/tp2$variant/ckpt --tokens 16 --seed 5 --ids 2>&1)
  c=$("$bin" sample out/tp2$variant/ckpt --tokens 16 --seed 6 --ids 2>&1)
  [ "$a" = "$b" ] && [ "$a" != "$c" ] && ok "$variant: sampling is the seed's" ||
    bad "$variant: seeds 5, 5, 6 gave" "$a
$b
$c"
done
# the context is the model's: 8 prompt bytes + 25 tokens > 32
expect_exit 2 "prompt + tokens beyond the context" "$bin" sample out/n1tied/ckpt \
  --prompt "the text" --tokens 25
expect_out "names the context" "more than the context of 32 positions"
finish
