#!/bin/sh
# bench/bench_ddp.sh - data-parallel scaling of GPT-2 124M training on this
# machine: tokens/s of NPROC ranks (1 thread each, ddp over the shm
# communicator) against one rank with one thread, same micro-batch per
# rank; prints a markdown table and the speed-up (bench/results/ddp.md).
#
#   bench/bench_ddp.sh DTRAIN [options]
#       DTRAIN         the dtrain binary (this script builds nothing)
#   options:
#       --nproc N      ranks of the parallel run (default 2)
#       --threads N    [cpu] threads per rank in both runs (default 1)
#       --steps N      timed steps per run (default 5)
#       --warmup N     untimed steps first (default 1)
#       --repeat N     rounds; each round runs 1 rank, then N ranks, back to
#                      back (alternating, so that a slow spell of a shared
#                      machine hits both alike); each keeps its best round
#                      (default 3)
#       --set K=V      passed on to both runs (any number), e.g.
#                      --set ddp.bucket_cap_mb=50 --set shm.spin_us=0
#       --set2 K=V     passed on to the parallel run only
#       --detail       per-kind kernel time per step of both best rounds
#
# Prints both best rounds, the speed-up best against best, and each
# round's own speed-up with their median.
#
# Each run is bench/bench_gpt2.sh (same folder): engine step_ms from the
# metrics file, GFLOP/s from the engine's FLOPs per token, the outside-
# matmul share from the device profile (--profile device); tokens/s counts
# the tokens of all ranks.  The speed-up is (N-rank tokens/s) / (1-rank tokens/s).
set -eu

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
DTRAIN=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
NPROC=2 THREADS=1 STEPS=5 WARMUP=1 REPEAT=3 SETS="" SETS2="" DETAIL=""
while [ $# -gt 0 ]; do
    case "$1" in
    --nproc) NPROC=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --set) SETS="$SETS --set $2"; shift ;;
    --set2) SETS2="$SETS2 --set $2"; shift ;;
    --detail) DETAIL=--detail ;;
    *) echo "bench_ddp: unknown option $1" >&2; usage ;;
    esac
    shift
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bench_ddp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# one run: bench_gpt2 row (and details) into $TMP/$1.$i
one() {
    tag=$1 np=$2
    shift 2
    # shellcheck disable=SC2086
    "$HERE/bench_gpt2.sh" "$DTRAIN" --threads "$THREADS" --nproc "$np" --steps "$STEPS" \
        --warmup "$WARMUP" --repeat 1 --no-header $DETAIL "$@" > "$TMP/$tag.$i"
    sed -n 1p "$TMP/$tag.$i" >&2
}

i=1
while [ "$i" -le "$REPEAT" ]; do
    # shellcheck disable=SC2086
    one base 1 $SETS
    # shellcheck disable=SC2086
    one par "$NPROC" $SETS $SETS2
    i=$((i + 1))
done

# best round of each: lowest step ms (3rd |-separated field of the row)
best() {
    for f in "$TMP/$1".*; do
        printf '%s %s\n' "$(sed -n 1p "$f" | awk -F'|' '{ gsub(/ /, "", $3); print $3 }')" "$f"
    done | sort -n | sed -n '1s/^[^ ]* //p'
}
B1=$(best base)
BN=$(best par)

echo "| config | step (ms) | tokens/s | GFLOP/s | matmul (ms/step) | outside matmul | busy before runs | load avg at start |"
echo "|:-------|----------:|---------:|--------:|-----------------:|---------------:|-----:|-----:|"
sed -n 1p "$B1"
sed -n 1p "$BN"
T1=$(sed -n 1p "$B1" | awk -F'|' '{ print $4 + 0 }')
TN=$(sed -n 1p "$BN" | awk -F'|' '{ print $4 + 0 }')
echo
awk -v a="$T1" -v b="$TN" -v n="$NPROC" \
    'BEGIN { printf "Speed-up, %d ranks over 1: %.2fx tokens/s (%.0f%% scaling efficiency)\n", n, b / a, 100 * b / a / n }'
# Each round's own speed-up (its N-rank run against the 1-rank run just
# before it, so a slow spell of the machine that spans both cancels out),
# and their median.
j=1 ROUNDS=""
while [ "$j" -le "$REPEAT" ]; do
    r=$(awk -F'|' 'NR == FNR { if (FNR == 1) a = $4; next }
                   FNR == 1 { printf "%.2f", ($4 + 0) / a }' \
        "$TMP/base.$j" "$TMP/par.$j")
    ROUNDS="$ROUNDS $r"
    j=$((j + 1))
done
echo "$ROUNDS" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk -v all="$ROUNDS" '
    { v[NR] = $1 }
    END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
          printf "Per round:%s; median %.2fx\n", all, m }'
if [ -n "$DETAIL" ]; then
    sed -n '2,$p' "$B1"
    sed -n '2,$p' "$BN"
fi
