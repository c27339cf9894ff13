#!/usr/bin/env bash
# bench/bench_ckpt_async.sh BUILD [STEPS] [NPROC] [EVERY] - what a
# checkpoint every EVERY (1) steps costs per step: no saves, synchronous
# saves (checkpoint.every = EVERY),
# and asynchronous ones (checkpoint.async = true: the shard copied to memory
# at the step, written and fsynced by a thread while the next step trains).
# A 4-layer GPT-2 of n_embd 256 (about 3.4M parameters: params, exp_avg and
# exp_avg_sq about 41 MB a save) in NPROC (2) shm ranks on the cpu, STEPS
# (20) steps; the time per step is the training loop's wall time (rank 0's
# summary line: every save inside it) over the steps, the best of
# DTRAIN_BENCH_REPEAT (3) runs of each, interleaved (none, sync, async,
# none, ...) so that a busy spell of the machine hits all three alike.
set -euo pipefail
build=$(realpath "$1") steps=${2:-20} nproc=${3:-2} every=${4:-1}
bin=$build/dtrain
work=$(mktemp -d /tmp/bench-ckpt-async.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > b.toml <<T
[run]
comm = "shm"
out_dir = "out"
[model]
n_layer = 4
n_head = 4
n_embd = 256
context = 64
[data]
train = "train.bin"
[train]
steps = $steps
global_batch = 8
micro_batch = 4
seq_len = 64
lr = 3e-4
[checkpoint]
keep = 2
[cpu]
threads = 1
T
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# one ARGS...: ms per step of one run
one() {
  local t
  rm -rf out
  t=$("$bin" run b.toml --nproc "$nproc" "$@" 2>&1 |
      sed -n 's/.* tokens in \([0-9.]*\) s .*/\1/p' | head -1)
  awk -v t="$t" -v n="$steps" 'BEGIN { printf "%.1f", 1000 * t / n }'
}
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (b == "" || a < b) ? a : b }'; }
none="" sync="" async=""
for ((i = 0; i < ${DTRAIN_BENCH_REPEAT:-3}; i++)); do
  none=$(min "$(one)" "$none")
  sync=$(min "$(one --set checkpoint.every="$every")" "$sync")
  async=$(min "$(one --set checkpoint.every="$every" --set checkpoint.async=true)" "$async")
done
bytes=$(du -sb out/dtrain/ckpt/step-$(printf %08d "$steps") | cut -f1)
echo "checkpoint of $bytes bytes, $nproc ranks, $steps steps, best of ${DTRAIN_BENCH_REPEAT:-3}:"
echo "  no saves            $none ms/step"
echo "  every $every, sync       $sync ms/step (+$(awk -v a="$sync" -v b="$none" 'BEGIN { printf "%.1f", a - b }') ms)"
echo "  every $every, async      $async ms/step (+$(awk -v a="$async" -v b="$none" 'BEGIN { printf "%.1f", a - b }') ms)"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
