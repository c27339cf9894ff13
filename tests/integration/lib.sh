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
# expect_out NAME FIXED-STRING: the last command's output contains it (a
# here-string, not a pipe: grep -q stops reading at the first match, and
# under pipefail a printf killed by SIGPIPE would fail the check)
expect_out() {
  if grep -qF -- "$2" <<<"$out"; then ok "$1"; else bad "$1: output lacks '$2'" "$out"; fi
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
# ranks N ARGS...: start N ranks of `$bin run ARGS` with one job id, the way
# an external launcher starts them (DTRAIN_* environment, one process each);
# rank r's output goes to rank<r>.log; returns the first non-zero exit status.
ranks() {
  local n=$1; shift
  local job="t$$-$RANDOM" pids=() rc=0
  for ((r = 0; r < n; r++)); do
    DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=$n DTRAIN_LOCAL_RANK=$r DTRAIN_LOCAL_SIZE=$n \
      DTRAIN_JOB_ID=$job "$bin" run "$@" >"rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { local s=$?; [ $rc = 0 ] && rc=$s; }; done
  return $rc
}
# same_losses NAME A.jsonl B.jsonl [TOL]: line by line within TOL (1e-5)
same_losses() {
  local d tol=${4:-1e-5}
  d=$(paste <(losses "$2") <(losses "$3") | awk 'NF == 2 { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
        END { if (n == 0) print "none"; else printf "%.3g %d\n", m, n }')
  if [ "$d" != none ] && awk -v d="${d% *}" -v t="$tol" 'BEGIN { exit !(d <= t) }'; then
    ok "$1: losses match within $tol (max diff ${d% *} over ${d#* } steps)"
  else bad "$1: losses differ by more than $tol (max diff $d)" "$(paste <(losses "$2") <(losses "$3"))"; fi
}

