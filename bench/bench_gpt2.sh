#!/bin/sh
# bench/bench_gpt2.sh - time training steps of GPT-2 124M on the cpu device
# and print one markdown table row: step time, tokens/s, achieved GFLOP/s
# and how much of a step is spent outside matmul (bench/results/gpt2.md).
#
#   bench/bench_gpt2.sh DTRAIN [options]
#       DTRAIN         the dtrain binary to run (this script builds nothing;
#                      its plugins are found the way `dtrain run` finds them)
#   options:
#       --threads N    [cpu] threads per rank (default 2)
#       --nproc N      ranks on this machine (default 1); > 1 uses the
#                      launcher (launch.nproc) and run.comm = "shm"
#       --comm NAME    communicator (default: self for 1 rank, shm for more)
#       --batch B      micro-batch per rank (default 4)
#       --seq T        sequence length (default 64)
#       --steps N      timed steps per run (default 5)
#       --warmup N     untimed steps first (default 1: page faults, caches)
#       --repeat N     runs; the row keeps the run with the lowest mean
#                      step time (default 3)
#       --no-profile   skip the kernel profile (--profile device) and the
#                      outside-matmul column
#       --label TEXT   first column (default "B=.. T=.., N thread(s) x M
#                      rank(s), COMM")
#       --no-header    print the row only
#       --detail       after the row, per-kind kernel ms per step (rank 0)
#       --set K=V      passed on to `dtrain run` (any number)
#       --keep DIR     work in DIR and keep it (default: a temporary folder,
#                      removed at exit)
#
# Step time is the engine's step_ms (metrics file, rank 0), which covers
# forward, backward, the strategy's step and the loss all-reduce, not the
# checkpoint the run writes at its end.  GFLOP/s uses the engine's FLOPs
# per token (plugins/gpt2/gpt2.c: 6 x non-position parameters + 6 L T C, the
# FLOPs behind the run's "mfu") x the tokens of one step over all ranks.
#
# The outside-matmul share: with `dtrain run --profile device:skip=<warm-up>`
# every rank prints, per kernel and device call, its time per forward pass
# (one pass per step here) over whole passes after the warm-up ones, and
# the wall time per pass over the same window (the device interposer's
# profiler, core/interpose/interpose.h); outside matmul = 1 - matmul ms /
# wall ms of rank 0.  Profiling adds two clock reads and a mutex per
# device call (a few hundred calls a step).
#
# Timings are only meaningful on an otherwise idle machine: the row carries
# the highest CPU use (all cores, %) seen in the second before any of its
# runs, and the 1-minute load average when the script started.
set -eu

usage() { sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
DTRAIN=$1
shift
[ -x "$DTRAIN" ] || { echo "bench_gpt2: $DTRAIN is not an executable" >&2; exit 2; }

THREADS=2 NPROC=1 COMM="" B=4 T=64 STEPS=5 WARMUP=1 REPEAT=3 PROFILE=1
LABEL="" HEADER=1 DETAIL=0 KEEP="" SETS=""
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) THREADS=$2; shift ;;
    --nproc) NPROC=$2; shift ;;
    --comm) COMM=$2; shift ;;
    --batch) B=$2; shift ;;
    --seq) T=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --no-profile) PROFILE=0 ;;
    --label) LABEL=$2; shift ;;
    --no-header) HEADER=0 ;;
    --detail) DETAIL=1 ;;
    --set) SETS="$SETS --set $2"; shift ;;
    --keep) KEEP=$2; shift ;;
    *) echo "bench_gpt2: unknown option $1" >&2; usage ;;
    esac
    shift
done
[ -n "$COMM" ] || { [ "$NPROC" -gt 1 ] && COMM=shm || COMM=self; }
[ -n "$LABEL" ] || LABEL="B=$B T=$T, $THREADS thread(s) x $NPROC rank(s), $COMM"

if [ -n "$KEEP" ]; then
    WORK=$KEEP
    mkdir -p "$WORK"
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench_gpt2.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
fi

# Byte tokens (vocab 256) are valid ids of GPT-2's 50257-token vocabulary.
TEXT=/usr/share/common-licenses/GPL-3
[ -r "$TEXT" ] || TEXT="$0"
"$DTRAIN" data prepare "$TEXT" "$WORK/train.bin" > /dev/null

cat > "$WORK/gpt2.toml" << EOF
[run]
name = "bench-gpt2"
out_dir = "$WORK/runs"
comm = "$COMM"
log_every = 1
[model]
arch = "gpt2"
preset = "gpt2-124m"
dtype = "fp32"
[data]
train = "$WORK/train.bin"
[train]
steps = 1
micro_batch = $B
seq_len = $T
warmup_steps = 0
[parallel]
data = "ddp"
[launch]
nproc = $NPROC
[cpu]
threads = $THREADS
[checkpoint]
dir = "$WORK/ckpt"
EOF

# How busy the machine is without us: CPU use over one second before each
# run (our own previous run has exited by then; the 1-minute load average
# would still count it).  The row carries the highest value seen.
MAXBUSY=0
note_busy() {
    # shellcheck disable=SC2046 # the fields of /proc/stat's cpu line
    set -- $(head -1 /proc/stat)
    t0=$(($2 + $3 + $4 + $5 + $6 + $7 + $8 + $9)) i0=$5
    sleep 1
    # shellcheck disable=SC2046
    set -- $(head -1 /proc/stat)
    t1=$(($2 + $3 + $4 + $5 + $6 + $7 + $8 + $9)) i1=$5
    b=$(( t1 > t0 ? 100 * ((t1 - t0) - (i1 - i0)) / (t1 - t0) : 0 ))
    [ "$b" -gt "$MAXBUSY" ] && MAXBUSY=$b
    return 0
}
LOAD0=$(cut -d' ' -f1 /proc/loadavg)

# run_once STEPS PROFILE(0|1) TAG: one training run; metrics in $WORK/TAG.jsonl,
# output in $WORK/TAG.log.  The checkpoint (1.5 GB) is removed at once.
run_once() {
    note_busy
    prof=""
    [ "$2" = 1 ] && prof="--profile device:skip=$WARMUP"
    # shellcheck disable=SC2086
    if ! "$DTRAIN" run "$WORK/gpt2.toml" --set train.steps="$1" $SETS $prof \
        --metrics "$WORK/$3.jsonl" > "$WORK/$3.log" 2>&1; then
        echo "bench_gpt2: run failed (output: $WORK/$3.log):" >&2
        tail -5 "$WORK/$3.log" >&2
        [ -n "$KEEP" ] || cp "$WORK/$3.log" "${TMPDIR:-/tmp}/bench_gpt2_failed.log"
        exit 1
    fi
    rm -rf "$WORK/ckpt" "$WORK/runs"
}

# mean step_ms of the steps after the warm-up
mean_step_ms() {
    awk -v w="$WARMUP" -F'[:,]' '/"step_ms"/ {
            for (i = 1; i < NF; i++) {
                if ($i ~ /"step"$/) s = $(i + 1) + 0
                if ($i ~ /"step_ms"$/) ms = $(i + 1) + 0
            }
            if (s > w) { sum += ms; n++ } }
         END { if (n) printf "%.1f\n", sum / n; else print "nan" }' "$1"
}

# Rank 0's lines of a run's output, without the launcher's "[rank 0] ".
rank0() {
    awk '{ l = $0; if (!sub(/^\[rank 0\] /, "", l) && l ~ /^\[rank [0-9]+\] /) next; print l }' "$1"
}

# "op ms_per_pass" per row of rank 0's device profile table (the indented
# lines after its title; the header row has no number of calls)
prof_table() {
    rank0 "$1" | awk '/^device profile \(/ { t = 1; next }
        t && !/^  / { t = 0 }
        t && $2 ~ /^[0-9]+$/ { print $1, $4 }'
}

# rank 0's wall time per whole pass: "... (N whole; ...): W ms per pass, ..."
prof_pass_ms() {
    rank0 "$1" | awk '/^device profile \(/ && / whole; / {
            for (i = 1; i <= NF; i++) if ($i == "ms" && $(i + 1) == "per") { print $(i - 1); exit } }'
}

TOTAL=$((WARMUP + STEPS))
BEST="" BEST_TAG=""
i=1
while [ "$i" -le "$REPEAT" ]; do
    run_once "$TOTAL" "$PROFILE" "run$i"
    ms=$(mean_step_ms "$WORK/run$i.jsonl")
    echo "bench_gpt2: run $i: mean step $ms ms (steps $((WARMUP + 1))..$TOTAL)" >&2
    if [ -z "$BEST" ] || awk -v a="$ms" -v b="$BEST" 'BEGIN { exit !(a < b) }'; then
        BEST=$ms BEST_TAG=run$i
    fi
    i=$((i + 1))
done

# FLOPs per token as the engine counts them, for gpt2-124m at this T.
L=12 C=768 V=50257 CTX=1024
FLOPS_TOK=$(awk -v L=$L -v C=$C -v V=$V -v X=$CTX -v T="$T" 'BEGIN {
    block = 2*C + 3*C*C + 3*C + C*C + C + 2*C + 4*C*C + 4*C + 4*C*C + C
    n = V*C + X*C + L*block + 2*C
    printf "%.0f\n", 6 * (n - X*C) + 6 * L * T * C }')
TOK_STEP=$((B * T * NPROC))
read -r TOKS GFLOPS << EOF
$(awk -v ms="$BEST" -v tok="$TOK_STEP" -v f="$FLOPS_TOK" \
    'BEGIN { printf "%.1f %.1f\n", tok / (ms / 1e3), f * tok / (ms / 1e3) / 1e9 }')
EOF

MM_MS="-" OUTSIDE="-"
if [ "$PROFILE" = 1 ]; then
    prof_table "$WORK/$BEST_TAG.log" | sort -k2,2 -nr > "$WORK/prof_step"
    PASS_MS=$(prof_pass_ms "$WORK/$BEST_TAG.log")
    if [ ! -s "$WORK/prof_step" ] || [ -z "$PASS_MS" ]; then
        echo "bench_gpt2: no whole-pass profile in $WORK/$BEST_TAG.log (--steps must be >= 2)" >&2
        exit 1
    fi
    read -r MM_MS KERN_MS OUTSIDE << EOF
$(awk -v w="$PASS_MS" '{ k += $2; if ($1 ~ /^matmul_/) m += $2 }
    END { printf "%.1f %.1f %.1f\n", m, k, 100 * (1 - m / w) }' "$WORK/prof_step")
EOF
    OUTSIDE="$OUTSIDE %"
fi

if [ "$HEADER" = 1 ]; then
    echo "| config | step (ms) | tokens/s | GFLOP/s | matmul (ms/step) | outside matmul | busy before runs | load avg at start |"
    echo "|:-------|----------:|---------:|--------:|-----------------:|---------------:|-----:|-----:|"
fi
echo "| $LABEL | $BEST | $TOKS | $GFLOPS | $MM_MS | $OUTSIDE | $MAXBUSY % | $LOAD0 |"

if [ "$DETAIL" = 1 ] && [ "$PROFILE" = 1 ]; then
    echo
    echo "Kernel time per step, $LABEL (rank 0, whole steps after the warm-up of the best run;"
    echo "device calls $KERN_MS ms of $PASS_MS ms wall per step there):"
    echo
    echo "| kind | ms/step | % of step |"
    echo "|:-----|--------:|----------:|"
    awk -v ms="$PASS_MS" '$2 >= 0.05 { printf "| %s | %.1f | %.1f |\n", $1, $2, 100 * $2 / ms }' \
        "$WORK/prof_step"
    awk -v ms="$PASS_MS" -v k="$KERN_MS" \
        'BEGIN { printf "| (outside device calls) | %.1f | %.1f |\n", ms - k, 100 * (ms - k) / ms }'
fi
