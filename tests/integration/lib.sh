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
# planned_is_measured NAME METRICS [SCRATCH]: rank 0's memory record
# planned every tag's peak to the byte (the total measured, the peak of
# the sum, at most the plan's sum of peaks), but for the
# device's own kernel scratch, which no plan holds: SCRATCH bytes (0 by
# default) of measured staging beyond the plan (the cpu device's, its
# threads x T floats of attention backward or threads x min(C OC, 2^20)
# floats widening 16-bit weights, whichever is larger; README "Memory")
planned_is_measured() {
  local r
  if r=$(/usr/bin/python3 - "$2" "${3:-0}" 2>&1 <<'P'
import json, sys
m = [json.loads(l)["memory"] for l in open(sys.argv[1]) if l.startswith('{"memory"')][0]
scratch = int(sys.argv[2])
want = dict(m["planned_bytes"])
want["staging"] += scratch
bad = ["%s %d measured, %d planned%s" % (t, v, m["planned_bytes"][t],
       " + %d scratch" % scratch if t == "staging" and scratch else "")
       for t, v in m["peak_bytes"].items() if v != want[t]]
# the total measured is the peak of the sum, never above the sum of peaks
if m["total_peak_bytes"] > m["planned_total_bytes"] + scratch:
    bad.append("total %d measured, above the %d planned" % (m["total_peak_bytes"],
                                                           m["planned_total_bytes"]))
print("; ".join(bad) if bad else "%d bytes planned" % m["planned_total_bytes"])
sys.exit(1 if bad else 0)
P
  ); then ok "$1: planned equals measured, every tag to the byte ($r${3:+; $3 bytes of device scratch beside it})"
  else bad "$1: planned differs from measured: $r"; fi
}

# ---- after a fault: the post-conditions every fault case states ----------
# ckpt_sums DIR: one "sha256  ./path" line per file under DIR, sorted; taken
# before a fault and compared after it by after_fault
ckpt_sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0r sha256sum); }
# after_fault NAME JOBS CKPT_DIR STEP_DIR SUMS [LOG...]: what a fault must
# not leave behind, checked one line each:
#  - no sanitizer report in the LOG files (in $out when none are given);
#  - no /dev/shm/dtrain-<job>* of any job in JOBS (space separated);
#  - no *.tmp* anywhere under CKPT_DIR (the run's checkpoint folder);
#  - STEP_DIR, the checkpoint saved before the fault, passes
#    `$bin ckpt inspect --verify` and its files match SUMS (ckpt_sums of
#    it taken before the fault) byte for byte.
# Empty JOBS, CKPT_DIR or STEP_DIR skip that check.
after_fault() {
  local name=$1 jobs=$2 ckpt=$3 step=$4 sums=$5 text j left v
  shift 5
  if [ $# -gt 0 ]; then text=$(cat "$@"); else text=$out; fi
  if grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: (Address|Leak|Undefined)' <<<"$text"
  then bad "$name: a sanitizer report" "$text"; else ok "$name: no sanitizer report"; fi
  if [ -n "$jobs" ]; then
    left=""
    for j in $jobs; do left+=$(find /dev/shm -maxdepth 1 -name "dtrain-$j*" 2>/dev/null); done
    [ -z "$left" ] && ok "$name: nothing left in /dev/shm" || bad "$name: left in /dev/shm" "$left"
  fi
  if [ -n "$ckpt" ]; then
    left=$(find "$ckpt" -name '*.tmp*' 2>/dev/null)
    [ -z "$left" ] && ok "$name: no temporary file in $ckpt" || bad "$name: temporary files left" "$left"
  fi
  if [ -n "$step" ]; then
    set +e; v=$("$bin" ckpt inspect "$step" --verify 2>&1); local e=$?; set -e
    [ "$e" = 0 ] && ok "$name: $step verifies" || bad "$name: $step fails --verify (exit $e)" "$v"
    if [ -n "$sums" ] && [ "$(ckpt_sums "$step")" = "$sums" ]; then
      ok "$name: $step unchanged byte for byte"
    else bad "$name: $step changed" "$(diff <(printf '%s\n' "$sums") <(ckpt_sums "$step"))"; fi
  fi
}
# expect_only_entry SO SYMBOL: the plugin SO exports SYMBOL, its entry,
# and nothing else (the SDK builds plugins with hidden visibility)
expect_only_entry() {
  local syms
  syms=$(nm -D --defined-only "$1" | awk '{print $3}' | grep -v '^_' || true)
  if [ "$syms" = "$2" ]; then ok "only the entry symbol is exported"; else bad "exported: $syms"; fi
}
# install_alone BUILD PREFIX: `cmake --install BUILD --prefix PREFIX`, then
# move the build tree's plugin folder (BUILD/plugins-out) aside until this
# script exits, so the installed copy is tried as it runs on a machine
# without the build tree: only what PREFIX holds.  (ctest runs the tests
# that call this RUN_SERIAL; a rebuild also restores the folder.)
install_alone() {
  local build prefix=$2
  build=$(realpath "$1")
  # a run killed before its trap left the folder aside: put it back first
  if [ ! -e "$build/plugins-out" ] && [ -d "$build/plugins-out.aside" ]; then
    mv "$build/plugins-out.aside" "$build/plugins-out"
  fi
  rm -rf "$build/plugins-out.aside"
  expect_exit 0 "cmake --install" cmake --install "$build" --prefix "$prefix"
  mv "$build/plugins-out" "$build/plugins-out.aside"
  trap "rm -rf '$build/plugins-out'; mv '$build/plugins-out.aside' '$build/plugins-out'" EXIT
  if [ -e "$build/plugins-out" ]; then bad "the build tree's plugins are still there"
  else ok "the build tree's plugins are moved aside"; fi
}

# toml_from FIXTURE FILE [LINE ...]: FILE, the config of
# fixtures/FIXTURE.toml (beside this file) changed by the LINEs, in TOML's
# words: '[table]' picks a table (added at the end when the fixture has
# none), 'key = value' sets a key of it (in the fixture's line's place, or
# at the end of the table), '-key' removes one.  A table left without keys
# is left out, and so are the fixture's comments.
toml_fixtures="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fixtures"
toml_from() {
  local src="$toml_fixtures/$1.toml" out=$2; shift 2
  printf '%s\n' "$@" | awk '
    function key(l, k) { k = l; sub(/[ \t]*=.*/, "", k); return k }
    function put(l) { if (hdr != "") { print hdr; hdr = "" } print l }
    function rest(t, i, n, a) {   # the keys set for table t the fixture lacks
      n = split(order[t], a, SUBSEP)
      for (i = 2; i <= n; i++) if (!((t, a[i]) in done)) put(line[t, a[i]])
    }
    FILENAME == "-" {
      if (/^\[/) { t = $0; if (!(t in seen)) { seen[t] = 1; tabs[++nt] = t } }
      else if (/^-/) drop[t, substr($0, 2)] = 1
      else if (/=/) { k = key($0); if (!((t, k) in line)) order[t] = order[t] SUBSEP k; line[t, k] = $0 }
      next
    }
    /^#/ || /^[ \t]*$/ { next }
    /^\[/ { if (cur != "") rest(cur); cur = $0; hdr = $0; infix[cur] = 1; next }
    {
      k = key($0)
      if ((cur, k) in drop) next
      if ((cur, k) in line) { put(line[cur, k]); done[cur, k] = 1 } else put($0)
    }
    END {
      if (cur != "") rest(cur)
      for (i = 1; i <= nt; i++) if (!(tabs[i] in infix)) { hdr = tabs[i]; rest(tabs[i]) }
    }' - "$src" > "$out"
}

# tiny_run_setup BIN [LINE ...]: in the current folder, text.txt, its byte
# tokens train.bin, and tiny.toml: a 1-layer GPT-2 trained 2 steps on one
# rank with one cpu thread, LINEs appended (e.g. '[launch]' 'timeout = 20.0').
tiny_run_setup() {
  local bin=$1; shift
  printf 'the text this run trains on, repeated. %.0s' $(seq 400) > text.txt
  expect_exit 0 "data prepare" "$bin" data prepare text.txt train.bin
  toml_from gpt2_1layer tiny.toml '[run]' 'log_every = 1' '[train]' 'grad_accum = 1'
  local line
  for line in "$@"; do printf '%s\n' "$line" >> tiny.toml; done
}

# ---- processes of a running job (the launch and offload tests) ------------
# wait_for FILE FIXED-STRING SECONDS: until FILE contains the string
wait_for() {
  local i=0
  while ! grep -qF -- "$2" "$1" 2>/dev/null; do
    i=$((i + 1)); [ "$i" -gt $(($3 * 20)) ] && return 1; sleep 0.05
  done
}
# wait_gone PID SECONDS: until the process has ended
wait_gone() {
  local i=0
  while kill -0 "$1" 2>/dev/null; do
    i=$((i + 1)); [ "$i" -gt $(($2 * 20)) ] && return 1; sleep 0.05
  done
}
# rank_pid LAUNCHER_PID RANK: the child running that rank
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    if grep -qx "DTRAIN_RANK=$2" <<<"$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null)"; then
      echo "$p"; return 0
    fi
  done
  return 1
}

# ---- layouts against one rank (test_pipeline.sh, test_tensor.sh) --------
# layout_toml N_HEAD: eq.toml, a 2-layer GPT-2 (n_embd 32, N_HEAD heads)
# trained 6 AdamW steps on train.bin, a global batch of 8 in micro-batches
# of 2, validated at steps 3 and 6, 1 cpu thread per rank
layout_toml() {
  toml_from gpt2_2layer eq.toml '[model]' "n_head = $1" \
    '[data]' 'val = "train.bin"' '[train]' 'micro_batch = 2' 'eval_every = 3'
}
# cmp_runs.py, beside this file: compares two runs' curves or parameters
cmp="$(dirname "${BASH_SOURCE[0]}")/cmp_runs.py"
# same_as_n1 RUN WHAT: run RUN's curve (RUN.jsonl) within 1e-6 in every
# loss and 1e-5 in every grad norm of the 1-rank run's (n1.jsonl), and its
# exported parameters (out/RUN/ckpt) within 2e-5 of n1.st
same_as_n1() {
  local v
  if v=$(/usr/bin/python3 "$cmp" curves n1.jsonl "$1.jsonl" 1e-6 1e-5); then ok "$2: $v"
  else bad "$2: losses differ from 1 rank's" "$v"; fi
  "$bin" export "out/$1/ckpt" "$1.st" --layout dtrain >/dev/null
  if v=$(/usr/bin/python3 "$cmp" params n1.st "$1.st" 2e-5); then ok "$2: $v"
  else bad "$2: parameters differ from 1 rank's" "$v"; fi
}

# killed_pair JOB STEP:MICRO LOG ARGS...: ranks 0 and 1 of a 2-rank
# `dtrain run ARGS` started as an external launcher starts them (job JOB),
# rank 1 killing itself as micro-batch MICRO of step STEP starts its
# backward (DTRAIN_FAULT_KILL_AT_BACKWARD, a test hook); their output in
# LOG0.log and LOG1.log, their exit statuses in e0 and e1
killed_pair() {
  local job=$1 at=$2 log=$3 r p0 p1; shift 3
  for r in 0 1; do
    if [ $r = 1 ]; then export DTRAIN_FAULT_KILL_AT_BACKWARD=$at; fi
    DTRAIN_RANK=$r DTRAIN_WORLD_SIZE=2 DTRAIN_LOCAL_RANK=$r DTRAIN_LOCAL_SIZE=2 \
      DTRAIN_JOB_ID=$job "$bin" run "$@" >"$log$r.log" 2>&1 &
    if [ $r = 0 ]; then p0=$!; else p1=$!; fi
    unset DTRAIN_FAULT_KILL_AT_BACKWARD
  done
  set +e; { wait "$p1"; } 2>/dev/null; e1=$?; wait "$p0"; e0=$?; set -e
}
