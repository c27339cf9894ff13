#!/usr/bin/env bash
# The collective ledger (issue 27, item 3): every rank keeps its last
# communicator calls (core/interpose/ledger.c); after a failed collective
# the ranks hand them to rank 0 (core/launch/ledger_exchange.c; across
# nodes: test_netns_ledger.sh),
# which names the first call where they differ.  A tiny GPT-2 (2 layers,
# n_embd 32) on shm with a 3 s timeout:
#  - one rank issues a different collective at step 2 (DTRAIN_FAULT_DIVERGE,
#    a test hook): every rank exits 1 within seconds and its last line is
#    the same ledger line naming the rank, the step and both calls; the
#    launcher quotes it; ddp (all_reduce), zero-2 (reduce_scatter) and
#    HYBRID_SHARD (a split group, named by its members), and over tcp;
#    and one that hangs: the broadcast on the world group while the others
#    are in their shard groups, found after the collectives time out;
#  - a rank killed (DTRAIN_FAULT_KILL_AT_BACKWARD) under an external
#    launcher: the survivors' ledgers agree, the line names the dead rank
#    after the timeout and invents no divergence, and the last line is
#    still the communicator's error naming the dead rank; with rank 0
#    (which compares) killed, the others say they could not compare and
#    name their own last call, within about a second;
#  - under dtrain's launcher a killed rank is named as before, with no
#    divergence.
# The comparison's cases one by one: unit.test_ledger.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
if ! has_test_hooks "$bin"; then
  skip "ledger" "this build has no test hooks (DTRAIN_FAULT_DIVERGE)"; finish; exit
fi
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer s.toml \
  '[model]' 'n_head = 4' 'context = 16' \
  '[train]' 'steps = 4' 'global_batch = 4' 'micro_batch = 2' 'seq_len = 16' 'warmup_steps = 1' \
  '[checkpoint]' 'every = 0' \
  '[launch]' 'timeout = 3.0'

ms() { echo $(( ($(date +%s%N) - t0) / 1000000 )); }

# diverge NAME N R:S WANT ARGS...: N ranks under dtrain's launcher, rank R
# issuing a broadcast in place of its first collective of step S; exit 1,
# every rank's last line and the launcher's quote are WANT, within 20 s
# (one micro-batch of 2 per rank and step)
diverge() {
  local name=$1 n=$2 at=$3 want=$4; shift 4
  t0=$(date +%s%N)
  DTRAIN_FAULT_DIVERGE=$at expect_exit 1 "$name: one rank issues another collective" \
    "$bin" run s.toml --set launch.nproc="$n" --set train.global_batch=$((2 * n)) \
    --set run.name="$name" "$@"
  local took; took=$(ms)
  local r last good=0
  for ((r = 0; r < n; r++)); do
    last=$(grep "^\[rank $r\] " <<<"$out" | tail -n 1)
    [ "$last" = "[rank $r] $want" ] && good=$((good + 1))
  done
  if [ $good = "$n" ]; then ok "$name: every rank's last line names the divergence"
  else bad "$name: expected every rank's last line to be '[rank R] $want'" "$out"; fi
  expect_out "$name: the launcher quotes it" "its last error line: $want"
  if [ "$took" -lt 20000 ]; then ok "$name: over in $took ms"
  else bad "$name: took $took ms" "$out"; fi
}

diverge ddp 3 1:2 "ledger: rank 1 issued broadcast(f32, 34.2K, root 0, world group) #9 at step 2, micro-batch 0, unit 0 while ranks 0, 2 issued all_reduce(f32, 34.2K, avg, world group) #9 at step 2, micro-batch 0, unit 0"
diverge zero2 4 3:2 "ledger: rank 3 issued broadcast(f32, 8544, root 0, world group) #9 at step 2, micro-batch 0, unit 0 while ranks 0-2 issued reduce_scatter(f32, 8544, avg, world group) #9 at step 2, micro-batch 0, unit 0" \
  --set parallel.data=zero --set zero.stage=2
diverge hybrid 4 3:2 "ledger: rank 2 issued all_gather(f32, 4352, group of ranks 2, 3) #16 at step 2, micro-batch 0, unit 0 while rank 3 issued broadcast(f32, 4352, root 0, group of ranks 2, 3) #16 at step 2, micro-batch 0, unit 0" \
  --set parallel.data=fsdp --set fsdp.sharding_strategy=HYBRID_SHARD --set fsdp.hybrid_group_size=2
# on the world group while the others are inside their shard groups'
# collectives: nobody notices a mismatch; every wait runs out (3 s), then
# the ranks compare
diverge hang 4 3:2:world "ledger: rank 3 issued broadcast(f32, 4352, root 0, world group) #6 at step 2, micro-batch 0, unit 0 while ranks 0-2 issued nothing on the world group after #5" \
  --set parallel.data=fsdp --set fsdp.sharding_strategy=HYBRID_SHARD --set fsdp.hybrid_group_size=2
port=$((20000 + ($$ * 7) % 20000))
diverge tcp 3 1:2 "ledger: rank 1 issued broadcast(f32, 34.2K, root 0, world group) #8 at step 2, micro-batch 0, unit 0 while ranks 0, 2 issued all_reduce(f32, 34.2K, avg, world group) #8 at step 2, micro-batch 0, unit 0" \
  --set run.comm='"tcp"' --set launch.master_port=$port

# a rank killed, under an external launcher (nobody stops the others):
# ranks 0 and 1 agree, rank 2 is named, the last line is the error
job="ledger$$"
t0=$(date +%s%N)
pids=()
for r in 0 1 2; do
  if [ $r = 2 ]; then export DTRAIN_FAULT_KILL_AT_BACKWARD=2:0; fi
  DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=3 DTRAIN_LOCAL_RANK=$r DTRAIN_LOCAL_SIZE=3 \
    DTRAIN_JOB_ID=$job "$bin" run s.toml --set train.global_batch=6 --set run.name=killed \
    >"k$r.log" 2>&1 &
  pids+=($!)
  unset DTRAIN_FAULT_KILL_AT_BACKWARD
done
codes=""
for p in "${pids[@]}"; do set +e; { wait "$p"; } 2>/dev/null; codes="$codes $?"; set -e; done
took=$(ms)
if [ "$codes" = " 1 1 137" ]; then ok "killed: the survivors exit 1 (exit codes$codes)"
else bad "killed: exit codes$codes, expected 1 1 137" "$(cat k0.log k1.log)"; fi
agree="ledger: ranks 0, 1 issued the same calls (rank 0's last: all_reduce(f32, 1, avg, world group) #10 at step 2, micro-batch 0, unit 0); rank 2 sent no ledger within 3 s"
for r in 0 1; do
  out=$(cat "k$r.log")
  expect_out "killed: rank $r's ledger line names the dead rank, no divergence" "[rank $r] $agree"
  if grep -q " while " "k$r.log"; then bad "killed: rank $r invented a divergence" "$out"
  else ok "killed: rank $r names no divergence"; fi
  last=$(tail -n 1 "k$r.log")
  case "$last" in
    *"dtrain run: error: "*"rank 2 (pid "*") died") ok "killed: rank $r's last line is the error naming rank 2" ;;
    *) bad "killed: rank $r's last line: $last" "$out" ;;
  esac
done
if [ "$took" -lt 15000 ]; then ok "killed: over in $took ms (the exchange waits at most the 3 s timeout)"
else bad "killed: took $took ms"; fi

# rank 0, which compares, killed: the others say so within about a
# second and name their own last call; no divergence
job="ledger0$$"
t0=$(date +%s%N)
pids=()
for r in 0 1 2; do
  if [ $r = 0 ]; then export DTRAIN_FAULT_KILL_AT_BACKWARD=2:0; fi
  DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=3 DTRAIN_LOCAL_RANK=$r DTRAIN_LOCAL_SIZE=3 \
    DTRAIN_JOB_ID=$job "$bin" run s.toml --set train.global_batch=6 --set run.name=killed0 \
    --set launch.timeout=30 \
    >"z$r.log" 2>&1 &
  pids+=($!)
  unset DTRAIN_FAULT_KILL_AT_BACKWARD
done
codes=""
for p in "${pids[@]}"; do set +e; { wait "$p"; } 2>/dev/null; codes="$codes $?"; set -e; done
took=$(ms)
if [ "$codes" = " 137 1 1" ]; then ok "rank 0 killed: the others exit 1"
else bad "rank 0 killed: exit codes$codes, expected 137 1 1" "$(cat z1.log z2.log)"; fi
for r in 1 2; do
  out=$(cat "z$r.log")
  expect_out "rank 0 killed: rank $r says the ledgers were not compared" \
    "[rank $r] ledger: not compared: rank 0, which compares the ledgers, is gone; this rank's last: all_reduce(f32, 1, avg, world group) #10 at step 2"
  case "$(tail -n 1 "z$r.log")" in
    *"dtrain run: error: "*"rank 0 (pid "*") died") ok "rank 0 killed: rank $r's last line is the error" ;;
    *) bad "rank 0 killed: rank $r's last line" "$out" ;;
  esac
done
if [ "$took" -lt 15000 ]; then ok "rank 0 killed: over in $took ms (not the 30 s timeout)"
else bad "rank 0 killed: took $took ms"; fi

# under dtrain's launcher the survivors are stopped; the dead rank is named
export DTRAIN_FAULT_KILL_AT_BACKWARD=2:0
expect_exit 1 "killed under the launcher" "$bin" run s.toml --set launch.nproc=2 \
  --set train.global_batch=4 --set run.name=k2
unset DTRAIN_FAULT_KILL_AT_BACKWARD
expect_out "killed under the launcher: the launcher names the dead rank" "failed (killed by SIGKILL)"
if grep -q " while " <<<"$out"; then bad "killed under the launcher: a divergence was invented" "$out"
else ok "killed under the launcher: no divergence named"; fi
finish
