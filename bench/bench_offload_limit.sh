#!/usr/bin/env bash
# An NVMe-offloaded step against its physical limit (issue 28): GPT-2
# (gpt2-124m by default) on 1 rank, zero-3 with the parameters, the
# optimizer state and the reduced gradients in offload_nvme's files, beside
# the same step without offload (compute only: the model fits here), the
# bytes the step moved through the tier (the strategy's own count, the
# "tier bytes" of its debug line) and fio's sequential write and read
# bandwidth in the same folder, measured in the same round.  Optionally an
# older build (OLD: its bin/dtrain) runs the same offloaded step in every
# round, in alternating order with this one, so that a drift in the
# machine's load falls on both.  Not part of ctest.
#
#   bench/bench_offload_limit.sh BUILD_DIR [DIR] > table.md
#   OLD=/tmp/old-install/bin/dtrain ROUNDS=3 bench/bench_offload_limit.sh build
#
# DIR: the tier's folder and fio's file (default /var/tmp/dtrain-offload-limit).
# Environment: STEPS (4; the step time is the median step_ms of steps
# 2..STEPS), ROUNDS (2), PRESET (gpt2-124m), DTYPE (fp32 or bf16), THREADS
# (2, [cpu] threads), FIO_MIB (1024: fio's file), OLD (unset: no old build).
#
# The limit the issue sets: max(compute-only step, bytes / disk bandwidth),
# printed twice: with the bytes this step moves (loaded / fio read +
# stored / fio write) and with the 30 bytes a parameter that a step with
# f32 master and moments and bf16 parameters cannot avoid (16 read, 14
# written).  Each row gives the 1-minute load average at its start (this
# is a shared machine: rows taken at different loads do not compare) and
# the process's peak resident set (/usr/bin/time), and where the
# offloaded step went (medians over steps 2..: the update - tier waits,
# device copies, host optimizer - and the gradients' moves to the tier).
set -euo pipefail
build=$(readlink -f "$1")
dir=${2:-/var/tmp/dtrain-offload-limit}
STEPS=${STEPS:-4} ROUNDS=${ROUNDS:-2} PRESET=${PRESET:-gpt2-124m} DTYPE=${DTYPE:-fp32}
THREADS=${THREADS:-2} FIO_MIB=${FIO_MIB:-1024} OLD=${OLD:-}
new=$build/dtrain
command -v fio > /dev/null || { echo "bench_offload_limit: fio is not installed (scripts/install-deps.sh)" >&2; exit 2; }
[ -x "$new" ] || { echo "bench_offload_limit: $new not built" >&2; exit 2; }
[ -z "$OLD" ] || [ -x "$OLD" ] || { echo "bench_offload_limit: OLD=$OLD is not a program" >&2; exit 2; }
mkdir -p "$dir"
work=$(mktemp -d "$dir/run.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
"$new" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
cat > b.toml <<T
[run]
comm = "self"
out_dir = "out"
log_every = 1
[model]
preset = "$PRESET"
dtype = "$DTYPE"
[data]
train = "train.bin"
[train]
steps = $STEPS
micro_batch = 1
seq_len = 64
lr = 6e-5
decay = "constant"
gradient_clipping = 1.0
[optimizer]
type = "adamw"
weight_decay = 0.1
[parallel]
data = "zero"
[zero]
stage = 3
[checkpoint]
dir = "$work/ckpt"
overwrite = true
[cpu]
threads = $THREADS
T
nvme=(--set parallel.offload=offload_nvme --set zero.offload_what=optimizer_and_params
      --set offload_nvme.path="$work/tier")
py=/usr/bin/python3
load() { cut -d' ' -f1 /proc/loadavg; }
median_s() { # METRICS -> median step seconds of steps 2..
  $py - "$1" <<'P'
import json, statistics, sys
s = [json.loads(l) for l in open(sys.argv[1])]
ms = [o["step_ms"] for o in s if "step_ms" in o and o.get("step", 0) >= 2]
print("%.2f" % (statistics.median(ms) / 1e3))
P
}
phases() { # LOG -> "update_s grads_s": medians over steps 2.. of the strategy's debug
  # line (the update: tier wait + device copies + host optimizer; the
  # gradients' moves to the tier during backward)
  $py - "$1" <<'P'
import re, statistics, sys
u, g = [], []
for l in open(sys.argv[1]):
    m = re.search(r"step (\d+): offloaded optimizer: tier I/O wait ([\d.]+) ms, device copies "
                  r"([\d.]+) ms, host optimizer ([\d.]+) ms.*gradients to the tier ([\d.]+) ms", l)
    if m and int(m.group(1)) >= 2:
        u.append(sum(float(m.group(i)) for i in (2, 3, 4)) / 1e3)
        g.append(float(m.group(5)) / 1e3)
print("%.2f %.2f" % (statistics.median(u), statistics.median(g)) if u else "- -")
P
}
moved() { # LOG -> "loaded stored" bytes of step 2 (the strategy's debug line), or "- -"
  local l; l=$(grep -E 'step 2: offloaded optimizer' "$1" | head -n 1 || true)
  if [[ $l =~ loaded\ ([0-9]+),\ stored\ ([0-9]+) ]]; then echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
  else echo "- -"; fi
}
run() { # NAME BIN ARGS... -> "seconds load peak_rss_MiB"
  local name=$1 bin=$2 ld; shift 2
  ld=$(load)
  rm -rf out ckpt tier
  DTRAIN_LOG=debug /usr/bin/time -f %M -o "$name.rss" "$bin" run b.toml --set run.name="$name" \
    --metrics "$name.jsonl" "$@" >"$name.log" 2>&1 || { echo "failed $(tail -n 1 "$name.log")"; return; }
  echo "$(median_s "$name.jsonl") $ld $(awk '{printf "%.0f", $1 / 1024}' "$name.rss")"
}
fio_bw() { # write|read -> MiB/s (1 MiB sequential, QD 4, O_DIRECT, io_uring)
  fio --name=seq --filename="$work/fio.dat" --size="${FIO_MIB}M" --bs=1M --iodepth=4 --direct=1 \
      --ioengine=io_uring --rw="$1" --output-format=json 2>/dev/null |
    $py -c 'import json, sys; j = json.load(sys.stdin)["jobs"][0]; print("%.0f" % (j[sys.argv[1]]["bw_bytes"] / 2**20))' "$1"
}
nparams=$("$new" plan b.toml "${nvme[@]}" | sed -n 's/^plan: [a-z0-9]*, \([0-9.]*\)M parameters.*/\1/p')
echo "$PRESET ($nparams M parameters, $DTYPE), zero-3 on 1 rank, [cpu] threads $THREADS, micro-batch 1 x 64;"
echo "step time: median of steps 2..$STEPS; fio: 1 MiB sequential, QD 4, O_DIRECT, io_uring, ${FIO_MIB} MiB, in $dir"
echo
echo "| round | run | step s | load | peak RSS MiB | update s | grads to tier s | compute-only s | tier GiB loaded / stored | fio read / write MiB/s | limit (these bytes) s | limit (30 B/param) s | step / limit |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
row() { # ROUND WHO STEP_S LOAD RSS UPDATE_S GRADS_S COMPUTE_S LOADED STORED FIO_READ FIO_WRITE
  $py - "$@" "$nparams" <<'P'
import sys
r, who, s, l, rss, us, gs, cs, lb, sb, rd, w, npar = sys.argv[1:]
try:
    s, cs, rd, w = float(s), float(cs), float(rd), float(w)
except ValueError:
    print("| %s | %s | %s | %s | | | | %s | | | | | |" % (r, who, s, l, cs)); sys.exit()
mib = 2.0 ** 20
lim, bytes_ = None, "-"
if lb != "-":
    lim = max(cs, int(lb) / mib / rd + int(sb) / mib / w)
    bytes_ = "%.2f / %.2f" % (int(lb) / 2**30, int(sb) / 2**30)
p = float(npar) * 1e6
lim30 = max(cs, 16 * p / mib / rd + 14 * p / mib / w)
print("| %s | %s | %.2f | %s | %s | %s | %s | %.2f | %s | %.0f / %.0f | %s | %.2f | %s |" % (
    r, who, s, l, rss, us, gs, cs, bytes_, rd, w, "%.2f" % lim if lim else "-", lim30,
    "%.2fx" % (s / lim) if lim else "-"))
P
}
for ((r = 1; r <= ROUNDS; r++)); do
  w=$(fio_bw write); rd=$(fio_bw read); rm -f "$work/fio.dat"
  read -r cs cl crss <<<"$(run none-$r "$new")"
  order=(new); [ -n "$OLD" ] && { ((r % 2)) && order=(old new) || order=(new old); }
  declare -A res=()
  for who in "${order[@]}"; do
    bin=$new; [ "$who" = old ] && bin=$OLD
    res[$who]=$(run "$who-$r" "$bin" "${nvme[@]}")
  done
  # the old build does not count its bytes: the requests are the same, so
  # its row takes this build's count of the same round
  read -r lb sb <<<"$(moved "new-$r.log")"
  for who in "${order[@]}"; do
    read -r s l rss <<<"${res[$who]}"
    read -r us gs <<<"$(phases "$who-$r.log")"
    row "$r" "$who" "$s" "$l" "$rss" "$us" "$gs" "$cs" "$lb" "$sb" "$rd" "$w"
  done
  echo "| $r | compute only (no offload) | $cs | $cl | $crss | | | | | | | | |"
done
