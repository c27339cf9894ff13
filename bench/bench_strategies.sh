#!/usr/bin/env bash
# Every data-parallel strategy on GPT-2 124M side by side: per-rank model
# state (params + grads + optimizer peaks, measured by the device's tagged
# accounting, with the plan beside it), total peak, step time and tokens/s,
# at N = 2 and N = 4 local ranks over shm, 1 cpu thread per rank, a global
# batch of 4 sequences per rank.
#
#   bench/bench_strategies.sh BUILD/dtrain [STEPS] > table.md
#   DTRAIN_BENCH_NPROCS="2" DTRAIN_BENCH_STRATEGIES="ddp|zero 3" \
#     bench/bench_strategies.sh ...                                   # a subset
#   DTRAIN_BENCH_NPROCS="4" DTRAIN_BENCH_STRATEGIES="ddp|ddp pp2|zero 2 pp2" \
#     bench/bench_strategies.sh ...       # layouts: "ppP" splits the model in P
#                                         # pipeline stages (world = P x dp), "vV"
#                                         # into V interleaved chunks a stage; the
#                                         # model state is rank 0's, stage 0's
#
# Targets (issue 5): at N = 4 zero-3's model state <= 0.3x ddp's; at N = 2
# zero-3's step time <= 1.3x ddp's.  Step time is the median step_ms of
# steps 2..STEPS from --metrics (the final checkpoint save is not in it).
set -euo pipefail
bin=$(readlink -f "$1"); steps=${2:-5}
work=$(mktemp -d /tmp/dtrain-bench-strat.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > b.toml <<T
[run]
comm = "shm"
out_dir = "out"
log_every = 1000
[model]
preset = "gpt2-124m"
[data]
train = "train.bin"
[train]
steps = $steps
micro_batch = 4
seq_len = 64
lr = 1e-4
[checkpoint]
dir = "$work/ckpt"
[cpu]
threads = 1
T
py=/usr/bin/python3
summary() { # METRICS -> "state_meas state_plan total_meas median_step_ms median_tok_s"
  $py - "$1" <<'P'
import json, statistics, sys
ms, tps, mem = [], [], None
for line in open(sys.argv[1]):
    j = json.loads(line)
    if "memory" in j: mem = j["memory"]
    elif j.get("step", 0) > 1: ms.append(j["step_ms"]); tps.append(j["tokens_per_s"])
k = ("params", "grads", "optimizer")
print(sum(mem["peak_bytes"][t] for t in k), sum(mem["planned_bytes"][t] for t in k),
      mem["total_peak_bytes"], statistics.median(ms), statistics.median(tps))
P
}
echo "| N | strategy | model state / rank (MiB) | planned (MiB) | vs ddp | peak total / rank (MiB) | step (ms) | vs ddp | tokens/s |"
echo "|--:|---|--:|--:|--:|--:|--:|--:|--:|"
IFS='|' read -r -a strategies <<<"${DTRAIN_BENCH_STRATEGIES:-ddp|zero 1|zero 2|zero 3|fsdp FULL_SHARD|fsdp SHARD_GRAD_OP}"
for n in ${DTRAIN_BENCH_NPROCS:-2 4}; do
  ddp_state=0 ddp_ms=0
  for v in "${strategies[@]}"; do
    set -- $v
    sets=(--set parallel.data="$1" --set train.global_batch=$((4 * n)))
    [ "$1" = zero ] && sets+=(--set zero.stage="$2")
    [ "$1" = fsdp ] && sets+=(--set fsdp.sharding_strategy="$2")
    for w in "$@"; do
      [[ $w == pp[0-9]* ]] && sets+=(--set parallel.pipeline="${w#pp}")
      [[ $w == v[0-9]* ]] && sets+=(--set pipeline.virtual_stages="${w#v}")
      [[ $w == tp[0-9]* ]] && sets+=(--set parallel.tensor="${w#tp}")
    done
    rm -rf ckpt
    "$bin" run b.toml --set launch.nproc="$n" "${sets[@]}" --set run.name="r$n" \
      --metrics m.jsonl >run.log 2>&1 || { echo "| $n | $v | failed: $(tail -n 1 run.log) |"; continue; }
    read -r st pl tot ms tps < <(summary m.jsonl)
    if [ "$v" = ddp ]; then ddp_state=$st ddp_ms=$ms; fi
    awk -v n="$n" -v name="$v" -v st="$st" -v pl="$pl" -v tot="$tot" -v ms="$ms" \
        -v ds="$ddp_state" -v dm="$ddp_ms" -v tps="$tps" 'BEGIN {
      m = 1048576; printf "| %d | %s | %.1f | %.1f | %.2fx | %.1f | %.0f | %.2fx | %.0f |\n",
        n, name, st / m, pl / m, st / ds, tot / m, ms, ms / dm, tps }'
  done
done
