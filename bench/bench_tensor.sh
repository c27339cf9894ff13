#!/usr/bin/env bash
# bench/bench_tensor.sh - tensor parallelism measured: (1) the all-reduces
# a tensor group runs, counted by the tensor-parallel scheme itself
# (megatron's report at the end of a run: "tensor group of T ranks: N
# all-reduces of B bytes in all"), per step and per transformer block,
# beside Megatron-LM's 2 in forward + 2 in backward per block and the
# model's own plan
# (dt_model_tp_comm: + 1 for the embedding, + 1 for the LM head, + 2 small
# ones for the parallel cross-entropy); (2) step time and tokens/s of tp2
# on 2 ranks against 1 rank training the same global batch; (3) the two
# schemes on tp2: megatron (1D, all-reduces) against megatron_sp (sequence
# parallelism: all-gathers and reduce-scatters), their traffic as each
# scheme counts it (bytes a rank sends on a ring), step time, and the
# activation memory a rank planned and measured (and `dtrain plan`'s for
# GPT-2 124M at 1024 tokens).  Prints markdown tables
# (bench/results/pipeline.md) and the machine's load.
#
#   bench/bench_tensor.sh DTRAIN [options]
#       --steps N       steps per run (default 6; step 1 is left out of times)
#       --layers "L.."  depths for the count (default "2 4 8")
#       --tp "T.."      tensor degrees timed against 1 rank (default "2")
#       --parts "P.."   which parts to run (default "1 2 3")
#       --preset NAME   the timed model (default gpt2-small: 4 layers, width
#                       256, 4 heads, vocabulary 256)
#       --work DIR      scratch folder (default a temporary one, removed)
#
# Both parts: micro-batches of 4 x 128 tokens, 2 of them a step (grad_accum
# 2), fp32 AdamW, 1 cpu thread per rank, shm, no evaluation.
set -euo pipefail
bin=${1:?usage: bench_tensor.sh DTRAIN [options]}; shift
steps=6 layers="2 4 8" tps="2" preset=gpt2-small work="" parts="1 2 3"
while [ $# -gt 0 ]; do
  case $1 in
    --parts) parts=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --tp) tps=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "bench_tensor.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
bin=$(readlink -f "$bin")
if [ -z "$work" ]; then
  work=$(mktemp -d /tmp/dtrain-bench-tensor.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
py=/usr/bin/python3
B=4 T=128 M=2
cat > b.toml <<T
[run]
comm = "shm"
out_dir = "out"
log_every = 1000
[data]
train = "train.bin"
[train]
steps = $steps
micro_batch = $B
grad_accum = $M
seq_len = $T
lr = 1e-4
[checkpoint]
dir = "$work/ckpt"
[cpu]
threads = 1
T
# ranks N ARGS...: N ranks as an external launcher starts them
ranks() {
  local n=$1; shift
  local job="bt$$-$RANDOM" pids=() rc=0
  for ((r = 0; r < n; r++)); do
    DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=$n DTRAIN_LOCAL_RANK=$r DTRAIN_LOCAL_SIZE=$n \
      DTRAIN_JOB_ID=$job "$bin" run b.toml "$@" >"rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}
median() { # METRICS -> "median_step_ms median_tok_s"
  $py - "$1" <<'P'
import json, statistics, sys
ms, tps = [], []
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("step", 0) > 1 and "step_ms" in j:
        ms.append(j["step_ms"]); tps.append(j["tokens_per_s"])
print(statistics.median(ms), statistics.median(tps))
P
}
part() { [[ " $parts " == *" $1 "* ]]; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if part 1; then
echo
echo "### All-reduces over the tensor group (tp2, $steps steps of $M micro-batches of $B x $T tokens)"
echo
echo "| layers | width | all-reduces / step | per block per micro-batch | planned / step | bytes / step (MiB) | planned (MiB) |"
echo "|--:|--:|--:|--:|--:|--:|--:|"
C=128
for L in $layers; do
  rm -rf ckpt
  ranks 2 --set parallel.tensor=2 --set model.n_layer="$L" --set model.n_head=4 \
    --set model.n_embd=$C --set model.context=$T --set run.name=c$L ||
    { echo "| $L | failed: $(tail -n 1 rank0.log) |"; continue; }
  read -r n bytes < <(sed -nE 's/.*tensor group of [0-9]+ ranks: ([0-9]+) all-reduces of ([0-9]+) bytes.*/\1 \2/p' rank0.log)
  # the plan: per micro-batch forward 2L + 1 + 2, backward 2L + 1 (4 a
  # micro-batch besides the blocks' 4 each); bytes
  # (2L + 1) B T C f32 each way and 3 B T f32 for the cross-entropy
  awk -v n="$n" -v by="$bytes" -v s="$steps" -v m="$M" -v L="$L" -v B=$B -v T=$T -v C=$C 'BEGIN {
    per = n / s; plan = m * (4 * L + 4)
    pb = m * ((4 * L + 2) * B * T * C * 4 + 3 * B * T * 4)
    printf "| %d | %d | %.0f | %.2f | %d | %.2f | %.2f |\n", L, C, per, (per / m - 4) / L, plan,
      by / s / 1048576, pb / 1048576 }'
done
fi
if part 2; then
echo
echo "### Step time: tp on T ranks vs 1 rank ($preset, a global batch of $M x $B sequences)"
echo
echo "| layout | ranks | step (ms) | tokens/s | vs 1 rank |"
echo "|---|--:|--:|--:|--:|"
rm -rf ckpt
"$bin" run b.toml --set run.comm=self --set model.preset="$preset" --set run.name=t1 \
  --metrics t1.jsonl >t1.log 2>&1 || { echo "1 rank failed: $(tail -n 1 t1.log)"; exit 1; }
read -r ms1 tps1 < <(median t1.jsonl)
printf "| 1 rank | 1 | %.0f | %.0f | 1.00x |\n" "$ms1" "$tps1"
for t in $tps; do
  rm -rf ckpt
  ranks "$t" --set parallel.tensor="$t" --set model.preset="$preset" --set run.name=t$t \
    --metrics t$t.jsonl || { echo "| tp$t | failed: $(tail -n 1 rank0.log) |"; continue; }
  read -r ms tps_ < <(median t$t.jsonl)
  awk -v t="$t" -v ms="$ms" -v tps="$tps_" -v ms1="$ms1" 'BEGIN {
    printf "| tp%d | %d | %.0f | %.0f | %.2fx |\n", t, t, ms, tps, ms1 / ms }'
done
fi
if part 3; then
echo
echo "### megatron vs megatron_sp on tp2 ($preset, $steps steps of $M micro-batches of $B x $T)"
echo
echo "| scheme | all-reduces | all-gathers | reduce-scatters | MiB sent / step / rank | step (ms) | activations planned = measured (MiB) |"
echo "|---|--:|--:|--:|--:|--:|--:|"
for scheme in megatron megatron_sp; do
  rm -rf ckpt
  ranks 2 --set parallel.tensor=2 --set tensor.scheme=$scheme --set model.preset="$preset" \
    --set run.name=s$scheme --metrics s$scheme.jsonl ||
    { echo "| $scheme | failed: $(tail -n 1 rank0.log) |"; continue; }
  read -r ms _ < <(median s$scheme.jsonl)
  $py - rank0.log "$scheme" "$ms" "$steps" <<'P'
import re, sys
log = open(sys.argv[1]).read()
t = re.search(r"tensor group of \d+ ranks: (\d+) all-reduces of \d+ bytes in all, (\d+) "
              r"all-gathers and (\d+) reduce-scatters of \d+ bytes in all; (\d+) bytes sent", log)
a = re.search(r"activations ([0-9.]+) / ([0-9.]+)", log)
s = int(sys.argv[4])
print("| %s | %s | %s | %s | %.2f | %.0f | %s = %s |" % (sys.argv[2], t.group(1), t.group(2),
      t.group(3), int(t.group(4)) / s / 2**20, float(sys.argv[3]), a.group(1), a.group(2)))
P
done
echo
cat > p124.toml <<T
[model]
preset = "gpt2-124m"
[train]
micro_batch = 4
seq_len = 1024
global_batch = 8
[parallel]
tensor = 2
T
for scheme in megatron megatron_sp; do
  "$bin" plan p124.toml --world 2 --set tensor.scheme=$scheme |
    awk -v s=$scheme '$1 == "ddp" { print "- `dtrain plan`, gpt2-124m, 4 x 1024 tokens, tp2, " s \
      ": activations " $8 " " $9 " a rank" }'
done
fi
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
