# Two "nodes" on one machine: network namespaces joined by a veth pair,
# each with an address of its own, and `dtrain run --nnodes 2 --nproc 2`
# once in each (no mpirun).  What crosses the namespaces is the TCP
# rendezvous (core/launch/rendezvous.c) and, with run.comm = "tcp", the
# training bytes (plugins/tcp).  shm must not pretend to carry them (the
# namespaces share /dev/shm):
#   - the job forms across the link: the ranks of both nodes log one job
#     id, and then comm/shm refuses a job that spans nodes (exit 2)
#   - with the explicit shm.nodes_share_memory opt-in the 2 x 2 job trains,
#     all 4 ranks log the job id under their global rank, and its losses
#     equal the single-node 4-rank run (the global rank numbering end to
#     end; the bytes still move through shm, not over the link)
#   - with comm = tcp the 2 x 2 job trains over the link: its losses equal
#     the single-node 4-rank shm run within 1e-5 (the ring adds the 4
#     ranks' f32 gradients in another order than shm; the max diff is
#     printed), and node 0's veth receives at least the gradient bytes x
#     steps (node 0 must learn node 1's half of every all-reduce) and
#     under 1.25 x that (the hierarchical all_reduce: the flat ring's 4
#     ranks would carry 1.5 x)
#   - a flood on master_port from node 1's side (300 connections held and
#     re-opened) does not stop the job forming, and node 0 logs it in a
#     few lines
#   - a config that differs on node 1 fails every rank, naming ranks 2 and 3
#     and both hashes
#   - the link taken down during the rendezvous: rank 0 names the missing
#     ranks 2 and 3 within the bound; node 1's ranks name rank 0
#   - the same over IPv6 (the rendezvous at MASTER_ADDR fd77::1, the tcp
#     mesh on the nodes' fd77:: addresses): the same losses within 1e-5,
#     and node 0's veth receives the gradient bytes (skipped, with the
#     reason, where the veth pair gets no IPv6 address)
#   - `dtrain bench comm --comm tcp` launched as two nodes gives one
#     4-rank table on node 0, every size checked;
#   - tcp, node 1's ranks killed (SIGKILL, inside ns1) mid-training: node
#     0's ranks fail naming rank 2 or 3 (lost: the connection's EOF or
#     reset) and the operation, its launcher repeats it, and both nodes
#     exit 1 within 10 s (comm timeout 4 s); the checkpoint saved before
#     the kill verifies, unchanged, and a single-node run resumes from it
#   - tcp, the link taken down mid-training: each node's ranks and launcher
#     name the operation and a rank of the other node (the wait's timeout,
#     or the socket's TCP_USER_TIMEOUT: "Network is unreachable"), both
#     exit 1 within 10 s; the newest checkpoint verifies
# After each case no process is left in either namespace and no segment of
# the job in /dev/shm.  The namespaces (and so the veth pair) are removed at
# the end, whatever happened (trap).
#
# Needs root and `ip netns`; otherwise exits 77, which ctest reports as
# skipped (SKIP_RETURN_CODE), with the reason.
#
# The namespaces come from netns_lib.sh, shared with test_netns_mpi.sh
# (the same two nodes under Open MPI's mpirun and the mpi communicator).
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
port=29400
netns_make

rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer eq.toml \
  '[train]' 'global_batch = 16' '-warmup_steps' \
  '[launch]' 'timeout = 4.0'
export DTRAIN_JOB_SECRET
DTRAIN_JOB_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

# node NS RANK LOG ARGS...: `dtrain run` as node RANK inside namespace NS,
# in the background (its pid appended to pids); bounded by `timeout`
node() {
  local ns=$1 r=$2 log=$3; shift 3
  timeout -k 2 40 ip netns exec "$ns" "$bin" run eq.toml --nnodes 2 --node-rank "$r" \
    --nproc 2 --master-addr "${master:-$a0}" --master-port "$port" "$@" >"$log" 2>&1 &
  pids+=($!)
}
# both_nodes NAME ARGS0 -- ARGS1: both nodes at once; rc0, rc1 their exits
both_nodes() {
  local name=$1; shift
  local args0=() args1=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args0+=("$1"); shift; done
  shift || true
  args1=("$@")
  node "$ns0" 0 "$name.n0.log" "${args0[@]}"
  local p0=$!
  node "$ns1" 1 "$name.n1.log" "${args1[@]}"
  local p1=$!
  set +e; wait "$p0"; rc0=$?; wait "$p1"; rc1=$?; set -e
}
# nothing_left NAME: no process in either namespace, no segment of the job
nothing_left() { netns_nothing_left "$1" "dtrain-$job*"; }
# what every node's launcher names the job (rendezvous.h: "mn-" + 16 hex)
job=""

# joined_ids LOG...: the distinct job ids the ranks' "joined job" lines name
joined_ids() { grep -ho 'rendezvous: rank [0-3] of 4 joined job [^ ]*' "$@" | awk '{print $NF}' | sort -u; }

# misnumbered LOG A B: the join lines in LOG of a rank outside A..B, or whose
# tag and global rank differ
misnumbered() {
  awk -v a="$2" -v b="$3" '/rendezvous: rank [0-9]+ of 4 joined/ {
    t = $2; sub(/\]/, "", t); r = $5
    if (t != r || r + 0 < a + 0 || r + 0 > b + 0) print }' "$1"
}

# ---- the job forms across the namespaces; shm then refuses it ---------------
# (the first rank that fails makes its launcher stop the others, so any rank,
# rank 0 included, may be stopped before it logs its join: the job id comes
# from the launchers, and every rank that did log must name it, numbered on
# its own node's range; the opted-in run below sees all four join)
both_nodes forms --
out=$(cat forms.n0.log forms.n1.log)
job=$(grep -ho 'dtrain: launching ranks [0-9-]* of 4 (job [^)]*)' forms.n0.log forms.n1.log |
      sed 's/.*(job \(.*\))/\1/' | sort -u)
joined=$(joined_ids forms.n0.log forms.n1.log)
if [ "$(wc -l <<<"$job")" = 1 ] && [[ "$job" == mn-* ]] &&
   [ -n "$joined" ] && [ "$joined" = "$job" ] &&
   [ -z "$(misnumbered forms.n0.log 0 1)" ] && [ -z "$(misnumbered forms.n1.log 2 3)" ]; then
  ok "the ranks that logged their join name the launchers' one job ($job), numbered globally"
else bad "the ranks did not agree on one job id" "$out"; fi
expect_out "node 0 launched global ranks 0-1" "dtrain: launching ranks 0-1 of 4 (job $job)"
expect_out "node 1 launched global ranks 2-3" "dtrain: launching ranks 2-3 of 4 (job $job)"
expect_out "shm refuses a job that spans nodes" "comm/shm: init: the job spans several nodes (2 of its 4 ranks on this one): shared memory reaches only the ranks of one machine"
if [ "$rc0" = 2 ] && [ "$rc1" = 2 ]; then ok "both nodes exit 2 (a config error)"
else bad "exit codes $rc0 and $rc1, expected 2 and 2" "$out"; fi
nothing_left forms

# ---- a flood on master_port does not stop the job forming -----------------
# (from node 1's side: 300 connections held and re-opened as fast as node 0
# closes them, from before rank 0 listens until the job formed; node 1
# starts a second after node 0.  Before the fix rank 0's 64 slots stayed
# full, every rank timed out (exit 1) and each refusal logged its own line)
cat > flood.py <<'P'
import select, socket, sys, time
host, port, n, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks, opened, end = [], 0, time.time() + secs
while time.time() < end:
    while len(socks) < n:
        s = socket.socket(); s.setblocking(False)
        try: s.connect((host, port))
        except BlockingIOError: pass
        except OSError: s.close(); break
        socks.append(s); opened += 1
    for s in select.select(socks, [], [], 0.005)[0]:
        try: d = s.recv(64)
        except BlockingIOError: continue
        except OSError: d = b''
        if not d: socks.remove(s); s.close()
print(opened)
P
ip netns exec "$ns1" timeout -k 1 30 /usr/bin/python3 flood.py "$a0" "$port" 300 25 >flood.out 2>&1 &
fpid=$!; pids+=($fpid)
# node 0 first, node 1 once the flood has had a second at rank 0's port
node "$ns0" 0 flood.n0.log
p0=$!
sleep 1
t0=$(date +%s.%N)
node "$ns1" 1 flood.n1.log
p1=$!
set +e; wait "$p0"; rc0=$?; wait "$p1"; rc1=$?; set -e
took=$(since "$t0")
kill "$fpid" 2>/dev/null || true; wait "$fpid" 2>/dev/null || true
out=$(cat flood.n0.log flood.n1.log)
if [ "$rc0" = 2 ] && [ "$rc1" = 2 ] && grep -qF "comm/shm: init: the job spans several nodes" <<<"$out"
then ok "under the flood node 1's ranks join within launch.timeout (then shm refuses the job, exit 2; ${took} s after node 1 started)"
else bad "under the flood: exit codes $rc0 and $rc1, expected the job to form" "$out"; fi
singles=$(grep -c "^\[rank 0\] rendezvous: refused a connection from " flood.n0.log || true)
counted=$(grep -c "^\[rank 0\] rendezvous: dropped [0-9]* more connections that did not prove they belong to the job in the last " flood.n0.log || true)
if [ "$singles" -ge 1 ] && [ "$singles" -le 5 ] && [ "$counted" -le 1 ] &&
   grep -qF "rendezvous: refused a connection from $a1:" flood.n0.log; then
  ok "node 0's log of the flood is bounded: $singles single lines, $counted counting the rest"
else bad "node 0's log of the flood: $singles single lines, $counted counting lines" "$(head -c 3000 flood.n0.log)"; fi
nothing_left flood

# ---- the explicit opt-in: shm across the namespaces, one host --------------
"$bin" run eq.toml --nproc 4 --set run.name=one --metrics one.jsonl >one.log 2>&1 ||
  bad "the single-node 4-rank run failed" "$(cat one.log)"
both_nodes shared --set shm.nodes_share_memory=true --set run.name=two --metrics two.jsonl \
  -- --set shm.nodes_share_memory=true --set run.name=two
if [ "$rc0" = 0 ] && [ "$rc1" = 0 ]; then
  ok "with shm.nodes_share_memory the 2 x 2 job trains across the namespaces"
  out=$(cat shared.n0.log shared.n1.log)
  for r in 0 1 2 3; do
    expect_out "rank $r joined as global rank $r of 4" "[rank $r] rendezvous: rank $r of 4 joined job $job"
  done
  same_losses "2 nodes x 2 ranks vs 1 node x 4 ranks" one.jsonl two.jsonl 1e-6
else bad "the opted-in 2 x 2 run failed ($rc0, $rc1)" "$(cat shared.n0.log shared.n1.log)"; fi
nothing_left shared

# ---- node 1 resolves another config ----------------------------------------
both_nodes mismatch -- --set train.lr=1e-3
out=$(cat mismatch.n0.log mismatch.n1.log)
expect_out "the mismatch names ranks 2 and 3 beside rank 0's hash" "rendezvous: the ranks resolved different configs: rank 0 has config hash "
if grep -qE 'rank 0 has config hash [0-9a-f]{16}, rank 2 has [0-9a-f]{16}, rank 3 has [0-9a-f]{16} \(every node must run the same config' <<<"$out"; then
  ok "the message names rank 2's and rank 3's hashes"
else bad "the message does not name ranks 2 and 3 with their hashes" "$out"; fi
if grep -q '^\[rank 0\] dtrain run: error: rendezvous: the ranks resolved different configs' mismatch.n0.log &&
   grep -qE '^\[rank [23]\] dtrain run: error: rendezvous: the ranks resolved different configs.*\(reported by rank 0\)' mismatch.n1.log; then
  ok "both nodes report the mismatch (node 1 as rank 0 told it)"
else bad "not both nodes report the mismatch" "$out"; fi
if [ "$rc0" = 2 ] && [ "$rc1" = 2 ]; then ok "both nodes exit 2 on the mismatch"
else bad "exit codes $rc0 and $rc1 on the mismatch, expected 2 and 2" "$out"; fi
nothing_left mismatch

# ---- the link goes down during the rendezvous ------------------------------
t0=$(date +%s.%N)
node "$ns0" 0 down.n0.log
p0=$!
# rank 1 is in (connected to rank 0 inside node 0) before the link goes
for _ in $(seq 100); do
  [ -n "$(ip netns exec "$ns0" ss -Htn state established "( dport = :$port )")" ] && break
  sleep 0.05
done
ip -n "$ns0" link set "$v0" down
node "$ns1" 1 down.n1.log
p1=$!
set +e; wait "$p0"; rc0=$?; wait "$p1"; rc1=$?; set -e
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
out=$(cat down.n0.log down.n1.log)
expect_out "rank 0 names the missing ranks" "rendezvous at $a0:$port timed out after 4 s: ranks 2, 3 of 4 never joined (joined: 0, 1)"
expect_out "rank 1 hears it from rank 0" "[rank 1] dtrain run: error: rendezvous at $a0:$port timed out after 4 s: ranks 2, 3 of 4 never joined (joined: 0, 1) (reported by rank 0)"
if grep -qE "^\[rank ([23])\] dtrain run: error: rendezvous: rank \1 of 4 could not join rank 0 at $a0:$port within 4 s: rank 0 never answered" down.n1.log; then
  ok "node 1 names rank 0 and its address"
else bad "node 1 does not name rank 0 and its address" "$out"; fi
# the bound: 4 s of rendezvous, its 1 s grace on node 1, start-up
if awk -v t="$took" 'BEGIN { exit !(t < 12) }'; then ok "both nodes gave up within the bound (${took} s)"
else bad "the nodes took ${took} s to give up" "$out"; fi
if [ "$rc0" = 1 ] && [ "$rc1" = 1 ]; then ok "both nodes exit 1 (a runtime failure)"
else bad "exit codes $rc0 and $rc1 with the link down, expected 1 and 1" "$out"; fi
nothing_left link-down

# ---- tcp: the training bytes cross the link --------------------------------
ip -n "$ns0" link set "$v0" up # down since the case above
port=$((port + 1)) # the link-down case's listener may linger in TIME_WAIT
tcp0=(--set run.comm=tcp)
# tcp_job NAME LABEL: the 2 x 2 job over tcp as run NAME (master $master,
# else $a0): both nodes exit 0, the losses are the single-node 4-rank shm
# run's within 1e-5, and node 0's veth received at least the gradient
# bytes x 6 steps (node 0 must learn node 1's half of every all-reduce);
# sets rx (those bytes) and need
tcp_job() {
  local name=$1 label=$2 rx0 elems
  rx0=$(rx_bytes)
  both_nodes "$name" "${tcp0[@]}" --set run.name="$name" --metrics "$name.jsonl" -- \
    "${tcp0[@]}" --set run.name="$name"
  rx=$(($(rx_bytes) - rx0))
  out=$(cat "$name.n0.log" "$name.n1.log")
  if [ "$rc0" = 0 ] && [ "$rc1" = 0 ]; then
    ok "$label: the 2 x 2 job trains across the namespaces (master ${master:-$a0})"
  else bad "$label: the 2 x 2 run failed ($rc0, $rc1)" "$out"; fi
  job=$(joined_ids "$name.n0.log" "$name.n1.log")
  same_losses "$label, 2 nodes x 2 ranks vs shm, 1 node x 4 ranks" one.jsonl "$name.jsonl" 1e-5
  elems=$("$bin" ckpt inspect "out/$name/ckpt/step-00000006" |
          awk '$1 ~ /\/params$/ { n += $3 } END { print n + 0 }')
  need=$((elems * 4 * 6))
  if [ "$elems" -gt 0 ] && [ "$rx" -ge "$need" ]; then
    ok "$label: node 0's veth received $rx bytes >= $need (gradient $((elems * 4)) bytes x 6 steps)"
  else bad "$label: node 0's veth received $rx bytes, less than $need ($elems params)" "$out"; fi
}
tcp_job tcp tcp
# the hierarchical all_reduce ([tcp] hierarchical, 2 nodes of 2): each way
# the link carries one gradient per step, where the flat ring over 4 ranks
# carries 1.5 (2(n-1)/n)
if [ "$rx" -lt $((need * 5 / 4)) ]; then
  ok "tcp: under 1.25 x that: the three rings, not the flat ring's 1.5 x"
else bad "tcp: node 0's veth received $rx bytes, 1.25 x $need or more: a flat ring?" "$out"; fi
nothing_left tcp

# ---- tcp over IPv6 ------------------------------------------------------------
if [ -n "$b0" ]; then
  # the link-down case above took the IPv6 addresses with the link (the
  # kernel drops them on down unless keep_addr_on_down): put them back
  ip -n "$ns0" addr replace "$b0/64" dev "$v0" nodad
  ip -n "$ns1" addr replace "$b1/64" dev "$v1" nodad
  port=$((port + 1))
  master=$b0
  tcp_job tcp6 "tcp over IPv6"
  master=""
  nothing_left tcp6
else
  skip "tcp over IPv6 across the namespaces" "$no6"
fi

# ---- tcp: `dtrain bench comm` as two nodes ----------------------------------
# the same multi-node launch as `dtrain run` (core/cli/cli_launch.c): each
# node starts its 2 ranks of the 4-rank job; rank 0's table comes out on
# node 0, every size checked (#wrong 0)
port=$((port + 1))
for r in 0 1; do
  ns=$ns0; [ $r = 1 ] && ns=$ns1
  timeout -k 2 40 ip netns exec "$ns" "$bin" bench comm --comm tcp --nproc 2 \
    --sizes 64K:1M --iters 3 --set launch.nnodes=2 --set launch.node_rank=$r \
    --set "launch.master_addr=\"$a0\"" --set launch.master_port=$port >bench.n$r.log 2>&1 &
  pids+=($!)
done
set +e; wait "${pids[-2]}"; rc0=$?; wait "${pids[-1]}"; rc1=$?; set -e
out=$(cat bench.n0.log bench.n1.log)
rows=$(awk '$1 ~ /^[0-9]+$/ && NF == 8 && $8 == 0' bench.n0.log | wc -l)
if [ "$rc0" = 0 ] && [ "$rc1" = 0 ] &&
   grep -q "^# dtrain bench comm: all_reduce, 4 ranks, comm tcp" bench.n0.log &&
   [ "$rows" = 5 ] && grep -q "^dtrain: launching ranks 2-3 of 4" bench.n1.log; then
  ok "bench comm, tcp, 2 nodes x 2 ranks: one 4-rank table on node 0, 5 sizes, none wrong"
else bad "bench comm across the namespaces ($rc0, $rc1, $rows rows)" "$out"; fi
nothing_left bench

# bg_nodes NAME ARGS...: both nodes in the background with ARGS (p0, p1)
bg_nodes() {
  local name=$1; shift
  node "$ns0" 0 "$name.n0.log" "$@"; p0=$!
  node "$ns1" 1 "$name.n1.log" "$@"; p1=$!
}
long=("${tcp0[@]}" --set train.steps=100000 --set checkpoint.every=2 --set checkpoint.keep=3)
# the rank processes of node 1 (children of its launcher; they run
# /proc/self/exe, so their comm is "exe")
node1_ranks() {
  local p
  for p in $(ip netns pids "$ns1"); do
    [ "$(cat "/proc/$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null)/comm" 2>/dev/null)" = dtrain ] && echo "$p"
  done
  return 0
}
# the launchers and ranks in both namespaces
job_procs() {
  local p c
  for p in $(netns_procs); do
    c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    [ "$c" = dtrain ] || [ "$c" = exe ] && echo "$p"
  done
  return 0
}

# ---- tcp: node 1's ranks killed mid-training -------------------------------
port=$((port + 1))
bg_nodes kill "${long[@]}" --set run.name=kill
if wait_for kill.n0.log "checkpoint: saved" 20; then
  # every process stopped while the newest complete checkpoint is read: a
  # save needs every rank, so none completes after the kill
  mapfile -t all < <(job_procs)
  job=$(joined_ids kill.n0.log kill.n1.log)
  kill -STOP "${all[@]}"
  step=$(newest_ckpt out/kill/ckpt)
  sums=$(ckpt_sums "$step")
  mapfile -t victims < <(node1_ranks)
  t0=$(date +%s.%N)
  ip netns exec "$ns1" kill -KILL "${victims[@]}"
  kill -CONT "${all[@]}" 2>/dev/null || true
  set +e; wait "$p0"; rc0=$?; wait "$p1"; rc1=$?; set -e
  took=$(since "$t0")
  out=$(cat kill.n0.log kill.n1.log)
  if [ "${#victims[@]}" = 2 ]; then ok "tcp kill: node 1's two ranks killed inside $ns1"
  else bad "tcp kill: node 1 had ${#victims[@]} rank processes, expected 2" "$out"; fi
  # (the first rank that fails makes its launcher stop the other, which
  # may not get to print: a rank of node 0 and its launcher name it)
  lost_rx="comm/tcp: [a-z_]+ #[0-9]+ \([^)]*\) on group [^:]+: (not started: the group failed earlier: )?(world )?rank [23] lost: "
  if grep -qE "^\[rank [01]\] .*$lost_rx" kill.n0.log; then
    ok "tcp kill: a rank of node 0 names the operation and the lost rank"
  else bad "tcp kill: no rank of node 0 names the operation and a lost rank" "$out"; fi
  if grep -qE "^dtrain: rank [01] failed \(exit 1\).*$lost_rx" kill.n0.log; then
    ok "tcp kill: node 0's launcher reports it"
  else bad "tcp kill: node 0's launcher does not report the lost rank" "$out"; fi
  if awk -v t="$took" 'BEGIN { exit !(t < 10) }'; then ok "tcp kill: both nodes ended ${took} s after the kill (bound 10 s)"
  else bad "tcp kill: the nodes took ${took} s to end" "$out"; fi
  if [ "$rc0" = 1 ] && [ "$rc1" != 0 ]; then ok "tcp kill: node 0 exits 1, node 1 exits $rc1"
  else bad "tcp kill: exit codes $rc0 and $rc1, expected 1 and non-zero" "$out"; fi
  nothing_left "tcp kill"
  after_fault "tcp kill" "" "" "$step" "$sums" kill.n0.log kill.n1.log
  n=$((10#${step##*step-}))
  expect_exit 0 "tcp kill: 1 node x 4 ranks resumes from $step" "$bin" run eq.toml --nproc 4 \
    --set run.name=kill --set train.steps=100000 --set train.stop_at=$((n + 2)) \
    --set checkpoint.resume="$step"
  expect_out "tcp kill: the resumed run names the step it starts from" "step $(printf '%5d' $((n + 1)))/100000"
else bad "tcp kill: no checkpoint saved within 20 s" "$(cat kill.n0.log kill.n1.log)"; fi

# ---- tcp: the link taken down mid-training ---------------------------------
port=$((port + 1))
bg_nodes down2 "${long[@]}" --set run.name=down2
if wait_for down2.n0.log "checkpoint: saved" 20; then
  job=$(joined_ids down2.n0.log down2.n1.log)
  t0=$(date +%s.%N)
  ip -n "$ns0" link set "$v0" down
  set +e; wait "$p0"; rc0=$?; wait "$p1"; rc1=$?; set -e
  took=$(since "$t0")
  ip -n "$ns0" link set "$v0" up
  out=$(cat down2.n0.log down2.n1.log)
  for n in 0 1; do
    if [ "$n" = 0 ]; then mine="[01]" other="[23]"; else mine="[23]" other="[01]"; fi
    rx="comm/tcp: [a-z_]+ #[0-9]+ \([^)]*\) on group [^:]+: .*(rank $other lost: |timed out after 4\.0 s waiting for (world )?rank $other)"
    if grep -qE "^\[rank $mine\] .*$rx" "down2.n$n.log" &&
       grep -qE "^dtrain: rank $mine failed \(exit 1\).*$rx" "down2.n$n.log"; then
      ok "tcp link down: node $n's ranks and launcher name the operation and a rank of the other node"
    else bad "tcp link down: node $n does not name the operation and a rank of the other node" "$out"; fi
  done
  if awk -v t="$took" 'BEGIN { exit !(t < 10) }'; then ok "tcp link down: both nodes ended ${took} s after the link went down (comm timeout 4 s, bound 10 s)"
  else bad "tcp link down: the nodes took ${took} s to end" "$out"; fi
  if [ "$rc0" = 1 ] && [ "$rc1" = 1 ]; then ok "tcp link down: both nodes exit 1"
  else bad "tcp link down: exit codes $rc0 and $rc1, expected 1 and 1" "$out"; fi
  nothing_left "tcp link down"
  after_fault "tcp link down" "" "" "" "" down2.n0.log down2.n1.log
  step=$(newest_ckpt out/down2/ckpt)
  set +e; v=$("$bin" ckpt inspect "$step" --verify 2>&1); e=$?; set -e
  [ -n "$step" ] && [ "$e" = 0 ] && ok "tcp link down: the newest checkpoint ($step) verifies" ||
    bad "tcp link down: the newest checkpoint '$step' does not verify" "$v"
else bad "tcp link down: no checkpoint saved within 20 s" "$(cat down2.n0.log down2.n1.log)"; fi
finish
