#!/usr/bin/env bash
# Step time with the optimizer state (and parameters) on an offload tier,
# beside the same run without offload: zero-2 and zero-3 on 2 local ranks
# over shm, 1 cpu thread per rank, and the device's and the tier's peaks.
#
#   bench/bench_offload.sh BUILD/dtrain [STEPS] [PRESET] > table.md
#   DTRAIN_BENCH_ONLY='^z2-(none|offload_cpu)' bench/bench_offload.sh ...  # a subset
#
# Target (issue 13): GPT-2 124M, zero-2 on 2 ranks, optimizer on
# offload_cpu: step time at most 1.15x the run without offload.  Step time
# is the median step_ms of steps 2..STEPS from --metrics.
set -euo pipefail
bin=$(readlink -f "$1"); steps=${2:-5}; preset=${3:-gpt2-124m}
work=$(mktemp -d /tmp/dtrain-bench-offload.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > b.toml <<T
[run]
comm = "shm"
out_dir = "out"
log_every = 1000
[model]
preset = "$preset"
[data]
train = "train.bin"
[train]
steps = $steps
micro_batch = 4
seq_len = 64
lr = 1e-4
[checkpoint]
dir = "$work/ckpt"
overwrite = true
[launch]
nproc = 2
[cpu]
threads = 1
T
py=/usr/bin/python3
summary() { # METRICS -> "median_step_ms device_peak_MiB tier_peak_MiB"
  $py - "$1" <<'P'
import json, statistics, sys
steps, dev, tier = [], 0, 0
for line in open(sys.argv[1]):
    o = json.loads(line)
    if "step" in o and o["step"] >= 2: steps.append(o["step_ms"])
    if "memory" in o: dev = o["memory"]["total_peak_bytes"]
    if "offload_tier" in o: tier = o["offload_tier"]["held_bytes"]
print("%.1f %.1f %.1f" % (statistics.median(steps), dev / 2**20, tier / 2**20))
P
}
echo "| run | step ms (median) | vs no offload | device peak MiB | tier MiB held |"
echo "|---|---|---|---|---|"
for stage in 2 3; do
  base=""
  for v in "none|" "offload_cpu|optimizer" "offload_cpu|optimizer_and_params" \
           "offload_nvme|optimizer" "offload_nvme|optimizer_and_params"; do
    tier=${v%|*} what=${v#*|}
    [ "$stage" = 2 ] && [ "$what" = optimizer_and_params ] && continue
    args=(--set parallel.data=zero --set zero.stage=$stage --set parallel.offload=$tier)
    [ -n "$what" ] && args+=(--set zero.offload_what=$what)
    [ "$tier" = offload_nvme ] && args+=(--set offload_nvme.path="$work/nvme")
    name="z$stage-$tier-$what"
    if [ -n "${DTRAIN_BENCH_ONLY:-}" ] && ! [[ $name =~ $DTRAIN_BENCH_ONLY ]]; then continue; fi
    "$bin" run b.toml "${args[@]}" --set run.name="$name" --metrics "$name.jsonl" >"$name.log" 2>&1 ||
      { echo "| zero-$stage $tier $what | failed: $(tail -n 1 "$name.log") | | | |"; continue; }
    read -r ms dev tpk <<<"$(summary "$name.jsonl")"
    [ -z "$base" ] && base=$ms
    ratio=$($py -c "print('%.2fx' % ($ms / $base))")
    echo "| zero-$stage, ${tier}${what:+ ($what)} | $ms | $ratio | $dev | $tpk |"
  done
done
