#!/bin/sh
# bench/run_comm_vs_mpi.sh - a dtrain communicator beside raw Open MPI:
# `dtrain bench comm --comm COMM` and bench/mpi_allreduce over the same
# sizes and ranks, run in turns (plugin, MPI, plugin, MPI, ...) so machine
# noise hits both alike; then one markdown table with each size's best time
# of both, the plugin's time over MPI's (its best over MPI's best, minus 1:
# the mpi plugin's overhead, or how much faster shm is) and the spread of
# each (slowest / fastest run).  COMM = mpi runs under the same mpirun as
# the MPI program; any other comm (shm, tcp) under dtrain's own launcher.
#
#   bench/run_comm_vs_mpi.sh [BUILD_DIR] [NPROC] [SIZES]
#       BUILD_DIR  cmake build folder (default: build)
#       NPROC      ranks (default: 2)
#       SIZES      MIN:MAX, doubling (default: 4M:256M)
#   environment:
#       DTRAIN_BENCH_COMM=mpi        the dtrain communicator (mpi, shm, tcp)
#       DTRAIN_BENCH_OP=all_reduce   an op both programs know
#       DTRAIN_BENCH_REPEAT=3        rounds (each runs both programs once)
#       DTRAIN_BENCH_ITERS=0         timed calls per size (0: 1 GiB / size)
#       DTRAIN_BENCH_MPIRUN=mpirun   the launcher
#       DTRAIN_BENCH_ARGS=           more options for dtrain bench comm, e.g.
#                                    --sym (all_reduce in place on shm's
#                                    symmetric memory, where ddp keeps its
#                                    gradients)
# As root it adds --allow-run-as-root; --oversubscribe always.  Transport:
# Open MPI's defaults, or what OMPI_MCA_* variables say (in a container
# without ptrace rights: OMPI_MCA_btl_vader_single_copy_mechanism=none).
set -eu
BUILD=${1:-build}
NP=${2:-2}
SIZES=${3:-4M:256M}
COMM=${DTRAIN_BENCH_COMM:-mpi}
OP=${DTRAIN_BENCH_OP:-all_reduce}
REPEAT=${DTRAIN_BENCH_REPEAT:-3}
ITERS=${DTRAIN_BENCH_ITERS:-0}
MPIRUN=${DTRAIN_BENCH_MPIRUN:-mpirun}
EXTRA=${DTRAIN_BENCH_ARGS:-}
DTRAIN="$BUILD/dtrain"
MPI_BIN="$BUILD/bench/mpi_allreduce"
for f in "$DTRAIN" "$MPI_BIN" "$BUILD/plugins-out/dtrain_$COMM.so"; do
    [ -e "$f" ] || { echo "no $f: build dtrain, plugin_$COMM and bench_mpi_allreduce first" >&2; exit 1; }
done
command -v "$MPIRUN" > /dev/null 2>&1 || { echo "no $MPIRUN" >&2; exit 1; }
ROOT=""
[ "$(id -u)" = 0 ] && ROOT="--allow-run-as-root"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# table rows "size time" of one run (comment lines dropped)
rows() { grep -v '^#' | awk 'NF >= 8 { print $1, $5 }'; }

i=0
while [ "$i" -lt "$REPEAT" ]; do
    if [ "$COMM" = mpi ]; then
        # shellcheck disable=SC2086
        "$MPIRUN" $ROOT --oversubscribe -np "$NP" "$DTRAIN" bench comm --comm mpi --op "$OP" \
            --sizes "$SIZES" --iters "$ITERS" $EXTRA | rows >> "$TMP/plugin"
    else
        # shellcheck disable=SC2086
        "$DTRAIN" bench comm --comm "$COMM" --nproc "$NP" --op "$OP" --sizes "$SIZES" \
            --iters "$ITERS" $EXTRA | rows >> "$TMP/plugin"
    fi
    # shellcheck disable=SC2086
    "$MPIRUN" $ROOT --oversubscribe -np "$NP" "$MPI_BIN" --op "$OP" --sizes "$SIZES" \
        --iters "$ITERS" | rows >> "$TMP/mpi"
    i=$((i + 1))
done

# best and worst time per size: "size best worst"
. "$(dirname "$0")/rounds.sh"
span "$TMP/plugin" > "$TMP/p"
span "$TMP/mpi" > "$TMP/m"

echo "# $OP, $NP ranks, $REPEAT interleaved rounds of --comm $COMM${EXTRA:+ $EXTRA} and MPI ($MPIRUN $ROOT --oversubscribe -np $NP)"
echo "| size | $COMM best (us) | spread | MPI best (us) | spread | $COMM / MPI time - 1 | MPI / $COMM time |"
echo "|-----:|-----------------:|-------:|--------------:|-------:|----------------:|-----------------:|"
awk "$AWK_SIZE"'
     NR == FNR { mb[$1] = $2; mw[$1] = $3; next }
     ($1 in mb) { s = $1;
       printf "| %s | %.1f | %.2fx | %.1f | %.2fx | %+.1f %% | %.2fx |\n", size_label(s), $2,
              $3 / $2, mb[s], mw[s] / mb[s], 100 * ($2 / mb[s] - 1), mb[s] / $2 }' "$TMP/m" "$TMP/p"
