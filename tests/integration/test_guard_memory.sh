#!/usr/bin/env bash
# `[cpu] guard_memory = true` (issue 23): the cpu device's memory is closed
# to the host outside its own kernels and copies, as a GPU's is, so core,
# strategy, tier or checkpoint code that reads or writes device memory
# directly faults here, in CI (plugins/cpu/cpu_guard.c).  One rank on
# `self` (shm, tcp and mpi move host memory only and refuse such a
# device), a tiny GPT-2 (2 layers, n_embd 32, 4 heads, 16 tokens):
#  - every data strategy (ddp, zero 1-3, fsdp), ZeRO-Infinity's offload of
#    parameters and optimizer to cpu and nvme, bf16 activations, fp16 and
#    bf16 weights, checkpoints with resume and evaluation, each trains
#    under the guard with the losses of the same run without it, bit for
#    bit;
#  - the core reading device memory on the host (a test hook,
#    DTRAIN_FAULT_HOST_READS_DEVICE) is a SIGSEGV naming the step, and the
#    same read goes unseen without the guard;
#  - two ranks on shm stop at start-up with the communicator's refusal.
# The device's rules one by one: unit.test_cpu_guard.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > g.toml <<'T'
[run]
comm = "self"
out_dir = "out"
[model]
n_layer = 2
n_head = 4
n_embd = 32
context = 16
[data]
train = "train.bin"
val = "train.bin"
[train]
steps = 3
global_batch = 8
micro_batch = 2
seq_len = 16
lr = 3e-3
warmup_steps = 1
eval_every = 2
eval_steps = 1
[checkpoint]
every = 2
[cpu]
threads = 1
T

# pair NAME ARGS...: the run under the guard and without it; both train,
# the guarded one says so, and their losses are the same bits
pair() {
  local name=$1; shift
  expect_exit 0 "$name under guard_memory" "$bin" run g.toml --set run.name="$name-g" \
    --set cpu.guard_memory=true --metrics "$name-g.jsonl" "$@"
  expect_out "$name: the device closed its memory" "guard_memory (device memory closed to the host)"
  expect_exit 0 "$name without it" "$bin" run g.toml --set run.name="$name" \
    --metrics "$name.jsonl" "$@"
  same_losses "$name: guarded" "$name-g.jsonl" "$name.jsonl" 0
}

pair ddp
pair zero1 --set parallel.data=zero --set zero.stage=1
pair zero2 --set parallel.data=zero --set zero.stage=2
pair zero3 --set parallel.data=zero --set zero.stage=3
pair fsdp --set parallel.data=fsdp
pair zero3-cpu --set parallel.data=zero --set zero.stage=3 --set parallel.offload=offload_cpu \
  --set zero.offload_what=optimizer_and_params
pair fsdp-nvme --set parallel.data=fsdp --set parallel.offload=offload_nvme \
  --set fsdp.offload_what=optimizer_and_params --set offload_nvme.path="$work/nvme"
pair ddp-cpu --set parallel.offload=offload_cpu --set ddp.offload_what=optimizer
pair bf16-act --set model.activations=bf16 --set parallel.data=zero --set zero.stage=3
pair fp16 --set model.dtype=fp16
pair bf16 --set model.dtype=bf16

# resume under the guard from a checkpoint written under it, against the
# same resume without the guard
for g in true false; do
  n=ddp; [ $g = true ] && n=ddp-g
  expect_exit 0 "resume ($g)" "$bin" run g.toml --set run.name=$n --set cpu.guard_memory=$g \
    --set train.steps=5 --set checkpoint.resume=latest --metrics "resumed-$g.jsonl"
  expect_out "... from step 3" "resumed from out/$n/ckpt/step-00000003 (step 3)"
done
same_losses "resumed under the guard" resumed-true.jsonl resumed-false.jsonl 0

# the core reading device memory on the host
if has_test_hooks "$bin"; then
  DTRAIN_FAULT_HOST_READS_DEVICE=2 expect_exit 139 "the core reads device memory: SIGSEGV" \
    "$bin" run g.toml --set run.name=touch-g --set cpu.guard_memory=true
  expect_out "the crash names the access and the step" \
    "crash: SIGSEGV (access not permitted: 0x"
  expect_out "... in the core, at step 2" \
    "in the core, between plugin calls (the last, strategy/ddp step, had returned), at step 2, training"
  DTRAIN_FAULT_HOST_READS_DEVICE=2 expect_exit 0 "the same read unseen without the guard" \
    "$bin" run g.toml --set run.name=touch
  expect_out "... it read the logits" "test hook: the host reads device memory: "
else
  skip "the core reads device memory" "no test hooks in this build"
fi

# two ranks: the communicator refuses a device whose memory is not the host's
expect_exit 1 "two ranks on shm" "$bin" run g.toml --set run.name=two --set run.comm=shm \
  --set launch.nproc=2 --set cpu.guard_memory=true
expect_out "... shm names the device" \
  "memory is not host memory; the shm communicator moves host memory only (use nccl on GPUs)"
finish
