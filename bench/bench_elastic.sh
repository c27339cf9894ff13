#!/usr/bin/env bash
# bench/bench_elastic.sh BUILD [REPEAT] - from a node's death to training
# again: an elastic job (`dtrain run --nnodes 2:3`) against a manual
# restart (the job stops; nodes 0 and 1 are started again at once with
# resume = "latest", as a script watching the exit codes would, with no
# human delay).  Three "nodes" of 2 ranks in network namespaces on one
# bridge, comm tcp, the tiny GPT-2 of test_elastic.sh; node 2 killed (every
# process in its namespace) after the checkpoint of step 8.  Root only.
#
# Per run it prints the phases (seconds from the kill):
#   detect   the surviving ranks failed and their launcher reported it
#            (elastic: the restart line; manual: both nodes exited)
#   train    rank 0's first step after the resume
# and the median of REPEAT runs of each, with the load average before.
set -euo pipefail
build=$(realpath "$1") repeat=${2:-3}
bin=$build/dtrain
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; exit 2; }
work=$(mktemp -d /tmp/bench-elastic.XXXXXX)
keep=${DTRAIN_BENCH_KEEP:-}
cd "$work"
nsb=dbe$$b ns=(dbe$$n0 dbe$$n1 dbe$$n2) addr=(10.81.0.1 10.81.0.2 10.81.0.3)
teardown() {
  local p n
  for n in "${ns[@]}" "$nsb"; do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
  [ -n "$keep" ] || rm -rf "$work"
}
trap teardown EXIT
ip netns add "$nsb"
ip -n "$nsb" link add br0 type bridge
ip -n "$nsb" link set br0 up
for i in 0 1 2; do
  ip netns add "${ns[i]}"
  ip link add "dbe$$v$i" type veth peer name "dbe$$p$i"
  ip link set "dbe$$v$i" netns "${ns[i]}"
  ip link set "dbe$$p$i" netns "$nsb"
  ip -n "$nsb" link set "dbe$$p$i" master br0 up
  ip -n "${ns[i]}" addr add "${addr[i]}/24" dev "dbe$$v$i"
  ip -n "${ns[i]}" link set "dbe$$v$i" up
  ip -n "${ns[i]}" link set lo up
done
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > el.toml <<'T'
[run]
comm = "tcp"
out_dir = "out"
[model]
n_layer = 2
n_head = 2
n_embd = 32
context = 32
[data]
train = "train.bin"
[train]
steps = 100000
global_batch = 24
micro_batch = 2
seq_len = 32
lr = 3e-3
[checkpoint]
every = 4
keep = 3
[launch]
timeout = 8.0
[cpu]
threads = 1
T
export DTRAIN_JOB_SECRET
DTRAIN_JOB_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
port=29900
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# wait_for LOG REGEX: until LOG matches (30 s), else the script ends saying so
wait_for() {
  local i
  for ((i = 0; i < 1200; i++)); do grep -qE -- "$2" "$1" 2>/dev/null && return 0; sleep 0.025; done
  echo "timed out waiting for '$2' in $1:" >&2; tail -5 "$1" >&2; exit 1
}
# start I LOG ARGS...: node I in its namespace, in the background
start() {
  local i=$1 log=$2; shift 2
  ip netns exec "${ns[i]}" "$bin" run el.toml --nproc 2 --node-rank "$i" \
    --master-addr "${addr[0]}" --master-port "$port" "$@" >"$log" 2>&1 &
  pid[i]=$!
}
kill_node() { local p; for p in $(ip netns pids "${ns[$1]}"); do kill -KILL "$p" 2>/dev/null || true; done; }
stop_all() { local i; for i in 0 1 2; do kill_node "$i"; done; sleep 0.3; }
pid=()
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
: > elastic.times; : > manual.times
for ((k = 1; k <= repeat; k++)); do
  # ---- elastic ----
  rm -rf out; port=$((port + 4))
  for i in 0 1 2; do start "$i" "e$i.log" --nnodes 2:3 --set run.name=e; done
  wait_for e0.log "checkpoint: saved out/e/ckpt/step-00000008"
  t0=$(now); kill_node 2
  wait_for e0.log "^dtrain: elastic: restart 1 "; t1=$(now)
  n=$( (wait_for e0.log "resumed from" && grep -o 'resumed from [^ ]* (step [0-9]*)' e0.log) | grep -o '[0-9]*)$' | tr -d ')')
  wait_for e0.log "^\[rank 0\] step +$((n + 1))/"; t2=$(now)
  echo "elastic  run $k: detect $(dt "$t0" "$t1") s, train $(dt "$t0" "$t2") s (resumed at step $n)"
  echo "$(dt "$t0" "$t1") $(dt "$t0" "$t2")" >> elastic.times
  stop_all
  # ---- manual: the job stops, nodes 0 and 1 are started again ----
  rm -rf out; port=$((port + 4))
  for i in 0 1 2; do start "$i" "m$i.log" --nnodes 3 --set run.name=m; done
  p0=${pid[0]} p1=${pid[1]}
  wait_for m0.log "checkpoint: saved out/m/ckpt/step-00000008"
  t0=$(now); kill_node 2
  wait "$p0" || true; wait "$p1" || true; t1=$(now)
  port=$((port + 1))
  for i in 0 1; do start "$i" "r$i.log" --nnodes 2 --set run.name=m --set checkpoint.resume=\"latest\"; done
  n=$( (wait_for r0.log "resumed from" && grep -o 'resumed from [^ ]* (step [0-9]*)' r0.log) | grep -o '[0-9]*)$' | tr -d ')')
  wait_for r0.log "^\[rank 0\] step +$((n + 1))/"; t2=$(now)
  echo "manual   run $k: detect $(dt "$t0" "$t1") s, train $(dt "$t0" "$t2") s (resumed at step $n)"
  echo "$(dt "$t0" "$t1") $(dt "$t0" "$t2")" >> manual.times
  stop_all
done
for m in elastic manual; do
  echo "$m: median detect $(cut -d' ' -f1 $m.times | median) s, median train $(cut -d' ' -f2 $m.times | median) s over $repeat runs"
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
