#!/usr/bin/env bash
# `dtrain run` as the launcher of its local ranks, and `dtrain bench comm`:
# output carries "[rank R] " prefixes, a rank that dies stops the job fast
# with a line naming it and leaves no shared memory (the launcher has the
# comm plugin's cleanup_job remove it, with the plugin's config), SIGTERM
# (and SIGKILL) to the launcher leaves no rank behind, bad nproc values and
# a clash with an outer launcher's world size are config errors, ranks
# started torchrun-style by hand join one job and train exactly like
# launched ones, a job on several nodes is checked before any rank starts
# (an unresolvable master_addr at once), two nodes with different secrets
# both say so, and the comm benchmark prints its table and catches a wrong
# result.
set -euo pipefail
bin=$1 work=$2 fakes=${3:-}
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
tag="lt$$"   # marks this run's processes and files
export DTRAIN_LOG=info   # the device's info line is rank 1's only output in a run

final_loss() { losses "$1" | tail -n 1; }

expect_exit 0 "data prepare" "$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin
toml_from gpt2_2layer tiny.toml \
  '[run]' 'log_every = 1' \
  '[train]' 'micro_batch = 2' '-global_batch' \
  '[launch]' 'timeout = 20.0'

# ---- launched ranks train; every line carries its rank ----
expect_exit 0 "nproc=2 run" "$bin" run tiny.toml --set launch.nproc=2 --set run.name=l2 \
  --metrics l2.jsonl
expect_out "launcher announces the job" "dtrain: launching 2 ranks (job "
expect_out "rank 0's lines are prefixed" "[rank 0] step     6/6"
expect_out "rank 1's lines are prefixed" "[rank 1] "
expect_out "the run has 2 data-parallel ranks" "x dp 2)"
stray=$(printf '%s\n' "$out" | grep -v -e '^\[rank [01]\] ' -e '^dtrain: ' || true)
if [ -z "$stray" ]; then ok "no line without a rank prefix (no mid-line mixing)"
else bad "lines without a rank prefix" "$stray"; fi
if [ "$(printf '%s\n' "$out" | grep -c '^\[rank [01]\] \[rank')" = 0 ]; then
  ok "log lines already tagged are not tagged twice"
else bad "doubled prefix" "$out"; fi
l2_loss=$(final_loss l2.jsonl)

# ---- a rank that dies stops the job, named, without leftovers ----
# (the leftovers are the comm plugin's to remove: the launcher calls its
# cleanup_job once every rank is gone)
job="$tag-kill"
: > "/dev/shm/dtrain-$job-g9c9"   # what a crashed split could leave
start=$(date +%s)
DTRAIN_JOB_ID=$job "$bin" run tiny.toml --set launch.nproc=2 --set run.name=kill \
  --set train.steps=1000000 > kill.log 2>&1 & lpid=$!
if wait_for kill.log "[rank 0] step     2/" 30 && victim=$(rank_pid "$lpid" 1); then
  kill -KILL "$victim"
  set +e; wait "$lpid"; code=$?; set -e
  secs=$(( $(date +%s) - start ))
  out=$(cat kill.log)
  if [ "$code" = 1 ]; then ok "launcher exits 1 when rank 1 is killed"; else bad "exit $code, expected 1" "$out"; fi
  if [ "$secs" -lt 20 ]; then ok "stopped within the timeout (${secs} s)"; else bad "took ${secs} s" "$out"; fi
  # (rank 0 may notice the death itself before the launcher stops it, so
  # "stopped the other 1 rank" is not asserted)
  expect_out "names the failed rank and signal" "dtrain: rank 1 failed (killed by SIGKILL)"
  after_fault "rank 1 killed" "$job" out "" ""
else
  kill -KILL "$lpid" 2>/dev/null || true
  bad "killed-rank run did not reach step 2" "$(cat kill.log)"
fi
rm -f "/dev/shm/dtrain-$job-g9c9"

# ---- the comm plugin cleans up after the ranks, with its own config ----
# (the fake comm plugin of the loader tests records each cleanup_job call
# as a file named after the job; its single-rank collectives make the two
# ranks' results wrong, which is not what is checked here)
if [ -n "$fakes" ]; then
  mkdir -p cleaned
  set +e
  out=$(DTRAIN_PLUGIN_PATH=$fakes DTRAIN_JOB_ID=$tag-clean "$bin" bench comm --comm fake \
    --nproc 2 --sizes 4K:4K --set fake.cleanup_dir="$PWD/cleaned" 2>&1)
  set -e
  [ "$(ls cleaned)" = "$tag-clean" ] && ok "the launcher had the comm plugin clean up job $tag-clean" ||
    bad "no cleanup_job call for job $tag-clean: $(ls cleaned)" "$out"
fi

# ---- a rank that fails on its own: its exit code and error line ----
# (a checkpoint to resume from that is not there: found by the ranks, not
# by the launching process, which checks only what needs no plugin instance)
expect_exit 1 "a rank's own failure ends the job with its code" "$bin" run tiny.toml \
  --set launch.nproc=2 --set checkpoint.resume=missing/step-1
# both ranks miss it; whichever fails first is named, with its line
if grep -qE "^\[rank [01]\] dtrain run: error: checkpoint 'missing/step-1'" <<<"$out"; then
  ok "the rank's error line is relayed, prefixed"; else bad "no prefixed error line" "$out"; fi
if grep -qE "^dtrain: rank [01] failed \(exit 1\)(; stopped the other 1 rank)?; its last error line: dtrain run: error: checkpoint 'missing/step-1'" <<<"$(tail -n 1 <<<"$out")"; then
  ok "the last line names the rank and repeats its error"; else bad "bad summary line" "$out"; fi

# ---- SIGTERM to the launcher stops every rank ----
cp tiny.toml "sigterm-$tag.toml"
DTRAIN_JOB_ID=$tag-term "$bin" run "sigterm-$tag.toml" --set launch.nproc=2 --set run.name=term \
  --set train.steps=1000000 > term.log 2>&1 & lpid=$!
if wait_for term.log "[rank 0] step     2/" 30; then
  kill -TERM "$lpid"
  set +e; wait "$lpid"; code=$?; set -e
  out=$(cat term.log)
  if [ "$code" = 143 ]; then ok "SIGTERM: launcher exits 128+15"; else bad "exit $code, expected 143" "$out"; fi
  expect_out "SIGTERM passed on" "dtrain: got SIGTERM: passed it on to 2 ranks"
  expect_out "SIGTERM summary" "dtrain: stopped by SIGTERM"
  if pgrep -f "sigterm-$tag" >/dev/null; then bad "ranks left running" "$(pgrep -af "sigterm-$tag")"
  else ok "no rank left after SIGTERM"; fi
  after_fault "SIGTERM" "$tag-term" out "" ""
else
  kill -KILL "$lpid" 2>/dev/null || true
  bad "SIGTERM run did not reach step 2" "$(cat term.log)"
fi

# ---- SIGKILL to the launcher: the ranks die with it ----
cp tiny.toml "sigkill-$tag.toml"
"$bin" run "sigkill-$tag.toml" --set launch.nproc=2 --set run.name=skill \
  --set train.steps=1000000 > skill.log 2>&1 & lpid=$!
if wait_for skill.log "[rank 0] step     2/" 30; then
  kids=$(pgrep -P "$lpid" | tr '\n' ' ')
  kill -KILL "$lpid"; wait "$lpid" 2>/dev/null || true
  gone=1
  for k in $kids; do wait_gone "$k" 10 || gone=0; done
  if [ "$gone" = 1 ] && [ -n "$kids" ]; then ok "ranks die with a SIGKILLed launcher"
  else bad "ranks survived the launcher" "$(pgrep -af "sigkill-$tag")"; pkill -KILL -f "sigkill-$tag" || true; fi
else
  kill -KILL "$lpid" 2>/dev/null || true
  bad "SIGKILL run did not reach step 2" "$(cat skill.log)"
fi

# ---- bad nproc ----
expect_exit 2 "nproc = 0" "$bin" run tiny.toml --set launch.nproc=0
expect_out "nproc = 0 explained" "[launch] nproc = 0 is out of range (allowed 1 .. 256)"
expect_exit 2 "nproc above 4 per CPU" taskset -c 0 "$bin" run tiny.toml --set launch.nproc=5
expect_out "nproc limit explained" "launch.nproc = 5 (from --set) is more local ranks than this machine can run: the limit is 4"

# ---- under another launcher: no spawning, and nproc must agree ----
expect_exit 2 "nproc vs torchrun WORLD_SIZE" env RANK=0 WORLD_SIZE=2 "$bin" run tiny.toml \
  --set launch.nproc=3
expect_out "both numbers and their sources" "launch.nproc = 3 (from --set) asks for 3 local ranks, but torchrun started this process as one of 2 local ranks (WORLD_SIZE = 2)"
sed 's/^\[launch\]$/[launch]\nnproc = 4/' tiny.toml > n4.toml
expect_exit 2 "nproc in the file vs Open MPI" env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 \
  "$bin" run n4.toml
expect_out "file and Open MPI named" "launch.nproc = 4 (set in n4.toml) asks for 4 local ranks, but Open MPI started this process as one of 2 local ranks (OMPI_COMM_WORLD_SIZE = 2)"
expect_exit 2 "half a launcher environment" env WORLD_SIZE=2 "$bin" run tiny.toml
expect_out "half environment named" "WORLD_SIZE is set but RANK is not"

# ---- torchrun-style ranks started by hand join one job ----
port=$(( 20000 + $$ % 20000 ))
for r in 0 1; do
  env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$bin" run tiny.toml --set run.name=tr --metrics tr.jsonl \
    > "tr$r.log" 2>&1 &
  eval "tpid$r=\$!"
done
set +e; wait "$tpid0"; c0=$?; wait "$tpid1"; c1=$?; set -e
if [ "$c0" = 0 ] && [ "$c1" = 0 ]; then ok "both torchrun-style ranks finish"
else bad "torchrun-style ranks exited $c0 and $c1" "$(cat tr0.log tr1.log)"; fi
out=$(cat tr0.log)
expect_out "they form one 2-rank job" "x dp 2)"
tr_loss=$(final_loss tr.jsonl)
if [ -n "$tr_loss" ] && [ "$tr_loss" = "$l2_loss" ]; then
  ok "same final loss as the launched run ($tr_loss)"
else bad "final loss $tr_loss, launched run $l2_loss"; fi

# ---- several nodes: the combination is checked before any rank starts ----
expect_exit 2 "node_rank not below nnodes" env DTRAIN_JOB_SECRET=s "$bin" run tiny.toml \
  --nnodes 2 --node-rank 2 --master-addr 127.0.0.1
expect_out "node_rank and nnodes named" "launch.node_rank = 2 (from the command line) is not below launch.nnodes = 2 (from the command line): nodes are numbered 0 to nnodes - 1"
expect_exit 2 "nnodes without a job secret" env -u DTRAIN_JOB_SECRET "$bin" run tiny.toml \
  --nnodes 2 --node-rank 0 --master-addr 127.0.0.1
expect_out "the secret asked for" "launch.nnodes = 2 (from the command line) needs DTRAIN_JOB_SECRET in the environment, the same on every node"
expect_exit 2 "nnodes without master_addr" env -u MASTER_ADDR DTRAIN_JOB_SECRET=s "$bin" run \
  tiny.toml --nnodes 2
expect_out "master_addr asked for" "launch.nnodes = 2 (from the command line) needs launch.master_addr (--master-addr): the address of node 0 that every node can reach"
expect_exit 2 "nnodes against torchrun's world" env RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 \
  "$bin" run tiny.toml --nnodes 2
expect_out "nnodes and torchrun named" "launch.nnodes = 2 (from the command line), but torchrun started this process as one of 2 ranks, 2 of them on this node"

# an address that can never resolve is refused at once by the launching
# process, naming it and the resolver's error ('!' fails glibc's own check,
# with or without DNS; before, each rank retried it until launch.timeout
# and exited 1)
t0=$(date +%s)
expect_exit 2 "an unresolvable master_addr" env DTRAIN_JOB_SECRET=s "$bin" run tiny.toml \
  --nnodes 2 --node-rank 1 --master-addr 'no_such_host!' --set launch.timeout=20
expect_out "named with the resolver's error" "dtrain run: error: launch.master_addr = 'no_such_host!' (from the command line): cannot resolve 'no_such_host!': Name or service not known (EAI_NONAME): it must name node 0 so that every node can reach it"
if [ $(( $(date +%s) - t0 )) -lt 10 ] && ! grep -qF "launching" <<<"$out"; then
  ok "refused before any rank started, not after launch.timeout"
else bad "an unresolvable master_addr was not refused at once" "$out"; fi

# ---- two nodes on this machine's loopback: the job forms, shm refuses it ----
port=$(( 20000 + ($$ + 7) % 20000 ))
for n in 0 1; do
  env DTRAIN_JOB_SECRET=loop$$ "$bin" run tiny.toml --nnodes 2 --node-rank $n \
    --master-addr 127.0.0.1 --master-port $port --set launch.timeout=5 > "node$n.log" 2>&1 &
  eval "npid$n=\$!"
done
set +e; wait "$npid0"; c0=$?; wait "$npid1"; c1=$?; set -e
out=$(cat node0.log node1.log)
ids=$(grep -ho 'rendezvous: rank [01] of 2 joined job [^ ]*' node0.log node1.log | awk '{print $NF}' | sort -u)
if [ "$(wc -l <<<"$ids")" = 1 ] && [[ "$ids" == mn-* ]] && grep -q "^\[rank 0\] rendezvous: rank 0 of 2 joined job $ids" node0.log; then
  ok "two nodes of one rank each meet and agree on the job id ($ids)"
else bad "the nodes did not agree on a job id" "$out"; fi
expect_out "node 1 runs global rank 1" "dtrain: launching rank 1 of 2 (job $ids)"
expect_out "shm refuses ranks on several nodes" "comm/shm: init: the job spans several nodes (1 of its 2 ranks on this one)"
if [ "$c0" = 2 ] && [ "$c1" = 2 ]; then ok "both nodes exit 2"; else bad "nodes exited $c0 and $c1" "$out"; fi

# ---- two nodes, one with another secret: both say so ----
# (node 1 is refused at once, told its DTRAIN_JOB_SECRET differs; node 0
# logs the refusal and its timeout names where the wrong proof came from;
# neither prints either secret)
port=$(( 20000 + ($$ + 11) % 20000 ))
for n in 0 1; do
  env DTRAIN_JOB_SECRET="sec$n-$$" "$bin" run tiny.toml --nnodes 2 --node-rank $n \
    --master-addr 127.0.0.1 --master-port $port --set run.comm=tcp --set launch.timeout=3 \
    > "wrong$n.log" 2>&1 &
  eval "npid$n=\$!"
done
set +e; wait "$npid0"; c0=$?; wait "$npid1"; c1=$?; set -e
out=$(cat wrong0.log wrong1.log)
if [ "$c1" = 2 ] && grep -qF "[rank 1] dtrain run: error: rendezvous: rank 1 of 2: rank 0 at 127.0.0.1:$port refused this rank's proof of the job secret: DTRAIN_JOB_SECRET on this node differs from rank 0's" wrong1.log
then ok "the node with another secret is told so (exit 2)"
else bad "node 1 (another secret) exited $c1" "$out"; fi
if [ "$c0" = 1 ] && grep -qF "[rank 0] rendezvous: refused a connection from 127.0.0.1:" wrong0.log &&
   grep -qF "it claims rank 1 of 2 but its proof of the job secret is wrong (DTRAIN_JOB_SECRET differs on its node, or it is another job's rank)" wrong0.log &&
   grep -qE "timed out after 3 s: rank 1 of 2 never joined \(joined: 0\); a connection from 127\.0\.0\.1:[0-9]+ claiming rank 1 failed the job secret check: is DTRAIN_JOB_SECRET the same on every node\?" wrong0.log
then ok "node 0 logs the refusal and its timeout names the secret"
else bad "node 0 exited $c0 without naming the secret mismatch" "$out"; fi
if grep -qF -e "sec0-$$" -e "sec1-$$" <<<"$out"; then bad "a secret was printed" "$out"
else ok "neither secret is printed"; fi

# ---- dtrain bench comm ----
expect_exit 0 "bench comm, 2 ranks" "$bin" bench comm --nproc 2 --sizes 4K:1M
expect_out "table header with busbw" "busbw(GB/s)"
expect_out "largest size row" "     1048576       262144    f32    sum"
rows=$(printf '%s\n' "$out" | grep -cE '^ +[0-9]+ +[0-9]+ +f32 +sum .* 0$' || true)
if [ "$rows" = 9 ]; then ok "9 unprefixed, checked rows (4K..1M)"; else bad "$rows rows" "$out"; fi
expect_exit 0 "bench comm, 3 ranks" "$bin" bench comm --nproc 3 --sizes 1M:1M --iters 20
# Both columns are printed to 0.01 GB/s, so on a slow machine (algbw 0.30)
# their ratio moves by several percent from rounding alone: compare busbw
# with algbw x 4/3 within the two printed values' rounding (0.005 each,
# the second scaled by 4/3) instead.
bw=$(awk '$1 == 1048572 || $1 == 1048576 { print $6, $7 }' <<<"$out")
if [ -n "$bw" ] && awk -v a="${bw% *}" -v b="${bw#* }" \
     'BEGIN { d = b - a * 4 / 3; if (d < 0) d = -d; exit !(a > 0 && d <= 0.005 * (1 + 4 / 3) + 1e-9) }'; then
  ok "all_reduce busbw = algbw x 2(n-1)/n for n = 3 (algbw, busbw: $bw)"
else bad "algbw, busbw = '$bw', expected busbw = algbw x 4/3 to the printed 0.01" "$out"; fi
if has_test_hooks "$bin"; then
  expect_exit 1 "a wrong result fails" env DTRAIN_TEST_BENCH_CORRUPT=1 "$bin" bench comm \
    --nproc 2 --sizes 4K:8K --op all_gather
  expect_out "wrong result names op, size and rank" "rank 1: all_gather (f32) of 4096 bytes: 1 of 1024 elements wrong"
  expect_out "table marks it" "WRONG"
  expect_out "launcher names the rank" "dtrain: rank 1 failed (exit 1)"
  expect_out "rank 1's own (untagged) line gets its prefix" "[rank 1] dtrain bench comm: error: rank 1: all_gather"
else
  skip "bench comm: a wrong result fails" "test hooks (DTRAIN_TEST_BENCH_CORRUPT) compiled out of $bin"
fi
# --sym: all_reduce in place on shm's symmetric memory, every size checked
expect_exit 0 "bench comm --sym, 3 ranks" "$bin" bench comm --nproc 3 --sizes 4K:1M --sym
expect_out "--sym says so in the header" "# dtrain bench comm: all_reduce in place on symmetric memory, 3 ranks, comm shm"
rows=$(printf '%s\n' "$out" | grep -cE '^ +[0-9]+ +[0-9]+ +f32 +sum .* 0$' || true)
if [ "$rows" = 9 ]; then ok "--sym: 9 checked rows (4K..1M)"; else bad "--sym: $rows rows" "$out"; fi
if has_test_hooks "$bin"; then
  expect_exit 1 "--sym: a wrong result fails" env DTRAIN_TEST_BENCH_CORRUPT=1 "$bin" bench comm \
    --nproc 2 --sizes 4K:8K --sym
  expect_out "--sym: wrong result named" "rank 1: all_reduce (f32 sum) of 4096 bytes: 1 of 1024 elements wrong"
fi
expect_exit 1 "--sym with shm.symmetric = false" "$bin" bench comm --nproc 2 --sizes 4K:4K --sym \
  --set shm.symmetric=false
expect_out "--sym refusal names the key" "comm/shm: symmetric memory is off (shm.symmetric = false)"
expect_exit 0 "bench comm --sym reduce_scatter, 2 ranks" "$bin" bench comm --nproc 2 \
  --sizes 64K:1M --sym --op reduce_scatter --redop avg
expect_out "--sym reduce_scatter header" "# dtrain bench comm: reduce_scatter on symmetric memory, 2 ranks"
expect_exit 0 "bench comm --sym all_gather, 3 ranks" "$bin" bench comm --nproc 3 \
  --sizes 64K:1M --sym --op all_gather
rows=$(printf '%s\n' "$out" | grep -cE '^ +[0-9]+ +[0-9]+ +f32 +- .* 0$' || true)
if [ "$rows" = 5 ]; then ok "--sym all_gather: 5 checked rows"; else bad "--sym all_gather: $rows rows" "$out"; fi
expect_exit 2 "--sym is for all_reduce, reduce_scatter, all_gather" "$bin" bench comm --sym \
  --op broadcast
expect_out "--sym with another op explained" "--sym times all_reduce (in place), reduce_scatter and all_gather, not broadcast"
expect_exit 2 "bench comm: unknown op" "$bin" bench comm --op allreduce
expect_out "unknown op named" "unknown --op 'allreduce'"
expect_exit 2 "bench without a benchmark" "$bin" bench
expect_exit 0 "bench --help" "$bin" bench --help
expect_out "bench --help shows usage" "usage: dtrain bench comm"
expect_exit 2 "bench comm --nproc above the limit" taskset -c 0 "$bin" bench comm --nproc 5
expect_out "bench nproc limit explained" "--nproc = 5 (from the command line) is more local ranks than this machine can run: the limit is 4"
finish
