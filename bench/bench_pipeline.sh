#!/usr/bin/env bash
# bench/bench_pipeline.sh - the pipeline bubble as measured against the
# formula (p-1)/(m+p-1): for each schedule, stage count p and micro-batch
# count m, a short pipeline run of a GPT-2 whose stages are balanced by
# parameters, and each stage's idle fraction from the metrics file
# (pipeline_idle: 1 - the stage's busy time, in run_schedule and not
# waiting on a receive, over the slowest stage's schedule time), the
# median over steps 2..N (step 1 warms up).  Prints a markdown table
# (bench/results/pipeline.md) and the machine's load before and after.
#
#   bench/bench_pipeline.sh DTRAIN [options]
#       DTRAIN         the dtrain binary (this script builds nothing)
#   options:
#       --stages "P.." stage counts (default "2 4"; one rank each, 1 thread)
#       --micro "M.."  micro-batch counts (default "1 2 4 8")
#       --steps N      steps per run (default 6)
#       --chunks V     interleaved: [pipeline] virtual_stages = V (default 1);
#                      the formula is then (p-1)/(V m+p-1), and an m that is
#                      not a multiple of p is skipped (interleaving needs it)
#       --work DIR     scratch folder (default a temporary one, removed)
#       --set K=V      passed on to every run (any number)
#
# The model: 8 layers of width 128 over 128 tokens, micro-batches of 1
# sequence (a global batch of m), so a micro-batch's forward and backward
# take a few ms per stage; shm.spin_us = 0, so a rank waiting on a
# receive sleeps instead of spinning on a core its peer needs.  Ranks are
# started the way an external launcher starts them (DTRAIN_* environment).
set -euo pipefail
bin=${1:?usage: bench_pipeline.sh DTRAIN [options]}; shift
stages="2 4" micro="1 2 4 8" steps=6 work="" sets=() chunks=1
while [ $# -gt 0 ]; do
  case $1 in
    --stages) stages=$2; shift 2 ;;
    --micro) micro=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --chunks) chunks=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    *) echo "bench_pipeline.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
bin=$(realpath "$bin")
if [ -z "$work" ]; then work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi
mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > bench.toml <<T
[run]
comm = "shm"
out_dir = "out"
[model]
n_layer = 8
n_head = 4
n_embd = 128
context = 128
[data]
train = "train.bin"
[train]
steps = $steps
micro_batch = 1
seq_len = 128
lr = 1e-3
warmup_steps = 1
[checkpoint]
every = 0
[launch]
timeout = 60.0
[cpu]
threads = 1
[shm]
spin_us = 0
[pipeline]
balance = "params"
T
# one run: P ranks, schedule S, M micro-batches; its metrics in NAME.jsonl
run() {
  local p=$1 s=$2 m=$3 name=$4 job="bp$$-$RANDOM" pids=() rc=0
  for ((r = 0; r < p; r++)); do
    DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=$p DTRAIN_LOCAL_RANK=$r DTRAIN_LOCAL_SIZE=$p \
      DTRAIN_JOB_ID=$job "$bin" run bench.toml --set parallel.pipeline="$p" \
      --set pipeline.schedule="$s" --set train.global_batch="$m" --set run.name="$name" \
      --set pipeline.virtual_stages="$chunks" --metrics "$name.jsonl" "${sets[@]}" \
      >"$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  if [ $rc != 0 ]; then
    echo "bench_pipeline.sh: p=$p $s m=$m failed (exit $rc):" >&2
    cat "$name".rank*.log >&2
    exit 1
  fi
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for p in $stages; do
  run "$p" gpipe "$p" "assign$p"
  echo; echo "p = $p, $chunks chunk(s) a stage, stages by parameters:"
  grep -E '^pipeline: (virtual )?stage' "assign$p.rank0.log" | sed 's/^/    /'
done
echo
echo "| p | schedule | m | formula | measured idle per stage (median of steps 2-$steps) | mean | mean - formula | step ms |"
echo "|---|---|---|---|---|---|---|---|"
for p in $stages; do
  for s in gpipe 1f1b; do
    for m in $micro; do
      if [ "$chunks" -gt 1 ] && [ $((m % p)) != 0 ]; then continue; fi
      run "$p" "$s" "$m" "p$p-$s-m$m"
      python3 - "p$p-$s-m$m.jsonl" "$p" "$s" "$m" "$chunks" <<'P'
import json, statistics as st, sys
path, p, s, m, V = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
v = [json.loads(l) for l in open(path) if l.startswith('{"step"')][1:]
idle = [st.median(d["pipeline_idle"][k] for d in v) for k in range(p)]
mean = sum(idle) / p
f = (p - 1) / (V * m + p - 1)
print("| %d | %s%s | %d | %.3f | %s | %.3f | %+.3f | %.0f |" % (
    p, s, " x%d" % V if V > 1 else "", m, f, " ".join("%.3f" % x for x in idle), mean, mean - f,
    st.median(d["step_ms"] for d in v)))
P
    done
  done
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
