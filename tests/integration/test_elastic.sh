#!/usr/bin/env bash
# Elastic launch (issue 27): `dtrain run --nnodes MIN:MAX --max-restarts N`.
#
# One machine (any user):
#   - the options are checked before anything starts: MIN above MAX, a
#     malformed MIN, --max-restarts without MIN:MAX, run.comm = "mpi" and
#     another launcher's ranks are config errors (exit 2) naming them, and
#     so is a round whose world size cannot keep the global batch
#   - the store refuses a node with another DTRAIN_JOB_SECRET (exit 2 on
#     it), and node 0 alone gives up after launch.timeout naming the count
#   - checkpoint.async: saves written by a thread while the next step
#     trains hold the same shards byte for byte as synchronous ones, verify,
#     and leave the losses unchanged
#   - one node of 2 shm ranks (async saves), rank 1 killed (SIGKILL) mid-run: the agent
#     logs one restart line naming the rank and the new layout, the ranks
#     resume from the newest checkpoint and train every step; the losses
#     equal an uninterrupted 2-rank run's bit for bit (same world size, the
#     resume is exact); nothing of either round in /dev/shm, no process left
#   - a rank killed at the same step every round (DTRAIN_FAULT_KILL_AT_
#     BACKWARD, test builds only): --max-restarts 2 exhausted ends with exit
#     1 and one message naming all 3 failures
# Three "nodes" (root only, else the part is skipped with the reason):
# network namespaces on one bridge, `dtrain run --nnodes 2:3 --nproc 2` in
# each over tcp:
#   - the job forms as 3 x 2 = 6 ranks; node 2 killed (every process in its
#     namespace) mid-run: nodes 0 and 1 re-form as 2 x 2 = 4 ranks within
#     the bound, resume from the newest checkpoint, train every step; the
#     losses up to that checkpoint equal an uninterrupted 3 x 2 run's bit
#     for bit, after it a 2 x 2 run's resumed from the same checkpoint
#     (global batch kept, grad_accum 2 -> 3; the references run over tcp
#     on as many nodes: shm sums in another order, and this model's grad
#     norm sits at the clip threshold at step 17, where orders part by
#     1e-3)
#   - node 2 started again waits, and joins at the next restart: node 1
#     killed, nodes 0 and 2 form round 3 and finish the job
#   - nothing left: no process in the namespaces, no segment in /dev/shm,
#     no temporary file in the checkpoint folder
#   - node 2's link taken down (its launcher's connection stays open and
#     silent): the store takes it for lost within its bound after the
#     round's first failure, and nodes 0 and 1 finish the job
#   - node 0, which hosts the store, killed: node 1 exits 1 saying the job
#     cannot re-form without it
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
export DTRAIN_LOG=info
losses_cmp() { /usr/bin/python3 "$here/elastic_cmp.py" "$@"; }

expect_exit 0 "data prepare" "$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin
toml_from gpt2_2layer el.toml \
  '[train]' 'steps = 60' 'global_batch = 24' 'micro_batch = 2' '-warmup_steps' \
  '[checkpoint]' 'every = 4' 'keep = 100' \
  '[launch]' 'timeout = 8.0'
port=$((29700 + $$ % 200 * 4))

# ---- the options, checked first ---------------------------------------------
expect_exit 2 "MIN above MAX" "$bin" run el.toml --nproc 2 --nnodes 3:2
expect_out "MIN above MAX: named" "launch.min_nnodes = 3 (from the command line) is more than launch.nnodes = 2 (from the command line)"
expect_exit 2 "a malformed MIN" "$bin" run el.toml --nproc 2 --nnodes x:2
expect_out "a malformed MIN: named" "--nnodes 'x:2': MIN:MAX needs MIN"
# mpi's ranks are mpirun's: started by dtrain's agent they are refused by
# the plugin itself (a config error: exit 2, and the agent does not retry)
# (MPI's components kept loaded and whole stacks unwound, so the ASan
# build's suppressions see Open MPI's frames in what its singleton init
# leaves allocated: tests/sanitizer/lsan.supp)
expect_exit 2 "mpi refused" env OMPI_MCA_mca_base_component_disable_dlclose=1 \
  PMIX_MCA_mca_base_component_disable_dlclose=1 \
  LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}fast_unwind_on_malloc=0" \
  "$bin" run el.toml --nproc 2 --nnodes 1:1 --set run.comm=mpi
expect_out "mpi refused: why" "comm/mpi: init: dtrain has this process as rank 1 of 2, MPI_COMM_WORLD as rank 0 of 1: start every rank with mpirun"
expect_out "mpi refused: the agent says which rank and why" "failed (exit 2); its last error line: dtrain run: error: comm/mpi: init:"
if grep -q 'restart 1 of' <<<"$out"; then bad "a config error was retried" "$out"; else ok "a config error is not retried"; fi
expect_exit 2 "--max-restarts without MIN:MAX" "$bin" run el.toml --nproc 2 --max-restarts 1
expect_out "--max-restarts without MIN:MAX: named" "launch.max_restarts = 1 (from the command line) applies to an elastic job only: give --nnodes MIN:MAX"
expect_exit 2 "under torchrun's variables" env RANK=0 WORLD_SIZE=1 "$bin" run el.toml --nnodes 1:1
expect_out "under another launcher: named" "asks for an elastic job, but torchrun started this process"

# ---- a round whose world cannot keep the global batch: exit 2 --------------
expect_exit 2 "a global batch 4 ranks cannot keep" "$bin" run el.toml --nproc 4 --nnodes 1:1 \
  --master-port "$port" --set train.global_batch=6
expect_out "the batch error names the round's world size" "dtrain run: error: elastic: at the round's world size of 4 ranks: "

# ---- one node: a rank killed, the job restarts and finishes -----------------
# ---- the store: another secret refused, too few nodes time out -------------
# (two "nodes" on this machine: node 0 waits for a second node that never
# proves the job secret, and gives up after launch.timeout)
two=(--nproc 1 --nnodes 2:2 --master-addr 127.0.0.1 --master-port $((port + 2)) --set launch.timeout=2)
DTRAIN_JOB_SECRET=s0 "$bin" run el.toml "${two[@]}" --node-rank 0 >st0.log 2>&1 &
spid=$!
sleep 0.5
expect_exit 2 "another secret refused" env DTRAIN_JOB_SECRET=s1 "$bin" run el.toml "${two[@]}" --node-rank 1
expect_out "another secret: named" "dtrain: elastic: the elastic store refused this node: it does not hold the job's DTRAIN_JOB_SECRET"
set +e; wait "$spid"; rc=$?; set -e
out=$(cat st0.log)
[ "$rc" = 1 ] && ok "too few nodes: node 0 exits 1" || bad "too few nodes: node 0 exit $rc" "$out"
expect_out "too few nodes: named" "dtrain: elastic: only 1 of at least 2 nodes (node 0 among them) waited for round 1 within 2 s (launch.timeout)"
expect_out "the refusal is logged on node 0" "dtrain: elastic: refused node 1 from 127.0.0.1: it does not hold this job's DTRAIN_JOB_SECRET"

# ---- checkpoint.async: the same checkpoints, written while training --------
"$bin" run el.toml --nproc 2 --set run.name=sy --set checkpoint.every=2 --set train.steps=8 \
  --metrics sy.jsonl >sy.log 2>&1 || bad "the synchronous-save run failed" "$(cat sy.log)"
expect_exit 0 "async saves" "$bin" run el.toml --nproc 2 --set run.name=as --set checkpoint.every=2 \
  --set train.steps=8 --set checkpoint.async=true --metrics as.jsonl
same=1
for k in 2 4 6 8; do
  d=step-$(printf %08d $k)
  for f in out/sy/ckpt/$d/shard-*.bin; do cmp -s "$f" "out/as/ckpt/$d/${f##*/}" || same=0; done
  "$bin" ckpt inspect "out/as/ckpt/$d" --verify >/dev/null 2>&1 || same=0
done
[ "$same" = 1 ] && ok "async saves: every step's shards equal the synchronous saves' byte for byte, and verify" ||
  bad "async saves differ from the synchronous ones" "$(ls -R out/as/ckpt)"
r=$(losses_cmp as.jsonl 1 8 sy.jsonl 0) && ok "async saves: the losses are unchanged ($r)" || bad "async saves change the losses" "$r"

one=(--nproc 2 --nnodes 1:1 --max-restarts 2 --master-port "$port")
"$bin" run el.toml --nproc 2 --set run.name=ref2 --metrics ref2.jsonl >ref2.log 2>&1 ||
  bad "the uninterrupted 2-rank run failed" "$(cat ref2.log)"
"$bin" run el.toml "${one[@]}" --set run.name=k1 --set checkpoint.async=true --metrics k1.jsonl >k1.log 2>&1 &
lpid=$!
if wait_for k1.log "checkpoint: saved" 30 && victim=$(rank_pid "$lpid" 1); then
  # the ranks held while the victim dies, so it dies mid-run
  mapfile -t held < <(pgrep -P "$lpid")
  kill -STOP "${held[@]}"; kill -KILL "$victim"; kill -CONT "${held[@]}" 2>/dev/null || true
  set +e; wait "$lpid"; rc=$?; set -e
  out=$(cat k1.log)
  if [ "$rc" = 0 ]; then ok "one node: the job restarted and finished (exit 0)"
  else bad "one node: exit $rc" "$out"; fi
  expect_out "one node: the restart line names the rank and the layout" "dtrain: elastic: restart 1 of at most 2 after node 0 (127.0.0.1): rank 1 failed (killed by SIGKILL); round 2: 1 node, 2 ranks: node 0 (127.0.0.1) ranks 0-1"
  expect_out "one node: every step trained" "[rank 0] step    60/60"
  n=$(grep -o 'resumed from [^ ]* (step [0-9]*)' k1.log | grep -o '[0-9]*)$' | tr -d ')')
  if [ -n "$n" ] && r=$(losses_cmp k1.jsonl 1 60 ref2.jsonl 0); then
    ok "one node: resumed at step $n; the losses equal the uninterrupted run's bit for bit ($r)"
  else bad "one node: losses differ from the uninterrupted run's (resumed at '$n')" "${r:-}"; fi
  left=""
  for p in /proc/[0-9]*; do
    tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -q "^DTRAIN_JOB_ID=el$lpid-r" && left+=" ${p#/proc/}"
  done
  [ -z "$left" ] && ok "one node: no rank of either round left" || bad "one node: ranks left:$left"
  left=$(find /dev/shm -maxdepth 1 -name "dtrain-el$lpid-*")
  [ -z "$left" ] && ok "one node: nothing of either round in /dev/shm" || bad "one node: left in /dev/shm" "$left"
  after_fault "one node" "" out/k1/ckpt "" "" k1.log
else bad "one node: no checkpoint within 30 s" "$(cat k1.log)"; kill -KILL "$lpid" 2>/dev/null || true; fi

# ---- --max-restarts exhausted ------------------------------------------------
if has_test_hooks "$bin"; then
  t0=$(date +%s.%N)
  expect_exit 1 "max-restarts exhausted" env DTRAIN_FAULT_KILL_AT_BACKWARD=6:0 \
    "$bin" run el.toml "${one[@]}" --set run.name=ex
  if grep -qE "^dtrain: elastic: gave up after 2 restarts \(launch.max_restarts = 2\): 3 failures: \(round 1\) node 0 \(127.0.0.1\): rank [01] failed \(killed by SIGKILL\); \(round 2\) node 0 \(127.0.0.1\): rank [01] failed \(killed by SIGKILL\); \(round 3\) node 0 \(127.0.0.1\): rank [01] failed \(killed by SIGKILL\)$" <<<"$out"
  then ok "max-restarts exhausted: one line names all 3 failures"
  else bad "max-restarts exhausted: no line naming the 3 failures" "$out"; fi
  if [ "$(grep -c '^dtrain: elastic: restart [12] of at most 2 after ' <<<"$out")" = 2 ]; then
    ok "max-restarts exhausted: one line per restart"
  else bad "max-restarts exhausted: not one line per restart" "$out"; fi
  echo "# max-restarts case took $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
else skip "max-restarts exhausted" "needs DTRAIN_TEST_HOOKS (DTRAIN_FAULT_KILL_AT_BACKWARD)"; fi

# ---- three nodes over tcp ------------------------------------------------------
if [ "$(id -u)" != 0 ]; then
  skip "three nodes" "network namespaces need root (this test runs as uid $(id -u))"
  finish; exit $?
fi
nsb=dte$$b ns=(dte$$n0 dte$$n1 dte$$n2) addr=(10.79.0.1 10.79.0.2 10.79.0.3)
pids=()
teardown() {
  local p n
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for n in "${ns[@]}" "$nsb"; do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
}
if ! err=$(ip netns add "$nsb" 2>&1); then
  skip "three nodes" "cannot make a network namespace here: $err"
  finish; exit $?
fi
trap teardown EXIT
ip -n "$nsb" link add br0 type bridge
ip -n "$nsb" link set br0 up
for i in 0 1 2; do
  ip netns add "${ns[i]}"
  ip link add "dte$$v$i" type veth peer name "dte$$p$i"
  ip link set "dte$$v$i" netns "${ns[i]}"
  ip link set "dte$$p$i" netns "$nsb"
  ip -n "$nsb" link set "dte$$p$i" master br0 up
  ip -n "${ns[i]}" addr add "${addr[i]}/24" dev "dte$$v$i"
  ip -n "${ns[i]}" link set "dte$$v$i" up
  ip -n "${ns[i]}" link set lo up
done
export DTRAIN_JOB_SECRET
DTRAIN_JOB_SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
tcp=(--set run.comm=tcp --set run.name=el)
# node I: `dtrain run` as node I in its namespace, in the background
node() {
  local i=$1
  timeout -k 2 120 ip netns exec "${ns[i]}" "$bin" run el.toml --nnodes 2:3 --nproc 2 \
    --node-rank "$i" --max-restarts 3 --master-addr "${addr[0]}" --master-port "$port" \
    "${tcp[@]}" --metrics "n$i.jsonl" >>"n$i.log" 2>&1 &
  pids[i]=$!
}
ns_procs() { ip netns pids "${ns[$1]}" 2>/dev/null; }
all_ranks() { local i p; for i in 0 1 2; do for p in $(ns_procs "$i"); do
  [ "$(cat /proc/$p/comm 2>/dev/null)" = exe ] && echo "$p"; done; done; return 0; }
# kill_node I: every process of node I at once, the others held meanwhile
kill_node() {
  local held
  mapfile -t held < <(all_ranks)
  kill -STOP "${held[@]}" 2>/dev/null || true
  t_kill=$(date +%s.%N)
  for p in $(ns_procs "$1"); do kill -KILL "$p" 2>/dev/null || true; done
  kill -CONT "${held[@]}" 2>/dev/null || true
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ref NAME NODES ARGS...: an uninterrupted, not elastic run on nodes
# 0..NODES-1 over tcp (the same rings as the elastic rounds of that many
# nodes, so the same sums in the same order); NAME.jsonl its metrics
ref() {
  local name=$1 nn=$2 i rp=() rc=0; shift 2
  port=$((port + 2))
  for ((i = 0; i < nn; i++)); do
    timeout -k 2 60 ip netns exec "${ns[i]}" "$bin" run el.toml --nnodes "$nn" --nproc 2 \
      --node-rank "$i" --master-addr "${addr[0]}" --master-port "$port" --set run.comm=tcp \
      --set run.name="$name" --metrics "$name.jsonl" "$@" >"$name.n$i.log" 2>&1 &
    rp+=($!)
  done
  for i in "${rp[@]}"; do wait "$i" || rc=1; done
  [ "$rc" = 0 ] || bad "the reference run $name failed" "$(cat "$name".n*.log)"
}
node 0; node 1; node 2
if wait_for n0.log "[rank 0] checkpoint: saved out/el/ckpt/step-00000008" 60; then
  grep -qF "dtrain: elastic: round 1: 3 nodes, 6 ranks: node 0 (${addr[0]}) ranks 0-1, node 1 (${addr[1]}) ranks 2-3, node 2 (${addr[2]}) ranks 4-5" n0.log &&
    ok "round 1: 3 nodes x 2 ranks" || bad "round 1 is not 3 x 2" "$(cat n0.log)"
  kill_node 2
  if wait_for n0.log "round 2: 2 nodes, 4 ranks" 30 && wait_for n0.log "resumed from" 30 &&
     wait_for n0.log "checkpoint: saved" 1; then
    took=$(since "$t_kill")
    n=$(grep -o 'resumed from [^ ]* (step [0-9]*)' n0.log | head -1 | grep -o '[0-9]*)$' | tr -d ')')
    # the first step after the resume
    for _ in $(seq 400); do grep -qE "^\[rank 0\] step +$((n + 1))/60" n0.log && break; sleep 0.05; done
    took=$(since "$t_kill")
    if grep -qE "^dtrain: elastic: restart 1 of at most 3 after node 2 \(${addr[2]}\) lost: its launcher's connection closed.*; round 2: 2 nodes, 4 ranks: node 0 \(${addr[0]}\) ranks 0-1, node 1 \(${addr[1]}\) ranks 2-3$" n0.log n1.log
    then ok "node 2 lost: the restart line names it and the new layout 2 x 2"
    else bad "no restart line naming node 2 and the 2 x 2 layout" "$(grep '^dtrain' n0.log n1.log)"; fi
    if awk -v t="$took" 'BEGIN { exit !(t < 20) }'; then ok "training again ${took} s after node 2 died (bound 20 s)"
    else bad "training again only ${took} s after node 2 died"; fi
    # node 2 comes back while round 2 runs (held meanwhile, so that it
    # does not finish first): it waits for the next round
    mapfile -t held < <(all_ranks)
    kill -STOP "${held[@]}" 2>/dev/null || true
    node 2
    if wait_for n0.log "dtrain: elastic: node 2 (${addr[2]}) joined; it waits for the next round" 20; then
      ok "node 2 started again waits for the next round"
      kill_node 1
      wait_for n0.log "round 3: 2 nodes, 4 ranks: node 0 (${addr[0]}) ranks 0-1, node 2 (${addr[2]}) ranks 2-3" 30 &&
        ok "node 1 lost: node 2 joins round 3 (nodes 0 and 2)" ||
        bad "round 3 is not nodes 0 and 2" "$(grep '^dtrain' n0.log n2.log)"
    else bad "node 2 did not rejoin" "$(grep '^dtrain' n0.log n2.log)"
      kill -CONT "${held[@]}" 2>/dev/null || true; fi
  else bad "the job did not re-form after node 2 died" "$(cat n0.log n1.log)"; fi
else bad "round 1 saved no checkpoint" "$(cat n0.log n1.log n2.log)"; fi
set +e; wait "${pids[0]}"; rc0=$?; wait "${pids[2]}"; rc2=$?; set -e
out=$(cat n0.log)
if [ "$rc0" = 0 ] && [ "$rc2" = 0 ]; then ok "nodes 0 and 2 finish the job (exit 0)"
else bad "nodes 0 and 2 exit $rc0 and $rc2" "$(tail -30 n0.log; tail -30 n2.log)"; fi
expect_out "every step trained" "[rank 0] step    60/60"
mapfile -t resumed < <(grep -o 'resumed from [^ ]* (step [0-9]*)' n0.log | grep -o '[0-9]*)$' | tr -d ')')
if [ "${#resumed[@]}" = 2 ]; then
  n1=${resumed[0]} n2=${resumed[1]}
  ref ref6 3
  r=$(losses_cmp n0.jsonl 1 "$n1" ref6.jsonl 0) &&
    ok "steps 1-$n1 (3 nodes x 2) equal an uninterrupted 3 x 2 run's bit for bit: $r" ||
    bad "steps 1-$n1 differ from the uninterrupted 3 x 2 run's" "$r"
  for k in 1 2; do
    from=${resumed[k - 1]} to=60
    [ "$k" = 1 ] && to=$n2
    # (round 2 may have saved nothing before node 1 died: both resume at n1)
    [ "$from" -lt "$to" ] || continue
    ref ref4-$k 2 --set checkpoint.resume="\"out/el/ckpt/step-$(printf %08d "$from")\""
    r=$(losses_cmp n0.jsonl $((from + 1)) "$to" ref4-$k.jsonl 0) &&
      ok "steps $((from + 1))-$to (2 x 2, grad_accum 3) equal a 2 x 2 run's resumed from step $from bit for bit: $r" ||
      bad "steps $((from + 1))-$to differ from the 2 x 2 run's resumed from step $from" "$r"
  done
else bad "expected 2 resumes, got ${#resumed[@]}" "$(grep resumed n0.log)"; fi
grep -q "micro 2 x accum 3 x dp 4" n0.log && ok "4 ranks keep the global batch: grad_accum 3" ||
  bad "the 4-rank rounds did not derive grad_accum 3" "$(grep 'micro' n0.log)"
sleep 0.5
left=""; for i in 0 1 2; do left+=$(ns_procs "$i"); done
[ -z "$left" ] && ok "no process left in the namespaces" || bad "processes left" "$(ps -o pid,args -p "${left// /,}")"
job=$(grep -o '(job mn-[0-9a-f]*' n0.log | head -1 | cut -c6-)
left=$(find /dev/shm -maxdepth 1 -name "dtrain-$job*")
[ -z "$left" ] && ok "nothing of the job in /dev/shm" || bad "left in /dev/shm" "$left"
after_fault "three nodes" "" out/el/ckpt "" "" n0.log n1.log n2.log

# ---- node 2's link down: it says nothing, the store cuts it off ------------
# (its launcher's connection stays open; the ranks of nodes 0 and 1 fail
# within launch.timeout = 2 s, and node 2 is taken for lost 2 x 2 + 10 s
# after that first failure)
port=$((port + 2))
tcp=(--set run.comm=tcp --set run.name=part --set launch.timeout=2)
: >n0.log; : >n1.log; : >n2.log
node 0; node 1; node 2
if wait_for n0.log "[rank 0] checkpoint: saved out/part/ckpt/step-00000008" 60; then
  t0=$(date +%s.%N)
  ip -n "${ns[2]}" link set "dte$$v2" down
  set +e; wait "${pids[0]}"; rc0=$?; wait "${pids[1]}"; rc1=$?; set -e
  took=$(since "$t0")
  if grep -qE "^dtrain: elastic: restart 1 of at most 3 after .*node 2 \(${addr[2]}\) did not report within 14 s of the round's first failure: taken for lost; round 2: 2 nodes, 4 ranks" n0.log
  then ok "node 2's link down: the store takes it for lost and nodes 0 and 1 re-form"
  else bad "node 2's link down: no restart naming node 2 cut off" "$(grep '^dtrain' n0.log)"; fi
  [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && grep -qF "[rank 0] step    60/60" n0.log &&
    ok "node 2's link down: nodes 0 and 1 finish the job (${took} s after the link went down)" ||
    bad "node 2's link down: exits $rc0, $rc1" "$(tail -20 n0.log)"
else bad "the partition case saved no checkpoint" "$(tail -20 n0.log)"; fi
for p in $(ns_procs 2); do kill -KILL "$p" 2>/dev/null || true; done
ip -n "${ns[2]}" link set "dte$$v2" up

# ---- node 0 (the store's) killed: the others end, saying why ---------------
port=$((port + 2))
tcp=(--set run.comm=tcp --set run.name=host --set train.steps=100000)
node 0; node 1
if wait_for n0.log "[rank 0] checkpoint: saved out/host/ckpt/" 60; then
  t0=$(date +%s.%N)
  kill_node 0
  set +e; wait "${pids[1]}"; rc1=$?; set -e
  took=$(since "$t0")
  if [ "$rc1" = 1 ] && grep -qE "^dtrain run: error: elastic: lost the job's store at ${addr[0]}:$port \(node 0's launcher\): (the connection closed|Connection reset by peer); the job cannot re-form without node 0 \(it hosts the store, as torchrun's c10d store does\)" n1.log
  then ok "node 0 killed: node 1 exits 1 naming the lost store (${took} s)"
  else bad "node 0 killed: node 1 exit $rc1 without naming the lost store" "$(tail -20 n1.log)"; fi
else bad "the two-node job saved no checkpoint" "$(tail -20 n0.log)"; fi
sleep 0.3
left=""; for i in 0 1 2; do left+=$(ns_procs "$i"); done
[ -z "$left" ] && ok "node 0 killed: no process left" || bad "node 0 killed: processes left" "$(ps -o pid,args -p "${left// /,}")"
finish
