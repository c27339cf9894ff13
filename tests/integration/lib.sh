# Shared helpers for the shell integration tests: each check prints one
# line, failures are counted, and the script ends with the plain summary
# "N passed, N failed" and a matching exit status.
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   - $1"; }
bad() {
  fail=$((fail + 1)); echo "FAIL - $1"
  if [ -n "${2:-}" ]; then printf '%s\n' "$2" | sed 's/^/       /'; fi
  return 0
}
# expect_exit CODE NAME CMD...: run CMD, check its exit code; output in $out
expect_exit() {
  local want=$1 name=$2; shift 2
  set +e; out=$("$@" 2>&1); local got=$?; set -e
  if [ "$got" = "$want" ]; then ok "$name (exit $got)"; else bad "$name: exit $got, expected $want" "$out"; fi
}
# expect_out NAME FIXED-STRING: the last command's output contains it
expect_out() {
  if printf '%s' "$out" | grep -qF -- "$2"; then ok "$1"; else bad "$1: output lacks '$2'" "$out"; fi
}
# losses METRICS.jsonl: the "loss" of every step line, one per line
losses() { grep -o '"loss": [^,]*' "$1" | cut -d' ' -f2; }
# skip NAME WHY: a check this build cannot make (counted neither way)
skip() { echo "skip - $1: $2"; }
# has_test_hooks BIN: BIN was built with DTRAIN_TEST_HOOKS (`dtrain env`;
# no pipe into grep -q, which would fail the pipeline under pipefail)
has_test_hooks() {
  case "$("$1" env 2>/dev/null)" in *"  hooks      test hooks compiled in"*) return 0 ;; esac
  return 1
}
finish() { echo "$pass passed, $fail failed"; [ "$fail" = 0 ]; }
