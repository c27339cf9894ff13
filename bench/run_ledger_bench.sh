#!/usr/bin/env bash
# bench/run_ledger_bench.sh BUILD [ROUNDS] [SIZES]: what the collective
# ledger costs a real collective.  Interleaved rounds of `dtrain bench comm`
# (shm all_reduce, f32 sum, 2 ranks, 20000 calls a size) without and with
# --ledger (the interposer every `dtrain run` puts over its comm plugin),
# the 1-minute load average read before each; prints per size and variant
# the median, 25th percentile and minimum time(us) over the rounds, and the
# mean load.  bench/results/ledger.md has a run.
set -euo pipefail
build=${1:?usage: run_ledger_bench.sh BUILD [ROUNDS] [SIZES]}
rounds=${2:-30} sizes=${3:-4:64}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for ((round = 1; round <= rounds; round++)); do
  for v in plain ledger; do
    extra=(); [ $v = ledger ] && extra=(--ledger)
    la=$(cut -d' ' -f1 /proc/loadavg)
    "$build/dtrain" bench comm --nproc 2 --sizes "$sizes" --iters 20000 --warmup 1000 \
      "${extra[@]}" 2>&1 | awk -v v=$v -v la="$la" '$1 ~ /^[0-9]+$/ {print v, la, $1, $5}' >>"$raw"
  done
done
python3 - "$raw" <<'PY'
import collections, statistics as st, sys
t = collections.defaultdict(list); load = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, la, size, us = line.split()
    t[(v, int(size))].append(float(us)); load[v].append(float(la))
print("| size (B) | plain median | plain p25 | plain min | ledger median | ledger p25 | ledger min |")
print("|---|---|---|---|---|---|---|")
for size in sorted({k[1] for k in t}):
    row = []
    for v in ("plain", "ledger"):
        x = sorted(t[(v, size)])
        row += ["%.2f" % st.median(x), "%.2f" % x[len(x) // 4], "%.2f" % x[0]]
    print("| %d | %s |" % (size, " | ".join(row)))
print("\nrounds: %d each; mean 1-minute load: plain %.2f, ledger %.2f" %
      (len(t[("plain", min(k[1] for k in t))]), st.mean(load["plain"]), st.mean(load["ledger"])))
PY
