#!/bin/sh
# bench/run_comm_bench.sh - the shm communicator against Open MPI on this
# machine: both benchmarks over the same sizes and ranks, then one
# side-by-side markdown table (bench/results/comm.md keeps a copy).
#
#   bench/run_comm_bench.sh [BUILD_DIR] [NPROC] [SIZES]
#       BUILD_DIR  cmake build folder with dtrain and the plugins (default: build)
#       NPROC      ranks (default: 2)
#       SIZES      MIN:MAX, doubling (default: 4M:256M)
#   environment:
#       DTRAIN_BENCH_OP=all_reduce   any op both programs know (all_reduce,
#                       all_gather, reduce_scatter, broadcast, reduce)
#       DTRAIN_BENCH_REPEAT=3        runs of each program; the table keeps
#                       each size's best busbw (shared or virtual machines
#                       are noisy)
#       DTRAIN_BENCH_SHM_ARGS=...    extra `dtrain bench comm` arguments
#                       (e.g. --bind, --set shm.spin_us=200)
#       DTRAIN_BENCH_MPIRUN=mpirun   launcher for the MPI program
set -eu
BUILD=${1:-build}
NP=${2:-2}
SIZES=${3:-4M:256M}
OP=${DTRAIN_BENCH_OP:-all_reduce}
REPEAT=${DTRAIN_BENCH_REPEAT:-3}
SHM_ARGS=${DTRAIN_BENCH_SHM_ARGS:-}
MPIRUN=${DTRAIN_BENCH_MPIRUN:-mpirun}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

DTRAIN="$BUILD/dtrain"
MPI_BIN="$BUILD/bench/mpi_allreduce"
[ -x "$DTRAIN" ] || { echo "no $DTRAIN: build the dtrain_cli and plugin_shm targets first" >&2; exit 1; }

# best busbw per size over REPEAT runs of "$@": lines "size time algbw busbw"
best_of() {
    i=0
    while [ "$i" -lt "$REPEAT" ]; do
        "$@" | grep -v '^#' || true
        i=$((i + 1))
    done | awk '{ if (!($1 in b) || $7 > b[$1]) { b[$1] = $7; t[$1] = $5; a[$1] = $6 } }
                END { for (k in b) print k, t[k], a[k], b[k] }' | sort -n
}

echo "# shm: $DTRAIN bench comm --nproc $NP --op $OP --sizes $SIZES $SHM_ARGS (best of $REPEAT)" >&2
# shellcheck disable=SC2086
best_of "$DTRAIN" bench comm --comm shm --nproc "$NP" --op "$OP" --sizes "$SIZES" $SHM_ARGS > "$TMP/shm"

if [ -x "$MPI_BIN" ] && command -v "$MPIRUN" > /dev/null 2>&1; then
    ROOT=""
    [ "$(id -u)" = 0 ] && ROOT="--allow-run-as-root"
    echo "# mpi: $MPIRUN --oversubscribe $ROOT -np $NP $MPI_BIN --op $OP --sizes $SIZES (best of $REPEAT)" >&2
    best_of "$MPIRUN" --oversubscribe $ROOT -np "$NP" "$MPI_BIN" --op "$OP" --sizes "$SIZES" > "$TMP/mpi"
else
    echo "# mpi: $MPI_BIN or $MPIRUN missing, shm only" >&2
    : > "$TMP/mpi"
fi

echo "| size | shm time (us) | shm busbw (GB/s) | MPI time (us) | MPI busbw (GB/s) | shm / MPI |"
echo "|-----:|--------------:|-----------------:|--------------:|-----------------:|----------:|"
awk 'NR == FNR { mt[$1] = $2; mb[$1] = $4; next }
     { s = $1; h = s " B";
       if (s >= 1048576) h = s / 1048576 " MiB"; else if (s >= 1024) h = s / 1024 " KiB";
       if (s in mb) printf "| %s | %.1f | %.2f | %.1f | %.2f | %.1fx |\n", h, $2, $4, mt[s], mb[s], $4 / mb[s];
       else printf "| %s | %.1f | %.2f | - | - | - |\n", h, $2, $4 }' "$TMP/mpi" "$TMP/shm"
