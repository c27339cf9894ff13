#!/usr/bin/env bash
# scripts/gpu-check.sh's plumbing on a machine without a GPU (the script
# itself is for a machine with one): every stage that needs a GPU says SKIP
# with the reason, the others run and pass, the summary and the logs are
# written, and usage errors exit 2.  Skipped (77) where nvidia-smi exists:
# there the script is run for real, by hand, with a GPU's time.
set -euo pipefail
build=$1 work=$2
. "$(dirname "$0")/lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "SKIPPED: nvidia-smi is here: run scripts/gpu-check.sh by hand on a GPU"
  exit 77
fi
rm -rf "$work"; mkdir -p "$work"
stages=(probe build runtime kernels memcheck racecheck oracle profile oom)
if [ ! -e "$build/plugins-out/dtrain_cuda.so" ]; then
  echo "SKIPPED: this build has no cuda plugin"
  exit 77
fi
expect_exit 0 "gpu-check without a GPU" bash "$src/scripts/gpu-check.sh" "$build" "$work/out" \
  "${stages[@]}"
for s in kernels memcheck racecheck oracle profile oom; do
  if grep -qxE "$s +SKIP \(no GPU: nvidia-smi not found\)" "$work/out/summary.txt"; then
    ok "$s: skipped, naming the reason"
  else bad "$s: not skipped with the reason" "$(cat "$work/out/summary.txt")"; fi
done
for s in probe build; do
  if grep -qE "^$s +PASS \([0-9]+s\)$" "$work/out/summary.txt"; then ok "$s: passed"
  else bad "$s: did not pass" "$(cat "$work/out/summary.txt")"; fi
done
# runtime: the GPU-free cases where the build has the cuda plugin, else a skip
if grep -qE "^runtime +(PASS \([0-9]+s\)|SKIP \(.*\))$" "$work/out/summary.txt"; then
  ok "runtime: the GPU-free cases passed or the build has no cuda plugin"
else bad "runtime" "$(cat "$work/out/summary.txt")"; fi
for s in probe build runtime; do
  if [ -s "$work/out/$s.log" ]; then ok "$s: its log written"; else bad "$s: no log"; fi
done
expect_exit 2 "an unknown stage" bash "$src/scripts/gpu-check.sh" "$build" "$work/out2" nope
expect_out "the unknown stage named" "gpu-check: unknown stage 'nope'"
expect_exit 2 "no arguments" bash "$src/scripts/gpu-check.sh"
expect_out "usage" "usage: scripts/gpu-check.sh BUILD OUT [STAGE...]"
finish
