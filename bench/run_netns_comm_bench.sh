#!/usr/bin/env bash
# `dtrain bench comm --comm mpi` inside one network namespace and across
# two joined by a veth pair (tests/integration/netns_lib.sh: the nodes,
# the launch agent and the Open MPI settings integration.netns_mpi uses):
# one table per layout, 1 node x N ranks against 2 nodes x N/2 ranks.
#
#   bench/run_netns_comm_bench.sh BUILD [RANKS...] [-- BENCH-ARGS...]
#   e.g. bench/run_netns_comm_bench.sh build 2 4 -- --sizes 64K:16M --iters 20
#
# Needs root, `ip netns` and mpirun (exits 77 otherwise, as the test does).
# The namespaces are removed at the end (trap).
set -euo pipefail
build=$(realpath "$1"); shift
counts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do counts+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#counts[@]} -gt 0 ] || counts=(2 4)
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--sizes 64K:16M --iters 20 --warmup 2)
here=$(dirname "$(realpath "$0")")
. "$here/../tests/integration/lib.sh"
. "$here/../tests/integration/netns_lib.sh"
mpiexec=$(command -v mpirun) || { echo "SKIP: no mpirun"; exit 77; }
netns_make
dir=$(mktemp -d)
trap 'netns_teardown; rm -rf "$dir"' EXIT
netns_mpirun_setup "$dir" "$mpiexec"
for n in "${counts[@]}"; do
  for nodes in 1 2; do
    echo "## all_reduce, $n ranks: $nodes node(s) x $((n / nodes)) ranks ($(date -u +%H:%M), load $(cut -d' ' -f1 /proc/loadavg))"
    netns_mpirun 300 "$nodes" $((n / nodes)) "$build/dtrain" bench comm --comm mpi \
      --op all_reduce "${args[@]}"
  done
done
