#!/usr/bin/env bash
# scripts/gpu-check.sh BUILD OUT [STAGE...] - everything a one-GPU machine
# can tell about the cuda device plugin, in about 8 minutes, each stage
# under its own timeout so that a hang costs one stage, not the run.
#
#   BUILD  a build folder with the cuda plugin (plugins-out/dtrain_cuda.so);
#          if it is missing or its programs cannot start here (a library
#          not found), it is configured and built here for this GPU's
#          architecture, the targets the stages need only
#   OUT    a folder for the logs: one <stage>.log each, and summary.txt
#          (one line a stage: PASS, FAIL (exit N), TIMEOUT after Ns or
#          SKIP with the reason, and the seconds it took)
#   STAGE  the stages to run (default: all, in this order):
#     probe     the card, driver, toolkit, clocks, addressing mode, numpy
#     build     BUILD usable here, or built
#     runtime   tests/test_cuda_device gpu: context, allocator, copies, events
#     kernels   tests/test_kernels cuda, CUDA_LAUNCH_BLOCKING=1: every kernel
#               against the double-precision references
#     memcheck  compute-sanitizer memcheck over the kernel tests (zero errors)
#     racecheck compute-sanitizer racecheck over them (shared memory hazards)
#     oracle    tests/test_gpt2_oracle cuda: every parameter gradient of a
#               3-layer GPT-2 against the float64 numpy oracle
#     nccl      tests/test_nccl_comm gpu: the nccl communicator at one rank:
#               the core's host-memory control messages (staged), f64/i64/u8,
#               the device path, the refusals (its 2-GPU cases skip on one)
#     e2e       tests/integration/test_cuda.sh gpu: 6 steps on cuda against
#               cpu (losses within 1e-3), deterministic mode repeats its bits,
#               dtrain bench comm on nccl at one rank
#     profile   GPT-2 124M, 1024 tokens a sequence: tokens/s and MFU at
#               micro-batch 8 (f32, tf32) and 16 (tf32; bf16 weights; bf16
#               activations), and per-kernel tables of
#               --profile device:skip=1:sync
#     oom       the memory_limit refusal and a real out-of-memory message
#
# Where there is no GPU (no nvidia-smi, or it lists none) the stages that
# need one are SKIPped with that reason and the rest run: on a CPU machine
# the script checks its own plumbing, the build and the plugin's
# GPU-free checks (tests/test_cuda_device without arguments).  Exit 0 when
# no stage failed, 1 otherwise, 2 on usage.  Environment: GPU_CHECK_SCALE
# multiplies every timeout (default 1).
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: scripts/gpu-check.sh BUILD OUT [STAGE...]" >&2
  exit 2
fi
src=$(cd "$(dirname "$0")/.." && pwd)
build=$1 out=$2
shift 2
case $build in /*) ;; *) build="$PWD/$build" ;; esac
all=(probe build runtime kernels memcheck racecheck oracle nccl e2e profile oom)
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=("${all[@]}")
for s in "${stages[@]}"; do
  case " ${all[*]} " in *" $s "*) ;; *) echo "gpu-check: unknown stage '$s' (${all[*]})" >&2; exit 2 ;; esac
done
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
work="$out/work"
mkdir -p "$work"
scale=${GPU_CHECK_SCALE:-1}
summary="$out/summary.txt"
: >"$summary"
failed=0

gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fi
nogpu_why="no GPU: nvidia-smi not found"
command -v nvidia-smi >/dev/null 2>&1 && nogpu_why="no GPU: nvidia-smi lists none"

note() { printf '%-10s %s\n' "$1" "$2" | tee -a "$summary"; }
# stage NAME SECONDS CMD...: run CMD with its output in OUT/NAME.log
stage() {
  local name=$1 secs=$2 t0=$SECONDS rc
  shift 2
  secs=$(awk -v s="$secs" -v k="$scale" 'BEGIN { printf "%d", s * k }')
  echo "==== $name (timeout ${secs}s): $*" >"$out/$name.log"
  # a child bash runs it, so that the shell functions below can be stages
  timeout -k 10 "$secs" bash -c '"$@"' _ "$@" >>"$out/$name.log" 2>&1
  rc=$?
  local took=$((SECONDS - t0))
  case $rc in
    0) note "$name" "PASS (${took}s)" ;;
    77) note "$name" "SKIP ($(grep -m1 -o 'SKIPPED.*' "$out/$name.log" || echo 'the test skipped itself'))" ;;
    124 | 137) note "$name" "TIMEOUT after ${secs}s"; failed=1 ;;
    *) note "$name" "FAIL (exit $rc, ${took}s; $out/$name.log)"; failed=1 ;;
  esac
  return $rc
}
needs_gpu() {
  if [ -z "$gpu" ]; then note "$1" "SKIP ($nogpu_why)"; return 1; fi
  return 0
}
wants() { case " ${stages[*]} " in *" $1 "*) return 0 ;; esac; return 1; }

# /usr/bin/python3 runs the float64 oracle; on images whose numpy lives in
# another python of the same version (a virtual environment), its
# site-packages are put on PYTHONPATH.
python_numpy() {
  /usr/bin/python3 -c 'import numpy' 2>/dev/null && return 0
  local sp
  sp=$(python3 -c 'import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))' 2>/dev/null) || return 1
  PYTHONPATH="$sp${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 -c 'import numpy' 2>/dev/null || return 1
  export PYTHONPATH="$sp${PYTHONPATH:+:$PYTHONPATH}"
}

probe() {
  echo "host: $(uname -srm); $(nproc) cores"
  if [ -n "$gpu" ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,compute_cap --format=csv
    nvidia-smi -q | grep -i -A1 'addressing mode' || echo "addressing mode: not reported"
  else
    echo "$nogpu_why"
  fi
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc: not found"
  command -v compute-sanitizer >/dev/null && echo "compute-sanitizer: $(command -v compute-sanitizer)" \
    || echo "compute-sanitizer: not found"
  if python_numpy; then echo "numpy: /usr/bin/python3 imports it${PYTHONPATH:+ (PYTHONPATH=$PYTHONPATH)}"
  else echo "numpy: /usr/bin/python3 cannot import it (the oracle stage will skip)"; fi
  ldconfig -p | grep -E 'libcublasLt|libnccl|libcudart' || echo "no cuBLASLt/NCCL/cudart in ldconfig's cache"
  return 0
}

# The programs of BUILD start here: no library "not found".
usable() {
  local f
  for f in "$build/dtrain" "$build/plugins-out/dtrain_cuda.so" "$build/tests/test_kernels"; do
    [ -e "$f" ] || return 1
    ldd "$f" 2>/dev/null | grep -q 'not found' && return 1
  done
  return 0
}
build_here() {
  if usable; then
    echo "$build: usable here (dtrain, dtrain_cuda.so, test_kernels start)"
    return 0
  fi
  if [ -f "$build/CMakeCache.txt" ] && [ ! -e "$build/plugins-out/dtrain_cuda.so" ]; then
    echo "$build: a build without the cuda plugin (no CUDA toolkit, or -DDTRAIN_CUDA=OFF); not reconfiguring it"
    return 1
  fi
  echo "$build: missing or a library not found; building here"
  local arch=90
  if [ -n "$gpu" ]; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
  fi
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" || return 1
  cmake --build "$build" -j "$(nproc)" --target dtrain plugin_cpu plugin_cuda plugin_self \
    plugin_ddp test_cuda_device test_kernels test_gpt2_oracle || return 1
  # the nccl communicator exists where the build found NCCL
  cmake --build "$build" -j "$(nproc)" --target plugin_nccl test_nccl_comm ||
    echo "no nccl communicator in this build (the nccl stage and e2e's bench part skip)"
  usable
}

# GPT-2 124M on the card: tokens/s and MFU from dtrain's own step lines.
profile_runs() {
  cd "$work" || return 1
  # the documentation as text (README.md alone is too short for 8 x 1024 tokens)
  cat "$src/README.md" "$src"/docs/*.md > readme.txt || return 1
  "$build/dtrain" data prepare readme.txt readme.bin >/dev/null || return 1
  cat >gpt2.toml <<'T'
[run]
comm = "self"
device = "cuda"
out_dir = "out"
log_every = 1
[model]
preset = "gpt2-124m"
[data]
train = "readme.bin"
[train]
steps = 6
micro_batch = 8
seq_len = 1024
lr = 3e-4
[checkpoint]
overwrite = true
T
  local rc=0
  echo "---- f32 (tf32 off), micro-batch 8: steps 2-6 are the steady state"
  "$build/dtrain" run gpt2.toml --set run.name=f32 || rc=1
  echo "---- tf32 on, micro-batch 8"
  "$build/dtrain" run gpt2.toml --set run.name=tf32 --set cuda.tf32=true || rc=1
  echo "---- tf32 on, micro-batch 16 (llm.c's shape), 10 steps"
  "$build/dtrain" run gpt2.toml --set run.name=tf32b16 --set cuda.tf32=true \
    --set train.micro_batch=16 --set train.steps=10 || rc=1
  echo "---- bf16 weights, tf32 on, micro-batch 16"
  "$build/dtrain" run gpt2.toml --set run.name=bf16w --set cuda.tf32=true \
    --set train.micro_batch=16 --set model.dtype=bf16 || rc=1
  echo "---- bf16 activations, f32 parameters, micro-batch 16"
  "$build/dtrain" run gpt2.toml --set run.name=a16 --set model.activations=bf16 \
    --set train.micro_batch=16 --set train.steps=10 || rc=1
  echo "---- bf16 activations and parameters, micro-batch 16"
  "$build/dtrain" run gpt2.toml --set run.name=a16b16 --set model.activations=bf16 \
    --set model.dtype=bf16 --set train.micro_batch=16 --set train.steps=10 || rc=1
  echo "---- per-kernel times (sync after each call), bf16 activations, micro-batch 16"
  "$build/dtrain" run gpt2.toml --set run.name=profa16 --set model.activations=bf16 \
    --set train.micro_batch=16 --set train.steps=4 --profile device:skip=1:sync || rc=1
  echo "---- per-kernel times (sync after each call), tf32 on, micro-batch 8"
  "$build/dtrain" run gpt2.toml --set run.name=prof --set cuda.tf32=true --set train.steps=4 \
    --profile device:skip=1:sync || rc=1
  return $rc
}

# The budget refusal names the tag and the request; a real OOM names the
# allocation and leaves a clean exit 1.
oom_drill() {
  cd "$work" || return 1
  [ -f gpt2.toml ] || profile_runs >/dev/null 2>&1
  local rc=0 o
  echo "---- memory_limit = 1 GiB"
  o=$("$build/dtrain" run gpt2.toml --set run.name=lim --set train.steps=1 \
    --set cuda.memory_limit=1073741824 2>&1)
  local e=$?
  echo "$o" | tail -5
  [ $e = 1 ] && grep -q 'memory' <<<"$o" || { echo "expected exit 1 naming memory, got $e"; rc=1; }
  echo "---- micro_batch 512: more than the card holds"
  o=$("$build/dtrain" run gpt2.toml --set run.name=big --set train.steps=1 \
    --set train.micro_batch=512 2>&1)
  e=$?
  echo "$o" | tail -5
  [ $e = 1 ] || { echo "expected exit 1, got $e"; rc=1; }
  return $rc
}

sanitizer() {
  compute-sanitizer --tool "$1" --error-exitcode 9 --print-limit 20 \
    "$build/tests/test_kernels" cuda
}

export -f probe usable build_here profile_runs oom_drill sanitizer python_numpy
export src build work gpu nogpu_why
echo "gpu-check: ${gpu:-$nogpu_why}; build $build; logs $out"
for s in "${stages[@]}"; do
  case $s in
    probe) stage probe 30 probe ;;
    build) stage build 600 build_here ;;
    runtime)
      # the GPU-free checks anywhere; the GPU cases where there is one
      if [ -z "$gpu" ]; then stage runtime 60 "$build/tests/test_cuda_device"
      else stage runtime 60 "$build/tests/test_cuda_device" gpu; fi ;;
    kernels) needs_gpu kernels && CUDA_LAUNCH_BLOCKING=1 stage kernels 120 "$build/tests/test_kernels" cuda ;;
    memcheck | racecheck)
      if needs_gpu "$s"; then
        if command -v compute-sanitizer >/dev/null; then stage "$s" 240 sanitizer "$s"
        else note "$s" "SKIP (compute-sanitizer not found)"; fi
      fi ;;
    oracle)
      if needs_gpu oracle; then
        if python_numpy; then stage oracle 180 "$build/tests/test_gpt2_oracle" cuda
        else note oracle "SKIP (/usr/bin/python3 cannot import numpy)"; fi
      fi ;;
    nccl)
      # the GPU-free checks anywhere; the GPU cases where there is one
      if [ ! -x "$build/tests/test_nccl_comm" ]; then note nccl "SKIP (no tests/test_nccl_comm)"
      elif [ -z "$gpu" ]; then stage nccl 60 "$build/tests/test_nccl_comm"
      else stage nccl 120 "$build/tests/test_nccl_comm" gpu; fi ;;
    e2e)
      if [ -z "$gpu" ]; then stage e2e 180 bash "$src/tests/integration/test_cuda.sh" "$build/dtrain" "$work/e2e" any
      else stage e2e 300 bash "$src/tests/integration/test_cuda.sh" "$build/dtrain" "$work/e2e" gpu; fi ;;
    profile) needs_gpu profile && stage profile 300 profile_runs ;;
    oom) needs_gpu oom && stage oom 120 oom_drill ;;
  esac
done
rm -rf "$work/out" "$work/e2e/out"
echo "---- summary ($summary)"
cat "$summary"
exit $failed
