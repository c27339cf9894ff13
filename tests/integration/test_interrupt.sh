#!/usr/bin/env bash
# Ctrl-C and SIGTERM in the middle of writing: an interrupted export,
# consolidate, data prepare or checkpoint save leaves no temp file or
# "step-N.tmp" behind and dies of the signal (exit 128 + 15 in a shell);
# and Ctrl-C to the launcher stops ranks that were started with SIGINT
# ignored at once, not after the grace period.
#
# The writes are stopped at a known point with the fault hooks of
# core/util/fileutil.c: DTRAIN_FAULT_WRITE_AFTER_BYTES=0 with
# DTRAIN_FAULT_STOP_ON_FULL=1 makes the process SIGSTOP itself at its first
# write; the test then sends SIGTERM and SIGCONT.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"

tiny_run_setup "$bin" '[launch]' 'timeout = 20.0'
expect_exit 0 "a run saves step 2" "$bin" run tiny.toml --set run.name=a

# stopped PID: the process has stopped itself (state T)
stopped() { [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = T ]; }
# leftovers: every temp name under the folder ("*.tmp", "*.tmp.*")
leftovers() { find . -name '*.tmp' -o -name '*.tmp.*'; }

# interrupt NAME CMD...: run CMD until it stops at its first write, SIGTERM
# it, and check the exit status and that no temp file is left
interrupt() {
  local name=$1; shift
  DTRAIN_FAULT_WRITE_AFTER_BYTES=0 DTRAIN_FAULT_STOP_ON_FULL=1 "$@" > int.log 2>&1 &
  local pid=$! i
  for i in $(seq 400); do stopped "$pid" && break; sleep 0.05; done
  if ! stopped "$pid"; then
    kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    bad "$name: never reached its first write" "$(cat int.log)"; return 0
  fi
  local mid; mid=$(leftovers)
  [ -n "$mid" ] && ok "$name: stopped mid-write with a temp file ($(echo $mid))" ||
    bad "$name: no temp file while writing" "$(find . -newer tiny.toml)"
  kill -TERM "$pid"; kill -CONT "$pid"
  local code=0
  wait "$pid" || code=$?
  [ "$code" = 143 ] && ok "$name: SIGTERM: exit 143 (killed by SIGTERM)" ||
    bad "$name: exit $code, expected 143" "$(cat int.log)"
  local left; left=$(leftovers)
  # (removed after a failure, so each case is judged on its own)
  [ -z "$left" ] && ok "$name: no temp file left" || { bad "$name: left $left" ""; rm -rf $left; }
}

if has_test_hooks "$bin"; then
  interrupt "export" "$bin" export out/a/ckpt a.st
  [ ! -e a.st ] && ok "export: no output" || bad "export: a.st written" ""
  interrupt "consolidate" "$bin" ckpt consolidate out/a/ckpt cons
  [ ! -e cons/step-00000002 ] && ok "consolidate: no output" || bad "consolidate: output" "$(ls -R cons)"
  interrupt "data prepare" "$bin" data prepare text.txt again.bin
  [ ! -e again.bin ] && ok "data prepare: no output" || bad "data prepare: again.bin written" ""
  interrupt "a checkpoint save" "$bin" run tiny.toml --set run.name=s --set train.steps=1
  [ ! -e out/s/ckpt/step-00000001 ] && ok "save: no checkpoint" ||
    bad "save: a checkpoint" "$(ls -l out/s/ckpt)"
else
  skip "interrupted writes" "this build has no test hooks (DTRAIN_TEST_HOOKS=OFF)"
fi

# -- Ctrl-C to the launcher, started with SIGINT ignored (`trap '' INT`, as
# a script's background job has it): the ranks stop at once, not after the
# launcher's 5 s grace and SIGKILL
cp tiny.toml int.toml
bash -c 'trap "" INT; exec "$0" run int.toml --set launch.nproc=2 --set run.comm=shm \
  --set run.name=int --set train.steps=1000000 --set checkpoint.every=0' "$bin" \
  > launch.log 2>&1 &
lpid=$!
for _ in $(seq 600); do grep -qF "[rank 0] step     2/" launch.log && break; sleep 0.05; done
ranks=$(pgrep -P "$lpid" || true)
if grep -qF "[rank 0] step     2/" launch.log && [ -n "$ranks" ]; then
  t0=$(date +%s%N)
  kill -INT "$lpid"
  code=0; wait "$lpid" || code=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  out=$(grep -v "step  *[0-9]*/" launch.log || true) # all but the step lines
  [ "$code" = 130 ] && ok "SIGINT: the launcher exits 128+2" || bad "SIGINT: exit $code, expected 130" "$out"
  expect_out "SIGINT passed on" "dtrain: got SIGINT: passed it on to 2 ranks"
  expect_out "SIGINT summary" "dtrain: stopped by SIGINT"
  [ "$ms" -lt 3000 ] && ok "the ranks stopped promptly ($ms ms, under the 5 s grace)" ||
    bad "the ranks took $ms ms to stop (the launcher's grace is 5 s)" "$out"
  if grep -qE "did not stop within|killing the remaining ranks" <<<"$out"; then
    bad "the ranks had to be killed" "$out"; else ok "no rank needed SIGKILL"; fi
  alive=""
  for p in $ranks; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
  [ -z "$alive" ] && ok "no rank left" || { bad "ranks left:$alive" ""; kill -KILL $alive || true; }
else
  kill -KILL "$lpid" 2>/dev/null || true; wait "$lpid" 2>/dev/null || true
  bad "the launched run did not reach step 2" "$(tail -n 5 launch.log)"
fi
finish
