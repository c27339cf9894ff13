#!/usr/bin/env bash
# bench/bench_ckpt_async.sh BUILD [STEPS] [NPROC] [EVERY...] - what a
# checkpoint every EVERY (1 and 5) steps costs per step: no saves,
# synchronous saves (checkpoint.every = EVERY), and asynchronous ones
# (checkpoint.async = true: the shard snapshotted to memory at the step,
# checksummed, written and fsynced by a thread while the next steps train,
# committed at a later step boundary).  With a test build
# (DTRAIN_TEST_HOOKS) also asynchronous saves whose threads run at idle
# priority (DTRAIN_TEST_CKPT_WRITER_PRIORITY=idle: SCHED_IDLE).
# A 4-layer GPT-2 of n_embd 256 (about 3.4M parameters: params, exp_avg and
# exp_avg_sq about 39 MB a save, half of it per rank) in NPROC (2) shm
# ranks on the cpu, STEPS (30) steps.  The time per step is the training
# loop's wall time (rank 0's summary line: every save and the wait for the
# last asynchronous one inside it) over the steps; every run saves at the
# last step (synchronously), so a mode's extra over "no saves" is its
# periodic saves', and the cost per save is that extra times STEPS over
# the number of periodic saves.  DTRAIN_BENCH_REPEAT (5) runs of each,
# interleaved (none, then each mode in turn, ...) so that a busy spell of
# the machine hits all alike; the median and the best are printed, with
# "held": the mean time the training loop spent on a periodic save (an
# asynchronous save line's "training paused": the snapshot, the polls and
# any wait for the threads; a synchronous save line's whole time), the
# time one memcpy of a rank's shard takes here (numpy, out of the caches
# as the training state is at a save), and the load average before,
# during (the highest seen after a run) and after.
set -euo pipefail
build=$(realpath "$1") steps=${2:-30} nproc=${3:-2}
shift $(($# < 3 ? $# : 3))
everies=("$@")
[ ${#everies[@]} -gt 0 ] || everies=(1 5)
bin=$build/dtrain
reps=${DTRAIN_BENCH_REPEAT:-5}
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
hooks=0
case "$("$bin" env 2>/dev/null)" in *"  hooks      test hooks compiled in"*) hooks=1 ;; esac
modes=(none)
for e in "${everies[@]}"; do
  modes+=("sync:$e" "async:$e")
  [ $hooks = 1 ] && modes+=("async-idle:$e")
done
load_before=$(cut -d' ' -f1-3 /proc/loadavg) load_max=0
# one MODE: "ms/step paused_s" of one run (paused_s: mean over its lines, or -)
one() {
  local mode=${1%%:*} every=${1#*:} args=() env=() log t p
  case $mode in
    none) ;;
    sync) args=(--set checkpoint.every="$every") ;;
    async) args=(--set checkpoint.every="$every" --set checkpoint.async=true) ;;
    async-idle) args=(--set checkpoint.every="$every" --set checkpoint.async=true)
                env=(DTRAIN_TEST_CKPT_WRITER_PRIORITY=idle) ;;
  esac
  rm -rf out
  log=$(env "${env[@]}" "$bin" run b.toml --nproc "$nproc" "${args[@]}" 2>&1)
  t=$(sed -n 's/.* tokens in \([0-9.]*\) s .*/\1/p' <<<"$log" | head -1)
  # what the loop spent on each periodic save: an asynchronous line's
  # "training paused", a synchronous one's whole time (not the last's)
  p=$(grep -v "step-$(printf %08d "$steps") " <<<"$log" |
      sed -n -e 's/.*training paused \([0-9.]*\) s).*/\1/p' \
             -e 's/.*checkpoint: saved .* bytes, \([0-9.]*\) s)$/\1/p' |
      awk '{ s += $1; n++ } END { if (n) printf "%.4f", s / n; else print "-" }')
  awk -v t="$t" -v n="$steps" -v p="$p" 'BEGIN { printf "%.2f %s\n", 1000 * t / n, p }'
}
declare -A ms pause
for ((i = 0; i < reps; i++)); do
  for m in "${modes[@]}"; do
    r=$(one "$m")
    t=${r% *} p=${r#* }
    load_max=$(awk -v a="$load_max" -v b="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN { print (b > a) ? b : a }')
    ms[$m]+="$t "
    pause[$m]+="$p "
  done
done
shard=$(du -sb out/dtrain/ckpt/step-$(printf %08d "$steps")/shard-00000.bin | cut -f1)
bytes=$(du -sb out/dtrain/ckpt/step-$(printf %08d "$steps") | cut -f1)
copy=$(/usr/bin/python3 - "$shard" 2>/dev/null <<'P' || echo "?"
import sys, time
import numpy as np
a = np.ones(int(sys.argv[1]) // 4, np.float32); b = np.ones_like(a)
junk = np.ones(64 << 20, np.uint8)  # evicts a and b from the caches between copies
best = 1e9
for _ in range(20):
    junk += 1
    t = time.perf_counter(); np.copyto(b, a); best = min(best, time.perf_counter() - t)
print("%.2f" % (best * 1e3))
P
)
med() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
best() { tr ' ' '\n' | grep . | sort -g | head -1; }
none=$(med <<<"${ms[none]}")
echo "checkpoint of $bytes bytes ($shard bytes in rank 0's shard), $nproc ranks, $steps steps,"
echo "$reps runs of each; one memcpy of a rank's shard: $copy ms"
printf '  %-18s %9s %9s %9s %10s %10s\n' mode "median" "best" "+/step" "per save" "held"
for m in "${modes[@]}"; do
  md=$(med <<<"${ms[$m]}") b=$(best <<<"${ms[$m]}")
  every=${m#*:} n=0
  [ "$m" != none ] && n=$(( (steps - 1) / every ))
  p=$(tr ' ' '\n' <<<"${pause[$m]}" | { grep -v '^-\?$' || true; } | awk '{ s += $1; n++ } END { if (n) printf "%.1f ms", 1000 * s / n; else print "-" }')
  awk -v m="$m" -v md="$md" -v b="$b" -v z="$none" -v n="$n" -v s="$steps" -v p="$p" 'BEGIN {
    d = md - z; per = n ? sprintf("%.1f ms", d * s / n) : "-"
    printf "  %-18s %6.1f ms %6.1f ms %+6.1f ms %10s %10s\n", m, md, b, d, per, p }'
done
echo "# load average before: $load_before; highest after a run: $load_max; after: $(cut -d' ' -f1-3 /proc/loadavg)"
