#!/usr/bin/env bash
# The cuda device plugin through the CLI.  Mode "any" (every machine whose
# build has the plugin): `dtrain plugins --describe cuda` lists every key
# with its doc, `dtrain env` reports the CUDA runtime, a bad [cuda] value
# is a config error (exit 2), bf16 activations on the cpu device train
# within 5e-2 of f32 (and fp16 parameters with them are refused), and on
# a machine without a GPU
# `run.device = "cuda"` fails at init with exit 1, "no CUDA device" and
# CUDA's own error string.  Mode "gpu": a short GPT-2 run on cuda against
# the same run on cpu (f32, tf32 off), fsdp and zero-3 at world 1 against
# ddp, bf16 activations against f32; exits 77 (skipped) with "no CUDA
# device" where there is none; with two GPUs or more, also two ranks on
# nccl against shm, and `dtrain bench comm` on nccl (one rank per GPU: 1
# and, with two GPUs, 2).  The nccl communicator: `--describe nccl`, and
# its refusal of a device without CUDA streams (exit 2), in `dtrain run`
# and in `dtrain bench comm` without --device cuda.  The gpu mode passed
# on an H200 (scripts/gpu-check.sh); its two-rank part needs two GPUs and
# has not run.
# Exit 77 when the build has no cuda plugin.
set -euo pipefail
bin=$1 work=$2 mode=$3
. "$(dirname "$0")/lib.sh"
plugin="$(dirname "$bin")/plugins-out/dtrain_cuda.so"
if [ ! -f "$plugin" ]; then echo "SKIPPED: this build has no cuda plugin"; exit 77; fi
rm -rf "$work"; mkdir -p "$work"; cd "$work"
gpus=yes
case "$("$bin" env 2>/dev/null)" in
  *"  GPUs       none "*) gpus=no ;;
esac
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer tiny.toml \
  '[run]' 'comm = "self"' 'device = "cuda"' 'log_every = 1' \
  '[train]' 'micro_batch = 4' '-global_batch' '-warmup_steps' \
  '[launch]' '-timeout' \
  '[cpu]' '-threads'

if [ "$mode" = gpu ]; then
  if [ $gpus = no ]; then
    echo "SKIPPED: no CUDA device ($("$bin" env | grep '  GPUs ' | sed 's/^ *GPUs *//'))"
    exit 77
  fi
  expect_exit 0 "6 steps on cuda" "$bin" run tiny.toml --metrics cuda.jsonl --set run.name=cuda
  expect_out "the run names the GPU" "(cuda:0, sm_"
  expect_exit 0 "6 steps on cpu" "$bin" run tiny.toml --metrics cpu.jsonl --set run.name=cpu \
    --set run.device=cpu
  # f32 everywhere; the sums run in other orders, so not bit for bit
  same_losses "cuda against cpu" cpu.jsonl cuda.jsonl 1e-3
  expect_exit 0 "deterministic mode, twice" "$bin" run tiny.toml --metrics d1.jsonl \
    --set run.name=d1 --set cuda.deterministic=true
  "$bin" run tiny.toml --metrics d2.jsonl --set run.name=d2 --set cuda.deterministic=true >/dev/null 2>&1
  same_losses "deterministic runs repeat the same losses" d1.jsonl d2.jsonl 0
  # the sharded strategies at world 1 gather and scatter through comm
  # "self", which must copy device memory with the device
  expect_exit 0 "fsdp on one GPU" "$bin" run tiny.toml --metrics fsdp.jsonl --set run.name=fsdp \
    --set parallel.data=fsdp
  same_losses "fsdp against ddp on one GPU" cuda.jsonl fsdp.jsonl 1e-6
  expect_exit 0 "zero-3 on one GPU" "$bin" run tiny.toml --metrics z3.jsonl --set run.name=z3 \
    --set parallel.data=zero --set zero.stage=3
  same_losses "zero-3 against ddp on one GPU" cuda.jsonl z3.jsonl 1e-6
  # bf16 activations (f32 and bf16 parameters): every activation rounded to
  # 8 bits of mantissa moves the loss by about 1e-2 over 6 steps
  expect_exit 0 "bf16 activations" "$bin" run tiny.toml --metrics a16.jsonl --set run.name=a16 \
    --set model.activations=bf16
  same_losses "bf16 activations against f32" cuda.jsonl a16.jsonl 5e-2
  expect_exit 0 "bf16 activations and parameters" "$bin" run tiny.toml --metrics b16.jsonl \
    --set run.name=b16 --set model.activations=bf16 --set model.dtype=bf16
  same_losses "bf16 activations and parameters against f32" cuda.jsonl b16.jsonl 5e-2
  n=$("$bin" env | sed -n 's/^  GPUs *\([0-9]*\) visible.*/\1/p')
  if [ -f "$(dirname "$bin")/plugins-out/dtrain_nccl.so" ] && [ "${n:-0}" -ge 2 ]; then
    expect_exit 0 "2 ranks on nccl" "$bin" run tiny.toml --metrics nccl.jsonl --set run.name=nccl \
      --set run.comm=nccl --set launch.nproc=2
    expect_exit 0 "2 ranks on shm" "$bin" run tiny.toml --metrics shm.jsonl --set run.name=shm \
      --set run.comm=shm --set launch.nproc=2
    same_losses "nccl against shm" shm.jsonl nccl.jsonl 1e-4
  else
    skip "2 ranks on nccl" "needs the nccl plugin and 2 GPUs (${n:-0} visible)"
  fi
  # dtrain bench comm on nccl: device buffers on the cuda device, and the
  # bench's own host-memory reductions (time, wrong counts) staged: every
  # size checked, in the dtypes only the core's control messages used
  if [ -f "$(dirname "$bin")/plugins-out/dtrain_nccl.so" ]; then
    for dt in f32 f64 i64 u8; do
      expect_exit 0 "bench comm on nccl, 1 rank, $dt" "$bin" bench comm --comm nccl \
        --device cuda --nproc 1 --sizes 4K:4M --dtype "$dt" --iters 5 --warmup 1
      expect_out "bench comm on nccl: the header names the device" "comm nccl, device cuda, $dt"
    done
    for op in reduce_scatter all_gather broadcast reduce; do
      expect_exit 0 "bench comm on nccl, 1 rank, $op" "$bin" bench comm --comm nccl \
        --device cuda --nproc 1 --sizes 4K:1M --op "$op" --iters 5 --warmup 1
    done
    if [ "${n:-0}" -ge 2 ]; then
      expect_exit 0 "bench comm on nccl, 2 ranks" "$bin" bench comm --comm nccl --device cuda \
        --nproc 2 --sizes 4K:16M --iters 5 --warmup 1
    else
      skip "bench comm on nccl, 2 ranks" "needs 2 GPUs (${n:-0} visible)"
    fi
  fi
  finish
  exit
fi

expect_exit 0 "describe cuda" "$bin" plugins --describe cuda
expect_out "describe: kind and ABI" "cuda: device plugin, ABI 1.0, version 1.0.0"
expect_out "describe: what it is" "  NVIDIA GPU: CUDA kernels, cuBLASLt matmuls, a caching allocator"
expect_out "describe: device_index" "  device_index       int    default -1, range -1 .. 1023
      CUDA device this rank runs on; -1 = its local rank (one GPU per local rank; more local ranks than GPUs is refused)"
expect_out "describe: memory_limit" "  memory_limit       int    default 0, range 0 .."
expect_out "describe: memory_limit doc" "      memory budget in bytes for device allocations (bytes asked for, all tags); 0 = none (the GPU's memory is the limit)"
expect_out "describe: caching" "  caching            bool   default true
      keep freed device blocks by size class for reuse, so a steady-state step calls no cudaMalloc/cudaFree; false = free at once"
expect_out "describe: tf32" "  tf32               bool   default false
      f32 matmuls may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation): faster, not bit-comparable with the cpu"
expect_out "describe: deterministic" "  deterministic      bool   default false
      no atomics in reductions (embedding backward sums per column in a fixed order) and cuBLASLt without split-K reductions, so a resumed run repeats the same bits"
n=$(grep -c '^  [a-z0-9_]* *\(int\|bool\) ' <<<"$out" || true)
if [ "$n" = 5 ]; then ok "describe: five keys"; else bad "describe: $n keys, expected 5" "$out"; fi

if [ -f "$(dirname "$bin")/plugins-out/dtrain_nccl.so" ]; then
  expect_exit 0 "describe nccl" "$bin" plugins --describe nccl
  expect_out "describe nccl: kind, host staging, bf16 rounding, not run on 2+ GPUs" "nccl: comm plugin, ABI 1.0, version 1.0.0
  NVIDIA NCCL on the cuda device's streams, id through the rendezvous; host-memory control messages staged through a device buffer; bf16/f16 reduced in their own type, rounded at every step (not accumulated in f32); not yet run on 2+ GPUs"
  expect_out "describe nccl: poll_us" "  poll_us            int    default 50, range 1 .. 100000"
  expect_exit 2 "bench comm on nccl without --device cuda" "$bin" bench comm --comm nccl \
    --nproc 1 --sizes 4K:4K
  expect_out "bench comm on nccl: names what is missing" "dtrain bench comm: error: comm/nccl: init: the nccl communicator runs on a CUDA device's streams (run.device = \"cuda\"; dtrain bench comm --device cuda); device \"cpu\" has no native stream"
  expect_exit 2 "nccl with the cpu device" "$bin" run tiny.toml --set run.comm=nccl --set run.device=cpu
  expect_out "nccl: needs a CUDA device" "dtrain run: error: comm/nccl: init: the nccl communicator runs on a CUDA device's streams (run.device = \"cuda\"; dtrain bench comm --device cuda); device \"cpu\" has no native stream"
else
  skip "nccl" "this build has no nccl communicator"
fi

# The planner asks the kernel table without a device: it works without a
# GPU, and attention's saved state on cuda is the log-sum-exp, (B, NH, T)
# f32, not the cpu's (B, NH, T, T) probabilities.  tiny.toml: B 4, NH 2,
# T 32, 2 layers.
acts() { awk '$1 == "ddp" { print $8 }' <<<"$out"; }
expect_exit 0 "plan on cuda without a GPU" "$bin" plan tiny.toml
a_cuda=$(acts)
expect_exit 0 "plan on cpu" "$bin" plan tiny.toml --set run.device=cpu
a_cpu=$(acts)
want=$(awk 'BEGIN { printf "%.4f", (4*2*32*32 - 4*2*32) * 4 * 2 / 1048576 }')
if awk -v a="$a_cpu" -v b="$a_cuda" -v w="$want" 'BEGIN { d = a - b - w; exit !(d < 0.011 && d > -0.011) }'
then ok "plan: cuda's attention state is the log-sum-exp ($a_cpu - $a_cuda MiB = $want MiB within the rounding)"
else bad "plan: activations cpu $a_cpu MiB, cuda $a_cuda MiB, expected a difference of $want MiB"; fi

# the cpu runs bf16 activations too (bf16 storage, f32 math, as cuda):
# a cpu run trains within 5e-2 of f32 (tests/integration/test_bf16.sh
# takes them through every strategy)
expect_exit 0 "f32 on the cpu device" "$bin" run tiny.toml --set run.device=cpu \
  --set run.name=cpu32 --metrics cpu32.jsonl
expect_exit 0 "bf16 activations on the cpu device" "$bin" run tiny.toml --set run.device=cpu \
  --set run.name=cpu16 --set model.activations=bf16 --metrics cpu16.jsonl
same_losses "bf16 activations on the cpu against f32" cpu32.jsonl cpu16.jsonl 5e-2
expect_exit 2 "bf16 activations with fp16 parameters" "$bin" run tiny.toml --set run.device=cpu \
  --set model.activations=bf16 --set model.dtype=fp16
expect_out "bf16 activations with fp16: refused" "tiny.toml: [model] activations = \"bf16\" with dtype = \"fp16\": bf16 activations take fp32 or bf16 parameters"

expect_exit 0 "env" "$bin" env
expect_out "env reports the CUDA runtime" "  CUDA       found: "
expect_exit 2 "device_index out of range" "$bin" run tiny.toml --set cuda.device_index=-2
expect_out "device_index: the range" "[cuda] device_index = -2 is out of range (allowed -1 .. 1023)"

if [ $gpus = no ]; then
  expect_exit 1 "run.device = cuda without a GPU" "$bin" run tiny.toml
  expect_out "init error: no CUDA device and CUDA's error string" \
    "dtrain run: error: device/cuda: init: no CUDA device: cudaGetDeviceCount: "
  if grep -qE 'cudaGetDeviceCount: [^(]+ \(cudaError[A-Za-z]+\)' <<<"$out"; then
    ok "init error: CUDA's error name"
  else bad "init error: no (cudaError...) name" "$out"; fi
else
  skip "init error without a GPU" "this machine has one"
fi
finish
