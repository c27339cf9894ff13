#!/usr/bin/env bash
# Multi-process training through `dtrain run`, ranks started the way an
# external launcher starts them (DTRAIN_* environment, one process each):
#  - DDP equivalence: N = 2 and 4 ranks, with and without accumulation, give
#    the 1-rank losses and final parameters within fp32 reduction-order
#    tolerance (losses 1e-5 absolute, parameters 2e-5 absolute: measured
#    ~5e-7 and ~1.6e-6 over 20 AdamW steps at lr 3e-3);
#  - checkpoints do not depend on topology: saved by 2 ranks, resumed by 1
#    and by 4, the loss curve continues;
#  - `dtrain ckpt inspect|consolidate|export` on a sharded checkpoint;
#  - on tcp, memory as planned to the byte (its scratch is its own);
#  - failures: configs that differ between ranks, a peer that never
#    arrives, a rank killed in the middle of a checkpoint write, a rank
#    whose disk fills: clear errors and the previous checkpoint intact.
# PART (3rd argument) "main" runs everything but the failures, "faults" only
# the failures (ctest's integration.multirank_faults, label faults); each
# failure ends with after_fault's post-conditions (lib.sh).
set -euo pipefail
bin=$1 work=$2
part=${3:-all}
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer eq.toml '[train]' 'steps = 20'

if [ "$part" != faults ]; then   # (not indented: the main part is most of the file)
cat > cmp.py <<'P'
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: np.frombuffer(d[v["data_offsets"][0]:v["data_offsets"][1]], np.float32).reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}
mode, a, b = sys.argv[1], load(sys.argv[2]), load(sys.argv[3])
assert a.keys() == b.keys(), "different tensor names"
if mode == "transposed":  # b is a's hf layout: Conv1D weights transposed
    for k in a:
        conv = k.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"))
        want = a[k].T if conv else a[k]
        assert want.shape == b[k].shape and np.array_equal(want, b[k]), k
    print("transposed ok")
else:
    tol = float(mode)
    worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
    print("max abs diff %.3g" % worst)
    sys.exit(0 if worst <= tol else 1)
P

# ---- DDP equivalence -------------------------------------------------------
expect_exit 0 "1 rank, micro-batch 8" "$bin" run eq.toml --set run.comm=self \
  --set train.micro_batch=8 --set run.name=n1 --metrics n1.jsonl
"$bin" export out/n1/ckpt n1.st --layout dtrain >/dev/null
for v in "2 4 n2" "4 2 n4" "2 2 n2a" "4 1 n4a"; do
  set -- $v
  accum=$((8 / ($1 * $2)))
  if ranks "$1" eq.toml --set train.micro_batch="$2" --set run.name="$3" --metrics "$3.jsonl"; then
    ok "$1 ranks x micro-batch $2 x accumulation $accum trained"
  else bad "$1 ranks x micro-batch $2 failed" "$(cat rank*.log)"; continue; fi
  same_losses "$1 ranks, accumulation $accum vs 1 rank" n1.jsonl "$3.jsonl"
  "$bin" export "out/$3/ckpt" "$3.st" --layout dtrain >/dev/null
  if out=$($py cmp.py 2e-5 n1.st "$3.st" 2>&1); then ok "$1 ranks, accumulation $accum: final parameters ($out)"
  else bad "$1 ranks, accumulation $accum: final parameters differ" "$out"; fi
done

# The same two ranks started the way srun starts them.
pids=()
for r in 0 1; do
  SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_NODEID=0 \
    SLURM_STEP_TASKS_PER_NODE=2 SLURM_JOB_ID=$$ SLURM_STEP_ID=0 \
    "$bin" run eq.toml --set train.micro_batch=4 --set run.name=slurm --metrics slurm.jsonl \
    >"rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done
[ $rc = 0 ] && ok "2 ranks under a Slurm (srun) environment" || bad "Slurm ranks failed" "$(cat rank*.log)"
same_losses "Slurm ranks vs dtrain's own" n2.jsonl slurm.jsonl

# ---- gradients in shm's symmetric memory ------------------------------------
# ddp keeps its gradients (or its 16-bit bucket slots) in the memory every
# rank of its group maps (comm sym_alloc), where each bucket's all_reduce
# skips the staging copies.  It must change no bit, and its bytes are the
# strategy's: the memory record counts them under their tag, as planned
# to the byte.
sym_used() { # METRICS TAG: comm/shm's host memory holds TAG bytes
  $py - "$1" "$2" <<'P'
import json, sys
h = [json.loads(l)["host_memory"] for l in open(sys.argv[1]) if '"host_memory"' in l][0]
m = [json.loads(l)["memory"] for l in open(sys.argv[1]) if '"memory"' in l][0]
shm = h["peak_bytes"].get("comm/shm", {}).get(sys.argv[2], 0)
t = sys.argv[2]
assert m["peak_bytes"][t] == m["planned_bytes"][t], (m["peak_bytes"][t], m["planned_bytes"][t])
print(shm)
P
}
b=$(sym_used n2.jsonl grads) || b=err
if [ "$b" != err ] && [ "$b" -gt 0 ]; then ok "ddp's gradients in symmetric memory ($b bytes), counted as planned"
else bad "ddp's gradients not in symmetric memory, or not counted as planned: $b"; fi
for v in "fp32 n2" "bf16 n2bf"; do
  set -- $v
  if [ "$1" = bf16 ] && ! ranks 2 eq.toml --set train.micro_batch=4 --set ddp.reduce_dtype=bf16 \
       --set run.name=n2bf --metrics n2bf.jsonl; then
    bad "2 ranks, reduce_dtype bf16, failed" "$(cat rank*.log)"; continue; fi
  if ranks 2 eq.toml --set train.micro_batch=4 --set ddp.reduce_dtype="$1" \
       --set shm.symmetric=false --set run.name="$2-nosym" --metrics "$2-nosym.jsonl"; then
    ok "2 ranks, reduce_dtype $1, shm.symmetric = false trained"
  else bad "2 ranks, shm.symmetric = false failed" "$(cat rank*.log)"; continue; fi
  if cmp -s <(losses "$2.jsonl") <(losses "$2-nosym.jsonl") && [ -s "$2.jsonl" ]; then
    ok "reduce_dtype $1: symmetric memory on and off give the same losses, bit for bit"
  else bad "reduce_dtype $1: symmetric memory changed the losses" \
    "$(paste <(losses "$2.jsonl") <(losses "$2-nosym.jsonl"))"; fi
done
b=$(sym_used n2-nosym.jsonl grads) || b=err
[ "$b" = 0 ] && ok "shm.symmetric = false: gradients in device memory, counted as planned" ||
  bad "shm.symmetric = false still used symmetric memory, or miscounted: $b"
b=$(sym_used n2bf.jsonl comm) || b=err
if [ "$b" != err ] && [ "$b" -gt 0 ]; then ok "reduce_dtype bf16: the bucket slots in symmetric memory ($b bytes)"
else bad "reduce_dtype bf16: bucket slots not in symmetric memory: $b"; fi

# ---- topology-free checkpoints ---------------------------------------------
if ranks 2 eq.toml --set train.micro_batch=4 --set run.name=s2 --set train.stop_at=10; then
  ok "2 ranks stopped after step 10 with a checkpoint"
else bad "2-rank run to step 10 failed" "$(cat rank*.log)"; fi
expect_exit 0 "ckpt inspect --verify on a 2-rank checkpoint" "$bin" ckpt inspect out/s2/ckpt --verify
expect_out "inspect names the writer" "written by 2 rank(s) with ddp"
expect_out "inspect shows both shards" "shard-00001.bin"
expect_out "inspect verifies CRCs" "verified: every segment's CRC-32 matches"
mkdir -p out/r1 && cp -r out/s2/ckpt out/r1/
expect_exit 0 "resumed by 1 rank" "$bin" run eq.toml --set run.comm=self --set train.micro_batch=8 \
  --set run.name=r1 --set checkpoint.resume=latest --metrics r1.jsonl
expect_out "1 rank resumed at step 10" "(step 10)"
same_losses "saved by 2 ranks, resumed by 1" <(grep '"step"' n2.jsonl | tail -n 10) r1.jsonl
mkdir -p out/r4 && cp -r out/s2/ckpt out/r4/
if ranks 4 eq.toml --set train.micro_batch=2 --set run.name=r4 --set checkpoint.resume=latest \
     --metrics r4.jsonl; then ok "resumed by 4 ranks"
else bad "4-rank resume failed" "$(cat rank*.log)"; fi
same_losses "saved by 2 ranks, resumed by 4" <(grep '"step"' n2.jsonl | tail -n 10) r4.jsonl
# the same 2 ranks resume bit for bit (rank 1's update of step 10 is pending
# at the save, ddp's stagger_update: the save applies it first)
mkdir -p out/r2 && cp -r out/s2/ckpt out/r2/
if ranks 2 eq.toml --set train.micro_batch=4 --set run.name=r2 --set checkpoint.resume=latest \
     --metrics r2.jsonl; then ok "resumed by 2 ranks"
else bad "2-rank resume failed" "$(cat rank*.log)"; fi
if cmp -s <(losses n2.jsonl | tail -n 10) <(losses r2.jsonl) && [ -s r2.jsonl ]; then
  ok "saved by 2 ranks, resumed by 2: the same losses, bit for bit"
else bad "2-rank resume is not bit-identical" "$(paste <(losses n2.jsonl | tail -n 10) <(losses r2.jsonl))"; fi

expect_exit 0 "ckpt consolidate" "$bin" ckpt consolidate out/s2/ckpt/step-00000010 cons
expect_exit 0 "consolidated checkpoint has one shard" "$bin" ckpt inspect cons --verify
expect_out "consolidated: written by 1 rank" "written by 1 rank(s)"
"$bin" export out/s2/ckpt s2.st --layout dtrain >/dev/null
"$bin" export cons c.st --layout dtrain >/dev/null
if out=$($py cmp.py 0 s2.st c.st 2>&1); then ok "consolidated weights equal the sharded ones ($out)"
else bad "consolidated weights differ" "$out"; fi
expect_exit 0 "dtrain export (hf layout)" "$bin" export out/s2/ckpt s2hf.st
if out=$($py cmp.py transposed s2.st s2hf.st 2>&1); then ok "hf layout transposes exactly the Conv1D weights"
else bad "hf layout is wrong" "$out"; fi
expect_exit 2 "export: bad --layout" "$bin" export out/s2/ckpt x.st --layout torch
expect_out "export names the choices" "--layout is hf or dtrain"
expect_exit 1 "inspect: not a checkpoint" "$bin" ckpt inspect train.bin
expect_exit 1 "resume from another model shape" "$bin" run eq.toml --set run.comm=self \
  --set model.n_embd=64 --set checkpoint.resume=out/s2/ckpt/step-00000010 --set train.micro_batch=8
expect_out "another model shape names the key and both values" \
  "[model] n_embd = 32 there but 64 in this run: it was saved from another model"

# ---- the communicator's own buffers are its host memory -------------------
# tcp's ring scratch is the communicator's (the host memory line names it,
# comm/tcp), not device memory a strategy planned: the memory record counts
# of a communicator only the symmetric memory it maps for the strategy
# (shm's, above), so a tcp run is as planned to the byte (its scratch once
# read as comm bytes beyond the plan), the cpu device's scratch aside (1
# thread x T 32 floats of attention backward, 128 bytes).
for s in ddp zero; do
  if DTRAIN_JOB_SECRET=s$$ ranks 2 eq.toml --set run.comm=tcp --set cpu.threads=1 --set parallel.data=$s \
       --set zero.stage=3 --set train.micro_batch=4 --set run.name=tcp-$s --metrics tcp-$s.jsonl
  then planned_is_measured "tcp, $s, 2 ranks" tcp-$s.jsonl 128
  else bad "tcp, $s, 2 ranks failed" "$(cat rank*.log)"; fi
  b=$($py - tcp-$s.jsonl <<'P' 2>&1
import json, sys
h = [json.loads(l)["host_memory"] for l in open(sys.argv[1]) if '"host_memory"' in l][0]
print(h["peak_bytes"]["comm/tcp"]["comm"])
P
) || b=err
  if [ "$b" != err ] && [ "$b" -gt 0 ]; then ok "tcp, $s: its scratch on the host memory line ($b bytes)"
  else bad "tcp, $s: no comm/tcp scratch on the host memory line: $b"; fi
done

# ---- strategies and layouts: save by one, resume by another -----------------
# Global batch 12 divides over 1-4 ranks.  Reference: ddp on 1 rank.  Each
# sharded run is checked against it (losses 1e-5), its measured model-state
# bytes (params + grads + optimizer peaks) against its plan (5%), and its
# checkpoint at step 10 is resumed by another strategy at another world size.
mt() { ranks "$@" --set train.global_batch=12; }
expect_exit 0 "reference: ddp, 1 rank, batch 12" "$bin" run eq.toml --set run.comm=self \
  --set train.global_batch=12 --set train.micro_batch=12 --set run.name=ref12 --metrics ref12.jsonl
state_vs_plan() { # NAME METRICS: measured model-state bytes within 5% of the plan
  local r
  r=$($py - "$2" <<'P'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "memory" in j:
        m = j["memory"]; k = ("params", "grads", "optimizer")
        got = sum(m["peak_bytes"][t] for t in k); want = sum(m["planned_bytes"][t] for t in k)
        print("%d %d %s" % (got, want, "ok" if abs(got - want) <= 0.05 * want else "off"))
P
)
  case "$r" in *ok) ok "$1: model state measured ${r% *} bytes vs planned (within 5%)";;
    *) bad "$1: model state vs plan: ${r:-no memory line}";; esac
}
for v in "zero 1 2 6 1" "zero 2 3 2 2" "zero 3 4 1 3" "fsdp FULL_SHARD 3 4 1" \
         "fsdp SHARD_GRAD_OP 4 3 1" "fsdp NO_SHARD 2 6 1"; do
  set -- $v
  if [ "$1" = zero ]; then knob="zero.stage=$2"; else knob="fsdp.sharding_strategy=$2"; fi
  name="$1-$2-$3"
  if mt "$3" eq.toml --set parallel.data="$1" --set "$knob" --set train.micro_batch="$4" \
       --set run.name="$name" --set checkpoint.every=10 --metrics "$name.jsonl"; then
    ok "$1 $2 on $3 ranks (micro $4 x accum $5) trained"
  else bad "$1 $2 on $3 ranks failed" "$(cat rank*.log)"; continue; fi
  same_losses "$1 $2 on $3 ranks vs ddp on 1" ref12.jsonl "$name.jsonl"
  state_vs_plan "$1 $2 on $3 ranks" "$name.jsonl"
done
# ZeRO-1/2 keep their parameter replica (and ZeRO-1 its full gradients)
# in the shard group's symmetric memory, where the all-gathers and
# reduce-scatters skip shm's staging copies: the same bits without it
for name in zero-1-2 zero-2-3; do
  n=${name##*-} stage=${name#zero-}; stage=${stage%-*}
  if mt "$n" eq.toml --set parallel.data=zero --set zero.stage="$stage" \
       --set train.micro_batch=$((12 / n / (stage == 1 ? 1 : 2))) --set shm.symmetric=false \
       --set run.name="$name-nosym" --metrics "$name-nosym.jsonl"; then
    if cmp -s <(losses "$name.jsonl") <(losses "$name-nosym.jsonl") && [ -s "$name.jsonl" ]; then
      ok "$name: symmetric memory on and off give the same losses, bit for bit"
    else bad "$name: symmetric memory changed the losses" \
      "$(paste <(losses "$name.jsonl") <(losses "$name-nosym.jsonl"))"; fi
  else bad "$name with shm.symmetric = false failed" "$(cat rank*.log)"; fi
done
b=$(sym_used zero-1-2.jsonl params) || b=err
if [ "$b" != err ] && [ "$b" -gt 0 ]; then ok "zero-1: the parameter replica in symmetric memory ($b bytes), counted as planned"
else bad "zero-1: the parameter replica not in symmetric memory, or miscounted: $b"; fi
# resume(SAVED_RUN, NEW_NAME, N, MICRO, STRATEGY SETS...)
resume() {
  local from=$1 name=$2 n=$3 micro=$4; shift 4
  mkdir -p "out/$name" && rm -rf "out/$name/ckpt" && cp -r "out/$from/ckpt" "out/$name/ckpt"
  rm -rf "out/$name/ckpt/step-00000020"
  if mt "$n" eq.toml --set train.micro_batch="$micro" --set run.name="$name" \
       --set checkpoint.resume=latest --metrics "$name.jsonl" "$@"; then
    ok "$name: resumed $from's step 10 on $n ranks"
  else bad "$name: resume failed" "$(cat rank*.log)"; return; fi
  same_losses "$name continues the curve" <(grep '"step"' ref12.jsonl | tail -n 10) "$name.jsonl"
}
resume zero-3-4 z3to_ddp2 2 6 --set parallel.data=ddp
resume zero-3-4 z3to_fsdp3 3 4 --set parallel.data=fsdp --set fsdp.sharding_strategy=FULL_SHARD
resume fsdp-FULL_SHARD-3 f3to_z2x4 4 3 --set parallel.data=zero --set zero.stage=2
resume zero-1-2 z1to_z3x1 1 12 --set parallel.data=zero --set zero.stage=3 --set run.comm=self

fi   # part != faults

# ---- failures ---------------------------------------------------------------
if [ "$part" != main ]; then
set +e
job="mm$$"
DTRAIN_RANK=0 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run eq.toml --set run.name=mm >rank0.log 2>&1 &
p0=$!
DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=1 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
  "$bin" run eq.toml --set run.name=mm --set train.lr=1e-3 >rank1.log 2>&1
e1=$?; wait $p0; e0=$?
set -e
out=$(cat rank0.log rank1.log)
if [ $e0 = 2 ] && [ $e1 = 2 ]; then ok "differing configs: both ranks exit 2"
else bad "differing configs: exits $e0 and $e1, expected 2" "$out"; fi
expect_out "the differing key is named with both values" \
  "rank 1: train.lr = 0.001 (--set; rank 0: 0.003)"
after_fault "differing configs" "$job" "" "" "" rank0.log rank1.log

set +e
out=$(DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=1 DTRAIN_LOCAL_SIZE=2 \
  DTRAIN_JOB_ID="alone$$" "$bin" run eq.toml --set launch.timeout=1 2>&1); e=$?
set -e
[ $e = 1 ] && ok "a peer that never arrives: exit 1" || bad "lonely rank: exit $e, expected 1" "$out"
expect_out "the missing rank is named" "waiting for rank 0 of 2"
after_fault "a peer that never arrives" "alone$$" "" "" ""

# A rank killed in the middle of writing its shard of the step-4
# checkpoint (it stops itself where its byte budget runs out; the test
# SIGKILLs it there): the other rank fails, the step-2 checkpoint survives.
if has_test_hooks "$bin"; then
  job="kill$$"
  DTRAIN_RANK=0 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
    "$bin" run eq.toml --set train.micro_batch=4 --set run.name=k --set train.steps=6 \
    --set checkpoint.every=2 --set launch.timeout=10 >rank0.log 2>&1 &
  p0=$!
  DTRAIN_FAULT_WRITE_AFTER_BYTES=300000 DTRAIN_FAULT_STOP_ON_FULL=1 \
  DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=1 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
    "$bin" run eq.toml --set train.micro_batch=4 --set run.name=k --set train.steps=6 \
    --set checkpoint.every=2 --set launch.timeout=10 >rank1.log 2>&1 &
  p1=$!
  for _ in $(seq 200); do
    [ "$(ps -o stat= -p $p1 2>/dev/null | cut -c1)" = T ] && break
    sleep 0.05
  done
  if [ "$(ps -o stat= -p $p1 2>/dev/null | cut -c1)" = T ]; then ok "rank 1 stopped mid-write"
  else bad "rank 1 never reached the fault point" "$(cat rank1.log)"; fi
  sums=$(ckpt_sums out/k/ckpt/step-00000002)   # step 2 is complete: rank 1 writes step 4
  kill -KILL $p1 2>/dev/null || true
  set +e; { wait $p1; } 2>/dev/null; wait $p0; e0=$?; set -e
  out=$(cat rank0.log)
  [ $e0 = 1 ] && ok "rank 0 fails after rank 1 is killed (exit 1)" || bad "rank 0: exit $e0" "$out"
  expect_out "rank 0 names the dead rank" "rank 1"
  expect_out "rank 0 says the previous checkpoint is intact" "previous checkpoint is intact"
  if [ -f out/k/ckpt/step-00000002/COMPLETE ] && [ ! -e out/k/ckpt/step-00000004 ] &&
     ! ls -d out/k/ckpt/*.tmp >/dev/null 2>&1; then
    ok "step 2 complete, no step 4, no temporary directory left"
  else bad "checkpoint folder after the kill" "$(ls -la out/k/ckpt)"; fi
  after_fault "a rank killed mid-write" "$job" out/k/ckpt out/k/ckpt/step-00000002 "$sums" \
    rank0.log
  if ranks 2 eq.toml --set train.micro_batch=4 --set run.name=k --set train.steps=6 \
       --set checkpoint.resume=latest; then ok "the previous checkpoint loads and training finishes"
  else bad "resume after the kill failed" "$(cat rank*.log)"; fi
  grep -qF "resumed from out/k/ckpt/step-00000002" rank0.log && ok "resumed from step 2" ||
    bad "resume did not start at step 2" "$(cat rank0.log)"
else
  skip "a rank killed mid-write" "test hooks (DTRAIN_FAULT_*) compiled out of $bin"
fi

# A rank whose disk fills while writing: every rank fails cleanly.  Step 2
# is saved by a run of its own first, so its checksums are known before the
# fault; the faulty run resumes from it.
if has_test_hooks "$bin"; then
  ranks 2 eq.toml --set train.micro_batch=4 --set run.name=f --set train.steps=2 \
    --set checkpoint.every=2 || bad "disk full: the run saving step 2 failed" "$(cat rank*.log)"
  sums=$(ckpt_sums out/f/ckpt/step-00000002)
  job="full$$"
  DTRAIN_RANK=0 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=0 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
    "$bin" run eq.toml --set train.micro_batch=4 --set run.name=f --set train.steps=4 \
    --set checkpoint.every=2 --set checkpoint.resume=latest >rank0.log 2>&1 &
  p0=$!
  set +e   # a shard of step 4 is more than 150000 bytes (step 2 and half of step 4 were not)
  DTRAIN_FAULT_WRITE_AFTER_BYTES=100000 \
  DTRAIN_RANK=1 DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=1 DTRAIN_LOCAL_SIZE=2 DTRAIN_JOB_ID=$job \
    "$bin" run eq.toml --set train.micro_batch=4 --set run.name=f --set train.steps=4 \
    --set checkpoint.every=2 --set checkpoint.resume=latest >rank1.log 2>&1
  e1=$?; wait $p0; e0=$?
  set -e
  out=$(cat rank0.log rank1.log)
  [ $e0 = 1 ] && [ $e1 = 1 ] && ok "disk full on rank 1: both ranks exit 1" ||
    bad "disk full: exits $e0 / $e1" "$out"
  expect_out "rank 1 says why" "No space left on device"
  expect_out "rank 0 names the failing rank" "rank 1 failed writing its shard"
  [ -f out/f/ckpt/step-00000002/COMPLETE ] && [ ! -e out/f/ckpt/step-00000004 ] &&
    ok "disk full: step 2 intact, step 4 never appears" || bad "disk full: folder" "$(ls out/f/ckpt)"
  after_fault "disk full" "$job" out/f/ckpt out/f/ckpt/step-00000002 "$sums" rank0.log rank1.log
else
  skip "a rank whose disk fills" "test hooks (DTRAIN_FAULT_*) compiled out of $bin"
fi
fi   # part != main
finish
