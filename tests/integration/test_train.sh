#!/usr/bin/env bash
# Single-process training end to end on real text (the GPL-3 licence every
# Debian system ships): the loss falls, a run stopped and resumed from its
# checkpoint reproduces the uninterrupted run's losses bit for bit, and bad
# input (corrupt checkpoint, missing data, context too long) fails clearly.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
expect_exit 0 "data prepare" "$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin
cat > tiny.toml <<'T'
[run]
comm = "self"
out_dir = "out"
log_every = 1
[model]
n_layer = 2
n_head = 2
n_embd = 32
context = 32
[data]
train = "train.bin"
[train]
steps = 8
micro_batch = 4
grad_accum = 2
seq_len = 32
lr = 3e-3
warmup_steps = 2
[cpu]
threads = 1
T
loss() { grep -o '"loss": [^,]*' "$1" | sed -n "${2}p" | cut -d' ' -f2; }
expect_exit 0 "uninterrupted 8-step run" "$bin" run tiny.toml --metrics full.jsonl --set run.name=full
first=$(loss full.jsonl 1); last=$(loss full.jsonl 8)
if awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a - 0.3)}'; then ok "loss falls ($first -> $last)"
else bad "loss did not fall by 0.3 ($first -> $last)"; fi
expect_exit 0 "run stopped after step 4" "$bin" run tiny.toml --metrics part.jsonl \
  --set run.name=part --set train.stop_at=4
expect_exit 0 "resume from the latest checkpoint" "$bin" run tiny.toml --metrics part.jsonl \
  --set run.name=part --set checkpoint.resume=latest
expect_out "resume announced" "resumed from out/part/ckpt/step-00000004"
if diff <(grep -o '"loss": [^,]*' full.jsonl) <(grep -o '"loss": [^,]*' part.jsonl) >/dev/null; then
  ok "resumed losses are bit-identical to the uninterrupted run"
else bad "losses differ after resume" "$(diff <(grep -o '"loss": [^,]*' full.jsonl) <(grep -o '"loss": [^,]*' part.jsonl))"; fi
shard=out/part/ckpt/step-00000008/shard-00000.bin
printf '\xff' | dd of="$shard" bs=1 seek=100 conv=notrunc status=none
expect_exit 1 "a flipped byte in a checkpoint is refused" "$bin" run tiny.toml \
  --set run.name=part --set checkpoint.resume=out/part/ckpt/step-00000008
expect_out "error names the shard file" "shard-00000.bin"
expect_out "error names the tensor" "embedding/params"
expect_out "error says checksum" "checksum mismatch"
expect_exit 1 "missing data file" "$bin" run tiny.toml --set data.train=nope.bin
expect_out "missing data named" "nope.bin"
expect_exit 2 "sequence longer than the context" "$bin" run tiny.toml --set train.seq_len=64
expect_out "context error explains" "longer than the model's context"
expect_exit 2 "batch arithmetic mismatch" "$bin" run tiny.toml --set train.global_batch=10
expect_out "batch error gives the numbers" "micro_batch (4) x grad_accum (2) x data-parallel size (1) = 8, but global_batch = 10"
finish
