#!/usr/bin/env bash
# `dtrain bench comm --comm mpi` inside one network namespace and across
# two joined by a veth pair (tests/integration/netns_lib.sh: the nodes,
# the launch agent and the Open MPI settings integration.netns_mpi uses):
# one table per layout, 1 node x N ranks against 2 nodes x N/2 ranks.
# With DTRAIN_BENCH_COMM=tcp the tcp communicator instead, launched the
# way `dtrain run --nnodes` launches (each node's `dtrain bench comm`
# starts its ranks; no mpirun).
#
#   bench/run_netns_comm_bench.sh BUILD [RANKS...] [-- BENCH-ARGS...]
#   e.g. bench/run_netns_comm_bench.sh build 2 4 -- --sizes 64K:16M --iters 20
#        DTRAIN_BENCH_COMM=tcp bench/run_netns_comm_bench.sh build 4
#
# Needs root, `ip netns` and (for mpi) mpirun (exits 77 otherwise, as the
# tests do).
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
if [ "${DTRAIN_BENCH_COMM:-mpi}" = tcp ]; then
  netns_make
  trap 'netns_teardown' EXIT
  export DTRAIN_JOB_SECRET
  DTRAIN_JOB_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  port=29600
  for n in "${counts[@]}"; do
    for nodes in 1 2; do
      echo "## all_reduce, $n ranks: $nodes node(s) x $((n / nodes)) ranks, tcp ($(date -u +%H:%M), load $(cut -d' ' -f1 /proc/loadavg))"
      port=$((port + 1)) pids=()
      for ((r = nodes - 1; r >= 0; r--)); do
        ns=$ns0; [ $r = 1 ] && ns=$ns1
        timeout -k 2 300 ip netns exec "$ns" "$build/dtrain" bench comm --comm tcp \
          --op all_reduce --nproc $((n / nodes)) --set launch.nnodes=$nodes \
          --set launch.node_rank=$r --set "launch.master_addr=\"$a0\"" \
          --set launch.master_port=$port "${args[@]}" >"/tmp/dtrain-netns-bench.$$.n$r" 2>&1 &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p" || echo "(a node exited $?)"; done
      grep -v '^\[rank\|^dtrain: launching' "/tmp/dtrain-netns-bench.$$.n0"
      rm -f /tmp/dtrain-netns-bench.$$.n*
    done
  done
  exit 0
fi
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
