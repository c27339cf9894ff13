#!/usr/bin/env bash
# `dtrain run --profile comm`: two ranks (launch.nproc = 2, shm) train a
# tiny model under zero stage 2 and each prints, at the end, its table of
# communicator calls.  Collectives are symmetric, so both ranks must report
# the same calls and bytes for every collective; nothing failed; an unknown
# --profile value is a usage error.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > p.toml <<'T'
[run]
comm = "shm"
out_dir = "out"
[model]
n_layer = 2
n_head = 2
n_embd = 32
context = 32
[data]
train = "train.bin"
[train]
steps = 3
global_batch = 8
seq_len = 32
lr = 3e-3
warmup_steps = 1
[parallel]
data = "zero"
[zero]
stage = 2
[launch]
nproc = 2
timeout = 30.0
[cpu]
threads = 1
T
expect_exit 0 "2 ranks with --profile comm" "$bin" run p.toml --profile comm
expect_out "rank 0 prints its table" "[rank 0] comm profile (rank 0, shm):"
expect_out "rank 1 prints its table" "[rank 1] comm profile (rank 1, shm):"
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
expect_exit 2 "an unknown --profile value" "$bin" run p.toml --profile disk
expect_out "the error names the value" "--profile 'disk': unknown (one of: comm)"
finish
