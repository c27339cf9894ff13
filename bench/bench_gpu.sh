#!/usr/bin/env bash
# bench/bench_gpu.sh BUILD OUT LLMC - GPT-2 124M training on one GPU, dtrain
# beside llm.c's CUDA trainer (train_gpt2.cu) in the same run, on the same
# token file, at llm.c's shape (micro-batch 16 x 1024 tokens), from random
# initialisation: tokens/s of the steady state and the ratio.
#
#   BUILD  a dtrain build folder with the cuda plugin
#   OUT    a folder for the logs and the table (OUT/table.md)
#   LLMC   either a folder of llm.c binaries built for this GPU
#          (train_gpt2cu-cudnn and/or train_gpt2cu-nocudnn), or an llm.c
#          checkout (it has train_gpt2.cu), built here into OUT/llmc-build:
#          without cuDNN always; with cuDNN's flash attention too when
#          CUDNN_FRONTEND names a cudnn-frontend checkout (header-only;
#          v1.18.0 links without NVRTC).  The build copies the checkout,
#          never changes it, and on CUDA 13 adapts its one call to the
#          cudaMemAdvise overload CUDA 13 removed (a sed on the copy).
#
# dtrain runs three ways: f32 activations with TF32 matmuls, bf16
# activations with f32 parameters, bf16 activations and parameters.  llm.c
# runs bf16 with its defaults (TF32 on for what stays f32, GELU recomputed).
# Each run's log is in OUT; the table gives the mean step time of the
# steady state (dtrain: steps 3-STEPS as it prints them; llm.c: its
# "total average iteration time", which leaves out step 1).  Environment:
# STEPS (20), GPU_ARCH (from nvidia-smi, e.g. 90).  Results are recorded
# in bench/results/gpu.md.
set -uo pipefail
if [ $# -ne 3 ]; then
  echo "usage: bench/bench_gpu.sh BUILD OUT LLMC" >&2
  exit 2
fi
build=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" || exit 2
out=$(cd "$2" && pwd)
llmc=$(cd "$3" && pwd) || exit 2
src=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-20}
B=16 T=1024
command -v nvidia-smi >/dev/null || { echo "bench_gpu: no nvidia-smi: no GPU here" >&2; exit 1; }
arch=${GPU_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')}

bins=()
if [ -f "$llmc/train_gpt2.cu" ]; then
  b="$out/llmc-build"
  rm -rf "$b" && cp -r "$llmc" "$b" || exit 1
  # CUDA 13 dropped cudaMemAdvise(ptr, n, advice, int device)
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$b/llmc/cuda_utils.cuh"
  flags=(GPU_COMPUTE_CAPABILITY="$arch" NO_MULTI_GPU=1 NO_USE_MPI=1)
  (cd "$b" && make train_gpt2cu "${flags[@]}" USE_CUDNN=0 NVCC_LDFLAGS="-lcublas -lcublasLt" \
    >"$out/llmc-build-nocudnn.log" 2>&1 && mv train_gpt2cu train_gpt2cu-nocudnn) &&
    bins+=("$b/train_gpt2cu-nocudnn")
  if [ -n "${CUDNN_FRONTEND:-}" ]; then
    ln -sfn "$CUDNN_FRONTEND" "$b/cudnn-frontend"
    (cd "$b" && make train_gpt2cu "${flags[@]}" USE_CUDNN=1 \
      CUDNN_FRONTEND_PATH="$CUDNN_FRONTEND/include" NVCC_LDFLAGS="-lcublas -lcublasLt -lcudnn" \
      >"$out/llmc-build-cudnn.log" 2>&1 && mv train_gpt2cu train_gpt2cu-cudnn) &&
      bins+=("$b/train_gpt2cu-cudnn")
  fi
else
  for v in cudnn nocudnn; do
    [ -x "$llmc/train_gpt2cu-$v" ] && bins+=("$llmc/train_gpt2cu-$v")
  done
fi
[ ${#bins[@]} -gt 0 ] || { echo "bench_gpu: no llm.c binary in or built from $llmc" >&2; exit 1; }

cd "$out" || exit 1
# the same bytes for both (dtrain's token files are llm.c's format): the
# project's own text, enough that a tenth (llm.c's validation file) holds
# more than one 16 x 1024 batch
cat "$src/README.md" "$src"/core/*/*.c >corpus.txt
"$build/dtrain" data prepare corpus.txt tokens.bin --val tokens_val.bin \
  --val-fraction 0.1 >/dev/null || exit 1
cat >gpt2.toml <<EOF
[run]
comm = "self"
device = "cuda"
out_dir = "runs"
log_every = 1
[model]
preset = "gpt2-124m"
[data]
train = "tokens.bin"
[train]
steps = $steps
micro_batch = $B
seq_len = $T
lr = 3e-4
[checkpoint]
overwrite = true
[cuda]
tf32 = true
EOF

# mean ms of dtrain's steps 3..N, from its step lines
dtrain_ms() { awk '/^step / { split($2, s, "/"); if (s[1] + 0 >= 3) { for (i = 1; i <= NF; i++) if ($i == "ms") { t += $(i - 1); n++ } } } END { if (n) printf "%.2f", t / n }' "$1"; }
rows=()
row() { # name ms
  local tps
  tps=$(awk -v ms="$2" -v bt=$((B * T)) 'BEGIN { if (ms > 0) printf "%.0f", bt / (ms / 1000) }')
  rows+=("$1|$2|$tps")
}
for cfg in "f32 activations, TF32 matmuls|" \
  "bf16 activations, f32 parameters|--set model.activations=bf16" \
  "bf16 activations and parameters|--set model.activations=bf16 --set model.dtype=bf16"; do
  name=${cfg%%|*} args=${cfg#*|} log="dtrain-$(echo "$name" | tr -c 'a-z0-9' '-').log"
  # shellcheck disable=SC2086
  timeout 300 "$build/dtrain" run gpt2.toml --set run.name=bench $args >"$log" 2>&1
  row "dtrain, $name" "$(dtrain_ms "$log")"
done
for bin in "${bins[@]}"; do
  v=${bin##*-}
  timeout 300 "$bin" -i tokens.bin -j tokens_val.bin -e d12 -b $B -t $T -x "$steps" \
    -v 1000000 -m 1 -s 0 -n 0 -h 0 -y 0 >"llmc-$v.log" 2>&1 </dev/null
  ms=$(sed -n 's/^total average iteration time: \([0-9.]*\) ms/\1/p' "llmc-$v.log")
  row "llm.c, bf16 ($v)" "$(printf '%.2f' "${ms:-0}")"
done

ref=$(for r in "${rows[@]}"; do echo "$r"; done | awk -F'|' '/^llm.c/ && $3 > m { m = $3 } END { print m + 0 }')
{
  echo "GPT-2 124M, micro-batch $B x $T tokens, $steps steps; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(date -u +%Y-%m-%d)"
  echo
  echo "| run | ms per step | tokens/s | x fastest llm.c |"
  echo "| --- | ---: | ---: | ---: |"
  for r in "${rows[@]}"; do
    IFS='|' read -r n ms tps <<<"$r"
    awk -v n="$n" -v ms="$ms" -v t="$tps" -v ref="$ref" \
      'BEGIN { x = ref > 0 ? sprintf("%.2f", t / ref) : "-"; printf "| %s | %s | %s | %s |\n", n, ms, t, x }'
  done
} | tee table.md
rm -rf runs
