#!/usr/bin/env bash
# Asynchronous checkpoints (checkpoint.async, issue 27): the snapshot taken
# at the step, checksummed and written by a thread, committed at a later
# step boundary.  2 shm ranks of a 2-layer GPT-2 on the cpu:
#   - a commit deferred across steps (test builds: the writer held 400 ms by
#     DTRAIN_FAULT_CKPT_WRITER_DELAY_MS): step 4's save commits after step
#     5 trained and before step 8's save, its line says how long training
#     paused; its shards equal a synchronous save's byte for byte and
#     verify, and a run resumed from it trains steps 5-8 to the
#     uninterrupted run's losses bit for bit
#   - a rank killed (SIGKILL) in the middle of its writer thread's write
#     of step 4 (it stops itself where its byte budget runs out): the
#     other rank exits 1 naming it, step 2 is intact byte for byte, no
#     temporary file is left, and a resume from it trains to the
#     uninterrupted run's losses bit for bit
#   - a rank whose disk fills in the writer thread: both ranks exit 1 at a
#     step boundary, the failing one naming the shard file, the other the
#     failing rank; step 2 intact, step 4 never appears
#   - rank 0's commit thread failing to write the manifest: both ranks
#     exit 1, rank 0 naming the file, rank 1 saying rank 0 could not
#     commit; step 2 intact, step 4 never appears
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
losses_cmp() { /usr/bin/python3 "$here/elastic_cmp.py" "$@"; }

expect_exit 0 "data prepare" "$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin
cat > as.toml <<'T'
[run]
comm = "shm"
out_dir = "out"
[model]
n_layer = 2
n_head = 2
n_embd = 32
context = 32
[data]
train = "train.bin"
[train]
steps = 8
global_batch = 8
micro_batch = 2
seq_len = 32
lr = 3e-3
[checkpoint]
every = 4
keep = 100
[launch]
timeout = 10.0
[cpu]
threads = 1
T
if ! has_test_hooks "$bin"; then
  skip "asynchronous checkpoints" "test hooks (DTRAIN_FAULT_*) compiled out of $bin"
  finish; exit $?
fi

# line N of FILE holding the fixed string S (0 when none)
line_of() { grep -nF -- "$2" "$1" | head -1 | cut -d: -f1 | grep . || echo 0; }

# ---- a commit deferred across steps --------------------------------------
"$bin" run as.toml --nproc 2 --set run.name=sy --metrics sy.jsonl >sy.log 2>&1 ||
  bad "the synchronous-save run failed" "$(cat sy.log)"
expect_exit 0 "deferred commit: the run" env DTRAIN_FAULT_CKPT_WRITER_DELAY_MS=400 \
  "$bin" run as.toml --nproc 2 --set run.name=as --set checkpoint.async=true --metrics as.jsonl
printf '%s\n' "$out" > as.log
s5=$(line_of as.log "step     5/8") c4=$(line_of as.log "saved out/as/ckpt/step-00000004 (")
c8=$(line_of as.log "saved out/as/ckpt/step-00000008 (")
if [ "$s5" -gt 0 ] && [ "$c4" -gt "$s5" ] && [ "$c8" -gt "$c4" ]; then
  ok "deferred commit: step 4 commits after step 5 trained, before step 8's save"
else bad "deferred commit: lines step 5 $s5, commit 4 $c4, commit 8 $c8" "$out"; fi
if grep -qE "checkpoint: saved out/as/ckpt/step-00000004 \([0-9]+ bytes, [0-9.]+ s; training paused [0-9]+\.[0-9]{3} s\)$" as.log &&
   grep -qE "checkpoint: saved out/as/ckpt/step-00000008 \([0-9]+ bytes, [0-9.]+ s\)$" as.log
then ok "deferred commit: the asynchronous save's line says how long training paused, the last (synchronous) one does not"
else bad "deferred commit: the saved lines" "$(grep saved as.log)"; fi
same=1
for f in out/sy/ckpt/step-00000004/shard-*.bin; do
  cmp -s "$f" "out/as/ckpt/step-00000004/${f##*/}" || same=0
done
"$bin" ckpt inspect out/as/ckpt/step-00000004 --verify >/dev/null 2>&1 || same=0
[ "$same" = 1 ] && ok "deferred commit: step 4's shards equal the synchronous save's and verify" ||
  bad "deferred commit: step 4 differs from the synchronous save" "$(ls -l out/*/ckpt/step-00000004)"
r=$(losses_cmp as.jsonl 1 8 sy.jsonl 0) && ok "deferred commit: the losses are unchanged ($r)" ||
  bad "deferred commit: the losses changed" "$r"
"$bin" run as.toml --nproc 2 --set run.name=re --set checkpoint.resume=out/as/ckpt/step-00000004 \
  --metrics re.jsonl >re.log 2>&1 || bad "resume from step 4 failed" "$(cat re.log)"
r=$(losses_cmp re.jsonl 5 8 sy.jsonl 0) && ok "deferred commit: resumed from step 4, steps 5-8 bit for bit ($r)" ||
  bad "deferred commit: the resumed losses differ" "$r"

# ---- a rank killed in the middle of its writer thread's write -------------
# A shard is 208128 bytes: a budget of 300000 lets step 2's through and
# stops rank 1 in step 4's.
job="kill$$"
sed -i 's/^every = 4/every = 2/' as.toml
DTRAIN_RANK=0 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run as.toml --set run.name=k --set checkpoint.async=true >rank0.log 2>&1 &
p0=$!
DTRAIN_FAULT_WRITE_AFTER_BYTES=300000 DTRAIN_FAULT_STOP_ON_FULL=1 \
DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=1 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run as.toml --set run.name=k --set checkpoint.async=true >rank1.log 2>&1 &
p1=$!
for _ in $(seq 400); do
  [ "$(ps -o stat= -p $p1 2>/dev/null | cut -c1)" = T ] && break
  sleep 0.05
done
if [ "$(ps -o stat= -p $p1 2>/dev/null | cut -c1)" = T ]; then ok "killed mid-write: rank 1 stopped in its writer thread"
else bad "killed mid-write: rank 1 never reached the fault point" "$(cat rank1.log)"; fi
if [ -f out/k/ckpt/step-00000004.tmp/shard-00001.bin.tmp ] || ls out/k/ckpt/step-00000004.tmp/ 2>/dev/null | grep -q shard-00001
then ok "killed mid-write: rank 1's shard of step 4 is half written"
else bad "killed mid-write: no shard of rank 1 in step 4's temporary folder" "$(ls -laR out/k/ckpt)"; fi
sums=$(ckpt_sums out/k/ckpt/step-00000002)
kill -KILL $p1 2>/dev/null || true
set +e; { wait $p1; } 2>/dev/null; wait $p0; e0=$?; set -e
out=$(cat rank0.log)
[ $e0 = 1 ] && ok "killed mid-write: rank 0 fails (exit 1)" || bad "killed mid-write: rank 0 exit $e0" "$out"
expect_out "killed mid-write: rank 0 names the dead rank" "rank 1"
if [ -f out/k/ckpt/step-00000002/COMPLETE ] && [ ! -e out/k/ckpt/step-00000004 ]; then
  ok "killed mid-write: step 2 complete, no step 4"
else bad "killed mid-write: the checkpoint folder" "$(ls -la out/k/ckpt)"; fi
after_fault "killed mid-write" "$job" out/k/ckpt out/k/ckpt/step-00000002 "$sums" rank0.log
"$bin" run as.toml --nproc 2 --set run.name=k --set checkpoint.resume=latest --metrics k.jsonl \
  >k.log 2>&1 || bad "killed mid-write: the resume failed" "$(cat k.log)"
grep -qF "resumed from out/k/ckpt/step-00000002" k.log && ok "killed mid-write: resumed from step 2" ||
  bad "killed mid-write: the resume did not start at step 2" "$(cat k.log)"
r=$(losses_cmp k.jsonl 3 8 sy.jsonl 0) && ok "killed mid-write: steps 3-8 bit for bit ($r)" ||
  bad "killed mid-write: the resumed losses differ" "$r"

# ---- a disk that fills in the writer thread --------------------------------
"$bin" run as.toml --nproc 2 --set run.name=f --set train.steps=2 >f2.log 2>&1 ||
  bad "disk full: the run saving step 2 failed" "$(cat f2.log)"
sums=$(ckpt_sums out/f/ckpt/step-00000002)
job="full$$"
DTRAIN_RANK=0 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run as.toml --set run.name=f --set checkpoint.async=true --set checkpoint.resume=latest \
  >rank0.log 2>&1 &
p0=$!
set +e   # rank 1's first async save (step 4) runs out of its 100000 bytes
DTRAIN_FAULT_WRITE_AFTER_BYTES=100000 \
DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=1 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run as.toml --set run.name=f --set checkpoint.async=true --set checkpoint.resume=latest \
  >rank1.log 2>&1
e1=$?; wait $p0; e0=$?
set -e
out=$(cat rank0.log rank1.log)
[ $e0 = 1 ] && [ $e1 = 1 ] && ok "disk full: both ranks exit 1" || bad "disk full: exits $e0 / $e1" "$out"
expect_out "disk full: rank 1 names the shard file and why" \
  "step-00000004.tmp/shard-00001.bin"
expect_out "disk full: ... No space left on device" "No space left on device"
expect_out "disk full: rank 0 names the failing rank" "rank 1 failed writing its shard"
expect_out "disk full: the previous checkpoint is intact" "saving checkpoint of step 4 (the previous checkpoint is intact)"
if grep -qF "step     5/8" rank0.log && ! grep -qF "step     7/8" rank0.log; then
  ok "disk full: reported at a step boundary before the next save's step"
else bad "disk full: not reported between steps 5 and 6" "$(cat rank0.log)"; fi
[ -f out/f/ckpt/step-00000002/COMPLETE ] && [ ! -e out/f/ckpt/step-00000004 ] &&
  ok "disk full: step 2 intact, step 4 never appears" || bad "disk full: folder" "$(ls out/f/ckpt)"
after_fault "disk full" "$job" out/f/ckpt out/f/ckpt/step-00000002 "$sums" rank0.log rank1.log

# ---- rank 0's commit thread failing -----------------------------------------
# Rank 0's budget lets its shard of step 4 through (208128 bytes), not the
# manifest its commit thread writes after it.
job="man$$"
DTRAIN_FAULT_WRITE_AFTER_BYTES=210000 \
DTRAIN_RANK=0 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run as.toml --set run.name=f --set checkpoint.async=true --set checkpoint.resume=latest \
  >rank0.log 2>&1 &
p0=$!
set +e
DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=1 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run as.toml --set run.name=f --set checkpoint.async=true --set checkpoint.resume=latest \
  >rank1.log 2>&1
e1=$?; wait $p0; e0=$?
set -e
out=$(cat rank0.log rank1.log)
[ $e0 = 1 ] && [ $e1 = 1 ] && ok "manifest write fails: both ranks exit 1" ||
  bad "manifest write fails: exits $e0 / $e1" "$out"
expect_out "manifest write fails: rank 0 names the file" "step-00000004.tmp/manifest.json"
expect_out "manifest write fails: rank 1 learns it" "rank 0 could not write the manifest or commit"
[ -f out/f/ckpt/step-00000002/COMPLETE ] && [ ! -e out/f/ckpt/step-00000004 ] &&
  ok "manifest write fails: step 2 intact, step 4 never appears" ||
  bad "manifest write fails: folder" "$(ls out/f/ckpt)"
after_fault "manifest write fails" "$job" out/f/ckpt out/f/ckpt/step-00000002 "$sums" rank0.log rank1.log
finish
