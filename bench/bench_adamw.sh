#!/usr/bin/env bash
# bench/bench_adamw.sh - the host AdamW (what an offloaded optimizer and the
# cpu device run: sdk/lib/dt_optim_host.c) against PyTorch's fused CPU
# AdamW (torch.optim.AdamW(fused=True)), side by side, ROUNDS interleaved
# rounds on 1 and 2 threads, with the load average of each round.
#
#   bench/bench_adamw.sh BUILD [PARAMS] [ROUNDS]     (25000000, 3)
#
# BUILD holds bench/bench_adamw (any build of dtrain).  The peer needs a
# python with torch >= 2.4 ($PYTHON, default python3); torch is not a
# Debian package at that version, so, once:
#   python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch
#   PYTHON=~/.venvs/torch/bin/python bench/bench_adamw.sh build
# Each figure is the best of 5 passes (steps); the ratio is dtrain's
# params/s over torch's, per round.  Both sides get transparent huge pages
# for their large arrays: dtrain's as the cpu device allocates them,
# torch's through its own switch (THP_MEM_ALLOC_ENABLE=1).  Results:
# bench/results/offload.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: bench/bench_adamw.sh BUILD [PARAMS] [ROUNDS]}
n=${2:-25000000} rounds=${3:-3}
py=${PYTHON:-python3}
exe=$build/bench/bench_adamw
[ -x "$exe" ] || { echo "bench_adamw.sh: $exe: not built (cmake --build $build --target bench_adamw)" >&2; exit 2; }
"$py" -c 'import torch, sys; sys.exit(0 if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 4) else 1)' 2>/dev/null || {
  echo "bench_adamw.sh: $py has no torch >= 2.4 (fused CPU AdamW); see the top of this script" >&2; exit 2; }
echo "host AdamW, $n f32 parameters, 28 bytes of traffic each; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); torch $("$py" -c 'import torch; print(torch.__version__)')"
echo
echo "| round | threads | dtrain M params/s | torch fused M params/s | dtrain / torch | load |"
echo "|---|---|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  d=$("$exe" --params "$n" --threads 1,2 --reps 5)
  t=$(THP_MEM_ALLOC_ENABLE=1 "$py" "$here/adamw_torch.py" "$n" 1,2 5)
  load=$(cut -d' ' -f1 /proc/loadavg)
  for th in 1 2; do
    dm=$(awk -F'|' -v th=$th '$2 + 0 == th && $3 ~ /[0-9]/ { gsub(/ /, "", $4); print $4 }' <<<"$d")
    tm=$(awk -v th=$th '$1 == "torch" && $2 == th { print $4 }' <<<"$t")
    awk -v r=$r -v th=$th -v dm="$dm" -v tm="$tm" -v l="$load" \
      'BEGIN { printf "| %d | %d | %.1f | %.1f | %.2fx | %s |\n", r, th, dm, tm, dm / tm, l }'
  done
done
