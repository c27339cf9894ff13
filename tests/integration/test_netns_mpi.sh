#!/usr/bin/env bash
# A 2-node x 2-rank job under Open MPI's mpirun across two network
# namespaces (netns_lib.sh: a veth pair, 10.77.0.1 in ns0, 10.77.0.2 in
# ns1) with run.comm = "mpi", so the training bytes between the nodes move
# over the link:
#  - mpirun runs in ns0; a launch agent (plm_rsh_agent, standing in for
#    ssh) starts the remote orted with `ip netns exec ns1`; the hostfile
#    names the two addresses with slots=2; each node has a host name of
#    its own; vader inside a node, TCP over the veth subnet between them
#    (netns_lib.sh: netns_mpirun says why);
#  - the losses equal the single-node 4-rank shm run within 1e-5 (MPI adds
#    4 ranks' gradients in an order of its own; integration.mpi_run
#    measured 4.8e-7 at 4 ranks, one node);
#  - the link really carries them: node 0's veth receives at least the
#    gradient bytes x steps (to finish an all-reduce, node 0 must learn
#    the sum of node 1's gradients: one full f32 vector per step at least;
#    the gradient size is 4 x the params elements `ckpt inspect` lists);
#  - node 1's ranks killed (SIGKILL, from inside ns1) mid-training:
#    Open MPI ends the job (its orted sees the ranks die and mpirun stops
#    the survivors, before any dtrain timeout): mpirun exits 137 within
#    15 s naming the killed rank and node 1's address (every rank is
#    stopped for the moment the checkpoint before the kill is read); no
#    process left in either namespace, nothing of the job in /dev/shm, the
#    checkpoint saved before the kill verifies, unchanged, and a
#    single-node 4-rank shm run resumes from it (and removes the step-N.tmp
#    of a save the kill cut short: Open MPI kills the survivors, which
#    print nothing and do not clean up);
#  - the link taken down mid-training: TCP sees nothing (no reset), so
#    every rank's wait runs into the comm timeout ([launch] timeout = 4 s)
#    and fails naming the operation and the ranks it waited for; all four
#    exit within 10 s.  mpirun then cannot reach its daemon in ns1 to end
#    the job: with the link back up it ends it, exit 1, naming the first
#    rank that failed.
# Needs root, `ip netns` and mpirun; otherwise exits 77 (ctest: skipped).
set -euo pipefail
bin=$1 work=$2 mpiexec=$3
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/netns_lib.sh"
if ! command -v "$mpiexec" >/dev/null; then
  echo "SKIP: no mpirun ($mpiexec)"
  exit 77
fi
netns_make

rm -rf "$work"; mkdir -p "$work"; cd "$work"
# sanitizer builds, as in test_mpi_run.sh
export OMPI_MCA_mca_base_component_disable_dlclose=1 PMIX_MCA_mca_base_component_disable_dlclose=1
if [ -n "${LSAN_OPTIONS:-}" ]; then export LSAN_OPTIONS="$LSAN_OPTIONS:fast_unwind_on_malloc=0"; fi

netns_mpirun_setup "$work" "$mpiexec"
# mpirun_bg LOG TIMEOUT ARGS...: 2 nodes x 2 ranks from node 0, in the
# background (pid in $mp, appended to pids)
mpirun_bg() {
  local log=$1 limit=$2; shift 2
  netns_mpirun "$limit" 2 2 "$@" >"$log" 2>&1 &
  mp=$!
  pids+=("$mp")
}
# wait_for FILE TEXT: until FILE holds TEXT (at most 20 s)
wait_for() {
  for _ in $(seq 400); do grep -qF -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  return 1
}
# what Open MPI and dtrain leave in /dev/shm: vader's segments (the node
# names in them are this test's) and dtrain's of the job
# ("dtrain-ompi-<uid>-<jobid>": world.c; the job id read from a rank's
# environment, since other mpirun jobs may run beside this test)
vader_globs=("vader_segment.node0.*" "vader_segment.node1.*")
job_glob() {
  local id
  id=$(tr '\0' '\n' <"/proc/$1/environ" | sed -n 's/^OMPI_MCA_ess_base_jobid=//p')
  echo "dtrain-ompi-$(id -u)-${id:-unknown}*"
}

"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer eq.toml \
  '[run]' 'comm = "mpi"' \
  '[train]' 'global_batch = 16' '-warmup_steps' \
  '[launch]' 'timeout = 4.0' \
  '[checkpoint]' 'keep = 3'

# ---- the 2 x 2 job trains across the link --------------------------------
expect_exit 0 "shm, 1 node x 4 ranks" "$bin" run eq.toml --set run.comm=shm --nproc 4 \
  --set run.name=one --metrics one.jsonl
rx0=$(rx_bytes)
mpirun_bg two.log 60 "$bin" run eq.toml --set run.name=two --metrics two.jsonl
set +e; wait "$mp"; rc=$?; set -e
rx1=$(rx_bytes)
out=$(cat two.log)
if [ "$rc" = 0 ]; then ok "mpi, 2 nodes x 2 ranks under mpirun across the namespaces (exit 0)"
else bad "the 2 x 2 mpirun job failed (exit $rc)" "$out"; fi
for r in 0 1 2 3; do expect_out "rank $r of the job reports" "[rank $r] device/cpu"; done
same_losses "2 nodes x 2 ranks (mpi over the veth) vs 1 node x 4 ranks (shm)" one.jsonl two.jsonl 1e-5
elems=$("$bin" ckpt inspect out/two/ckpt/step-00000006 | awk '$1 ~ /\/params$/ { n += $3 } END { print n + 0 }')
need=$((elems * 4 * 6))
if [ "$elems" -gt 0 ] && [ $((rx1 - rx0)) -ge "$need" ]; then
  ok "node 0's veth received $((rx1 - rx0)) bytes >= $need (gradient $((elems * 4)) bytes x 6 steps)"
else bad "node 0's veth received $((rx1 - rx0)) bytes, less than $need ($elems params)" "$out"; fi
netns_nothing_left "2 x 2 run" "${vader_globs[@]}"

# ---- node 1's ranks killed mid-training -----------------------------------
mpirun_bg kill.log 60 "$bin" run eq.toml --set run.name=kill --set train.steps=100000 \
  --set checkpoint.every=2
if wait_for kill.log "checkpoint: saved"; then
  # every rank stopped (SIGSTOP) while the newest complete checkpoint and
  # its bytes are taken: at this pace a save lands every few ms, and a
  # save needs every rank, so none completes after the kill (keep = 3
  # leaves this one in place)
  mapfile -t all < <(dtrain_ranks)
  jobg=$(job_glob "${all[0]}")
  kill -STOP "${all[@]}"
  step=$(newest_ckpt out/kill/ckpt)
  sums=$(ckpt_sums "$step")
  victims=()
  for p in $(ip netns pids "$ns1"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dtrain ] && victims+=("$p")
  done
  t0=$(date +%s.%N)
  ip netns exec "$ns1" kill -KILL "${victims[@]}"
  kill -CONT "${all[@]}" 2>/dev/null || true
  set +e; wait "$mp"; rc=$?; set -e
  took=$(since "$t0")
  out=$(cat kill.log)
  if [ "${#victims[@]}" = 2 ]; then ok "node 1's two ranks killed inside $ns1 (pids ${victims[*]})"
  else bad "node 1 had ${#victims[@]} dtrain processes, expected 2" "$(ps -o pid,args -p "$(netns_procs | tr ' ' ,)")"; fi
  if [ "$rc" = 137 ]; then ok "mpirun exits 137 (a rank killed by signal 9)"
  else bad "mpirun exit $rc after the kill, expected 137" "$out"; fi
  if grep -qE "^(mpirun|mpiexec) noticed that process rank [23] with PID [0-9]+ on node $a1 exited on signal 9 \(Killed\)\.$" <<<"$out"; then
    ok "mpirun names the killed rank and node 1's address"
  else bad "mpirun does not name the killed rank and node" "$out"; fi
  if awk -v t="$took" 'BEGIN { exit !(t < 15) }'; then ok "the job ended ${took} s after the kill (bound 15 s)"
  else bad "the job took ${took} s to end after the kill" "$out"; fi
  netns_nothing_left "node 1 killed" "${vader_globs[@]}" "$jobg"
  # (no *.tmp check here: Open MPI kills the survivors too, and a save in
  # flight leaves its step-N.tmp; the next run removes it, checked below)
  after_fault "node 1 killed" "" "" "$step" "$sums" kill.log
  # a normal single-node run resumes from it and trains two more steps
  n=$((10#${step##*step-}))
  expect_exit 0 "1 node x 4 ranks resumes from $step" "$bin" run eq.toml --set run.comm=shm --nproc 4 \
    --set run.name=kill --set train.steps=100000 --set train.stop_at=$((n + 2)) \
    --set checkpoint.resume="$step"
  expect_out "the resumed run names the step it starts from" "step $(printf '%5d' $((n + 1)))/100000"
  left=$(find out/kill/ckpt -name '*.tmp*')
  [ -z "$left" ] && ok "node 1 killed: after the resumed run no temporary file in out/kill/ckpt" ||
    bad "node 1 killed: temporary files left after the resumed run" "$left"
else bad "the kill job saved no checkpoint within 20 s" "$(cat kill.log)"; fi

# ---- the link taken down mid-training -------------------------------------
mpirun_bg down.log 60 "$bin" run eq.toml --set run.name=down --set train.steps=100000 \
  --set checkpoint.every=2
if wait_for down.log "checkpoint: saved"; then
  step=$(newest_ckpt out/down/ckpt)
  jobg=$(job_glob "$(dtrain_ranks | head -1)")
  t0=$(date +%s.%N)
  ip -n "$ns0" link set "$v0" down
  for _ in $(seq 200); do [ -z "$(dtrain_ranks)" ] && break; sleep 0.1; done
  took=$(since "$t0")
  left=$(dtrain_ranks)
  if [ -z "$left" ] && awk -v t="$took" 'BEGIN { exit !(t < 10) }'; then
    ok "every rank exited ${took} s after the link went down (comm timeout 4 s, bound 10 s)"
  else bad "ranks $left still there ${took} s after the link went down" "$(cat down.log)"; fi
  # mpirun's daemon in ns1 is out of reach: the link comes back for it
  ip -n "$ns0" link set "$v0" up
  set +e; wait "$mp"; rc=$?; set -e
  out=$(cat down.log)
  # each rank names the operation and the three others it waited for
  got=$(grep -oE 'comm/mpi: [a-z_]+ #[0-9]+ \([a-z0-9]+, [0-9]+ bytes[^)]*\) on group world: timed out after 4\.0 s waiting for one or more of ranks [0-3], [0-3], [0-3]$' <<<"$out" |
        sed 's/.* ranks //' | sort | tr '\n' ';')
  if [ "$got" = "0, 1, 2;0, 1, 3;0, 2, 3;1, 2, 3;" ]; then
    ok "all four ranks time out naming the operation and the ranks they waited for"
  else bad "not every rank names the operation and its peers (got '$got')" "$out"; fi
  if [ "$rc" = 1 ]; then ok "mpirun exits 1 once the link is back"
  else bad "mpirun exit $rc after the link came back, expected 1" "$out"; fi
  if grep -qE '^(mpirun|mpiexec) detected that one or more processes exited with non-zero status' <<<"$out" &&
     grep -qE '^  Exit code: +1$' <<<"$out"; then ok "mpirun names the first rank that exited 1"
  else bad "mpirun does not name a rank's exit 1" "$out"; fi
  netns_nothing_left "link down" "${vader_globs[@]}" "$jobg"
  after_fault "link down" "" out/down/ckpt "" "" down.log
  # saves land every few ms until the link goes down (keep = 3 prunes the
  # one seen above): the newest complete one at the end is checked, and it
  # cannot be older than that one
  seen=$step; step=$(newest_ckpt out/down/ckpt)
  if [ -n "$step" ] && [[ ! "$step" < "$seen" ]]; then
    ok "link down: the newest checkpoint ($step) is not older than the one seen before ($seen)"
  else bad "link down: newest checkpoint '$step' older than $seen" "$(ls -la out/down/ckpt)"; fi
  set +e; v=$("$bin" ckpt inspect "$step" --verify 2>&1); e=$?; set -e
  [ "$e" = 0 ] && ok "link down: $step verifies" || bad "link down: $step fails --verify" "$v"
else bad "the link-down job saved no checkpoint within 20 s" "$(cat down.log)"; fi
finish
