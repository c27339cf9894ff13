#!/usr/bin/env bash
# `dtrain run --profile`: two ranks (launch.nproc = 2, shm) train a tiny
# model under zero stage 2 with `comm,device` and each prints, at the end,
# its table of communicator calls and its table of device calls.
# Collectives are symmetric, so both ranks must report the same calls and
# bytes for every collective; nothing failed.  One rank with one
# micro-batch per step and `device:skip=1` reports one whole forward pass,
# which is one step (passes 2..2 of 3): the 4 L + 1 = 9 matmuls of a
# 2-layer GPT-2's forward and backward, with FLOP rates; `sync` says so in
# the title; a llama's passes begin at its vocab_embedding_forward.
# Unknown --profile values are usage errors.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer p.toml \
  '[train]' 'steps = 3' 'warmup_steps = 1' \
  '[parallel]' 'data = "zero"' \
  '[zero]' 'stage = 2' \
  '[launch]' 'nproc = 2'
expect_exit 0 "2 ranks with --profile comm,device" "$bin" run p.toml --profile comm,device
expect_out "rank 0 prints its table" "[rank 0] comm profile (rank 0, shm):"
expect_out "rank 1 prints its table" "[rank 1] comm profile (rank 1, shm):"
expect_out "rank 0 prints its device table" "[rank 0] device profile (rank 0, cpu): passes 1..2 of 3 (2 whole; a pass begins at each embedding_forward)"
expect_out "rank 1 prints its device table" "[rank 1] device profile (rank 1, cpu): passes 1..2 of 3"
# "op calls bytes errors" of the collectives, per rank
rows() {
  printf '%s\n' "$out" | grep -F "[rank $1]   " |
    awk '$3 ~ /^(all_reduce|reduce_scatter|all_gather|broadcast)$/ {print $3, $4, $5, $8}'
}
r0=$(rows 0); r1=$(rows 1)
if [ -n "$r0" ] && [ "$r0" = "$r1" ]; then ok "both ranks report the same collectives"
else bad "the ranks' collectives differ" "rank 0:
$r0
rank 1:
$r1"; fi
if printf '%s\n' "$r0" | awk '$1 == "reduce_scatter" && $2 >= 3 && $3 > 0 {f = 1} END {exit !f}'
then ok "zero stage 2 reduce-scatters gradients every step"
else bad "no reduce_scatter row with 3+ calls and bytes" "$r0"; fi
if printf '%s\n' "$r0" | awk '$4 != 0 {exit 1}'; then ok "no collective failed"
else bad "a collective failed" "$r0"; fi

# one rank, one micro-batch per step, the device only, the first pass left
# out
# "calls GFLOP/s errors" of a device row (rank 0's table, no rank prefix)
dev_row() { printf '%s\n' "$out" | awk -v op="$1" '$1 == op && NF == 9 {print $2, $7, $9}'; }
expect_exit 0 "1 rank with --profile device:skip=1" "$bin" run p.toml --set launch.nproc=1 \
  --set run.comm=self --set train.micro_batch=8 --set checkpoint.overwrite=true \
  --profile device:skip=1
expect_out "the table covers step 2" "device profile (rank 0, cpu): passes 2..2 of 3 (1 whole; a pass begins at each embedding_forward)"
for op in matmul_forward matmul_backward; do
  r=$(dev_row $op)
  if printf '%s\n' "$r" | awk '$1 == 9 && $2 + 0 > 0 && $3 == 0 {f = 1} END {exit !f}'
  then ok "$op: 9 calls in the step, a FLOP rate, no errors"
  else bad "$op: expected 9 calls, GFLOP/s > 0, 0 errors" "$out"; fi
done
r=$(dev_row adamw_update)
if printf '%s\n' "$r" | awk '$1 > 0 && $2 == "-" {f = 1} END {exit !f}'
then ok "adamw_update: called, no FLOP rate (memory bound: bytes only)"
else bad "adamw_update row" "$out"; fi
# a llama's forward begins at vocab_embedding_forward: its passes too; a
# 2-layer llama's step has 4 L + 1 = 9 matmuls as GPT-2's (q|k|v fused,
# o_proj, gate|up fused, down_proj; the head)
expect_exit 0 "a llama with --profile device:skip=1" "$bin" run p.toml --set launch.nproc=1 \
  --set run.comm=self --set train.micro_batch=8 --set checkpoint.overwrite=true \
  --set model.arch=llama --set run.name=llama --profile device:skip=1
expect_out "the llama's table covers step 2" "device profile (rank 0, cpu): passes 2..2 of 3 (1 whole; a pass begins at each vocab_embedding_forward)"
r=$(dev_row matmul_forward)
[ "${r%% *}" = 9 ] && ok "llama: matmul_forward 9 calls in the step" ||
  bad "llama: matmul_forward row '$r', expected 9 calls" "$out"
expect_exit 0 "--profile device:sync" "$bin" run p.toml --set launch.nproc=1 \
  --set run.comm=self --set train.micro_batch=8 --set checkpoint.overwrite=true \
  --profile device:sync:skip=1
expect_out "the title says synchronized" "device profile (rank 0, cpu, synchronized): passes 2..2 of 3"

expect_exit 2 "an unknown --profile value" "$bin" run p.toml --profile disk
expect_out "the error names the value" "--profile 'disk': unknown 'disk' (one of: comm, device; e.g. comm,device or device:skip=1:sync)"
expect_exit 2 "an unknown device option" "$bin" run p.toml --profile comm,device:fast
expect_out "the error names the option" "--profile 'comm,device:fast': unknown device option 'fast' (one of: skip=N, sync)"
expect_exit 2 "a skip that is not a number" "$bin" run p.toml --profile device:skip=-1
expect_out "the error names the skip" "--profile 'device:skip=-1': skip=-1: not a whole number of passes"
finish
