#!/usr/bin/env bash
# The tcp communicator's hierarchical all_reduce ([tcp] hierarchical) beside
# its flat ring, 2 nodes x 2 ranks across two network namespaces
# (tests/integration/netns_lib.sh) whose veth link is shaped to RATE (tc
# tbf on both ends), as a real network between machines is slower than the
# loopback inside one.  The flat ring over ranks 0 1 | 2 3 sends 2(n-1)/n =
# 1.5 buffers each way over the link; the three rings send 2(M-1)/M x L =
# 1 (bench/results/comm.md).  Rounds alternate the two, each size's best
# and spread are kept, and one markdown table compares them.
#
#   bench/run_netns_hier_bench.sh BUILD [RATE] [REPEAT] [-- BENCH-ARGS...]
#   e.g. bench/run_netns_hier_bench.sh build 1gbit 3 -- --sizes 1M:16M --iters 5
#
# Needs root and `ip netns` with `tc` (exits 77 otherwise, as the tests do).
# The namespaces are removed at the end (trap).
set -euo pipefail
build=$(realpath "$1"); shift
rate=${1:-1gbit}; [ $# -gt 0 ] && shift
repeat=${1:-3}; [ $# -gt 0 ] && [ "$1" != -- ] && shift
[ $# -gt 0 ] && [ "$1" = -- ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--sizes 1M:16M --iters 5 --warmup 1)
here=$(dirname "$(realpath "$0")")
. "$here/../tests/integration/lib.sh"
. "$here/../tests/integration/netns_lib.sh"
command -v tc >/dev/null || { echo "SKIP: no tc (iproute2)"; exit 77; }
netns_make
tmp=$(mktemp -d)
trap 'netns_teardown; rm -rf "$tmp"' EXIT
ip netns exec "$ns0" tc qdisc add dev "$v0" root tbf rate "$rate" burst 256kb latency 200ms
ip netns exec "$ns1" tc qdisc add dev "$v1" root tbf rate "$rate" burst 256kb latency 200ms
export DTRAIN_JOB_SECRET
DTRAIN_JOB_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=29700

# one 2 x 2 `dtrain bench comm --comm tcp` with hierarchical = $1: rank 0's
# rows "size time(us)" appended to $tmp/$1
run() {
  local pids=() r ns
  port=$((port + 1))
  for r in 1 0; do
    ns=$ns0; [ $r = 1 ] && ns=$ns1
    timeout -k 2 600 ip netns exec "$ns" "$build/dtrain" bench comm --comm tcp \
      --op all_reduce --nproc 2 --set launch.nnodes=2 --set launch.node_rank=$r \
      --set "launch.master_addr=\"$a0\"" --set launch.master_port=$port \
      --set tcp.hierarchical="$1" "${args[@]}" >"$tmp/n$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "a node exited $?" >&2; cat "$tmp"/n*; exit 1; }; done
  grep -v '^#\|^\[rank\|^dtrain' "$tmp/n0" | awk 'NF >= 8 { print $1, $5 }' >> "$tmp/$1"
}

echo "# all_reduce f32, 2 nodes x 2 ranks over tcp, link shaped to $rate each way," \
     "$repeat rounds ($(date -u +%H:%M), load $(cut -d' ' -f1 /proc/loadavg))"
for ((i = 0; i < repeat; i++)); do run true; run false; done
. "$here/rounds.sh"
span "$tmp/true" > "$tmp/h"
span "$tmp/false" > "$tmp/f"
echo "| size | hierarchical best (us) | spread | flat ring best (us) | spread | flat / hierarchical |"
echo "|-----:|------------:|-------:|------------:|-------:|------:|"
awk "$AWK_SIZE"'
     NR == FNR { fb[$1] = $2; fw[$1] = $3; next }
     ($1 in fb) { s = $1;
       printf "| %s | %.0f | %.2fx | %.0f | %.2fx | %.2fx |\n", size_label(s), $2, $3 / $2,
              fb[s], fw[s] / fb[s], fb[s] / $2 }' "$tmp/f" "$tmp/h"
