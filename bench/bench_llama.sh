#!/bin/sh
# bench/bench_llama.sh - dtrain's llama training step on the cpu device
# beside PyTorch eager's (bench/llama_torch.py: transformers'
# LlamaForCausalLM, float32, fused AdamW) on the same shape, batch,
# sequence and threads, run interleaved (dtrain, torch, dtrain, torch, ...)
# so both see the same machine; prints each run's mean ms/step, the best
# of each, their ratio and the load averages (bench/results/llama.md).
#
#   bench/bench_llama.sh DTRAIN [options]
#       DTRAIN          the dtrain binary (this script builds nothing)
#   options:
#       --python PATH   a Python with torch and transformers (default
#                       /tmp/torchvenv/bin/python)
#       --shape NAME    smollm-135m (the preset: L 30, C 576, 9 heads of 64,
#                       3 kv heads, I 1536, V 49152, tied) or small (L 4,
#                       C 256, 8 heads of 32, 2 kv heads, I 768, V 4096,
#                       untied; default smollm-135m)
#       --threads N     [cpu] threads and torch.set_num_threads (default 2)
#       --batch B       micro-batch (default 4)
#       --seq T         sequence length (default 64)
#       --steps N       timed steps per run (default 3)
#       --warmup N      untimed steps first (default 1)
#       --repeat N      pairs of runs (default 3)
#       --keep DIR      work in DIR and keep it (default: a temporary folder)
#
# dtrain's step time is the engine's step_ms (metrics file: forward,
# backward, AdamW; its gradient-norm clipping included, which the torch
# step lacks); torch's the wall time of zero_grad, forward, cross-entropy,
# backward and the fused AdamW step.  Both mean over the timed steps; the
# ratio is best dtrain / best torch (below 1: dtrain is faster).  Each
# row carries the 1-minute load average just before that run: the machine
# may be shared, and only runs of one invocation compare.
set -eu

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
DTRAIN=$1
shift
[ -x "$DTRAIN" ] || { echo "bench_llama: $DTRAIN is not an executable" >&2; exit 2; }
PY=/tmp/torchvenv/bin/python SHAPE=smollm-135m THREADS=2 B=4 T=64 STEPS=3 WARMUP=1 REPEAT=3
KEEP=""
while [ $# -gt 0 ]; do
    case "$1" in
    --python) PY=$2; shift ;;
    --shape) SHAPE=$2; shift ;;
    --threads) THREADS=$2; shift ;;
    --batch) B=$2; shift ;;
    --seq) T=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --keep) KEEP=$2; shift ;;
    *) echo "bench_llama: unknown option $1" >&2; usage ;;
    esac
    shift
done
case $SHAPE in
smollm-135m) L=30 C=576 NH=9 NKV=3 I=1536 V=49152 TIED=1 ;;
small) L=4 C=256 NH=8 NKV=2 I=768 V=4096 TIED=0 ;;
*) echo "bench_llama: --shape $SHAPE: smollm-135m or small" >&2; exit 2 ;;
esac
"$PY" -c "import torch, transformers" 2> /dev/null ||
    { echo "bench_llama: $PY cannot import torch and transformers" >&2; exit 2; }

if [ -n "$KEEP" ]; then
    WORK=$KEEP
    mkdir -p "$WORK"
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench_llama.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
fi
TEXT=/usr/share/common-licenses/GPL-3
[ -r "$TEXT" ] || TEXT="$0"
"$DTRAIN" data prepare "$TEXT" "$WORK/train.bin" > /dev/null

TIE=false
[ "$TIED" = 1 ] && TIE=true
cat > "$WORK/llama.toml" << EOF
[run]
name = "bench-llama"
out_dir = "$WORK/runs"
comm = "self"
log_every = 1
[model]
arch = "llama"
n_layer = $L
n_head = $NH
n_kv_head = $NKV
n_embd = $C
intermediate_size = $I
vocab_size = $V
context = $T
tie_embeddings = $TIE
dtype = "fp32"
[data]
train = "$WORK/train.bin"
[train]
steps = $((WARMUP + STEPS))
micro_batch = $B
seq_len = $T
warmup_steps = 0
[parallel]
data = "ddp"
[cpu]
threads = $THREADS
[checkpoint]
dir = "$WORK/ckpt"
EOF

# mean step_ms of the steps after the warm-up
mean_step_ms() {
    awk -v w="$WARMUP" -F'[:,]' '/"step_ms"/ {
            for (i = 1; i < NF; i++) {
                if ($i ~ /"step"$/) s = $(i + 1) + 0
                if ($i ~ /"step_ms"$/) ms = $(i + 1) + 0
            }
            if (s > w) { sum += ms; n++ } }
         END { if (n) printf "%.1f\n", sum / n; else print "nan" }' "$1"
}
load() { cut -d' ' -f1 /proc/loadavg; }
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (b == "" || a + 0 < b + 0) ? a : b }'; }

echo "| run | dtrain (ms/step) | load before | torch (ms/step) | load before |"
echo "|----:|-----------------:|------------:|----------------:|------------:|"
BD="" BT=""
i=1
while [ "$i" -le "$REPEAT" ]; do
    l1=$(load)
    if ! "$DTRAIN" run "$WORK/llama.toml" --metrics "$WORK/d$i.jsonl" > "$WORK/d$i.log" 2>&1; then
        echo "bench_llama: dtrain run failed:" >&2
        tail -5 "$WORK/d$i.log" >&2
        exit 1
    fi
    rm -rf "$WORK/ckpt" "$WORK/runs"
    d=$(mean_step_ms "$WORK/d$i.jsonl")
    l2=$(load)
    if ! "$PY" "$(dirname "$0")/llama_torch.py" --layers $L --heads $NH --kv-heads $NKV \
        --embd $C --inter $I --vocab $V --batch "$B" --seq "$T" --threads "$THREADS" \
        --steps "$STEPS" --warmup "$WARMUP" --tied $TIED > "$WORK/t$i.log" 2>&1; then
        echo "bench_llama: torch run failed:" >&2
        tail -5 "$WORK/t$i.log" >&2
        exit 1
    fi
    t=$(awk '/^torch / { print $2 }' "$WORK/t$i.log")
    echo "| $i | $d | $l1 | $t | $l2 |"
    BD=$(min "$d" "$BD") BT=$(min "$t" "$BT")
    i=$((i + 1))
done
awk -v d="$BD" -v t="$BT" -v s="$SHAPE" -v b="$B" -v T="$T" -v th="$THREADS" 'BEGIN {
    printf "\n%s, B=%s T=%s, %s threads: best dtrain %.1f ms, best torch %.1f ms, " \
           "dtrain/torch %.2f\n", s, b, T, th, d, t, d / t }'
