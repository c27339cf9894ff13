#!/usr/bin/env bash
# The benchmark programs' command lines (bench/): --help prints the usage
# on stdout and exits 0 without measuring anything; a missing value, a bad
# number or an unknown option is a usage error (exit 2) that names it; a
# tiny bench_adamw run prints its table.
set -euo pipefail
benchdir=$1
. "$(dirname "$0")/lib.sh"
adamw=$benchdir/bench_adamw

for b in bench_adamw bench_kernels bench_offload_io; do
  set +e; so=$("$benchdir/$b" --help 2>/dev/null); rc=$?; set -e
  [ "$rc" = 0 ] && ok "$b --help exits 0" || bad "$b --help exited $rc" "$so"
  case $so in
    "usage: $b "* | "usage: $benchdir/$b "*) ok "$b --help prints its usage on stdout" ;;
    *) bad "$b --help: no usage on stdout" "$so" ;;
  esac
  # (a benchmark's output is a markdown table: lines that start with '|')
  if grep -q '^|' <<<"$so"; then bad "$b --help ran the benchmark" "$so"
  else ok "$b --help measures nothing"; fi
done
expect_exit 0 "bench_adamw -h" "$adamw" -h
expect_out "describes the table" "The host AdamW (dt_adamw_f32) against a copy of the same bytes"

expect_exit 2 "bench_adamw --params without a value" "$adamw" --params
expect_out "names the option" "bench_adamw: error: --params needs a value"
expect_exit 2 "bench_adamw --params 0" "$adamw" --params 0
expect_out "names the value" "bench_adamw: error: --params '0': not a valid value"
expect_exit 2 "bench_adamw --params 1e6" "$adamw" --params 1e6
expect_out "a whole number only" "bench_adamw: error: --params '1e6': not a valid value"
expect_exit 2 "bench_adamw --threads 1,,2" "$adamw" --threads 1,,2
expect_out "names the list" "bench_adamw: error: --threads '1,,2': not a valid value"
expect_exit 2 "bench_adamw --threads 65" "$adamw" --threads 65
expect_exit 2 "bench_adamw --reps x" "$adamw" --reps x
expect_exit 2 "bench_adamw with an unknown option" "$adamw" --bogus
expect_out "names it" "bench_adamw: error: unknown argument '--bogus'"
expect_out "and the usage" "usage: bench_adamw [--params N] [--threads 1,2] [--reps 5]"

expect_exit 0 "a tiny bench_adamw run" "$adamw" --params 4096 --threads 1,2 --reps 1
expect_out "its table" "| threads | AdamW GB/s | AdamW M params/s | copy GB/s | AdamW / copy |"
if grep -qE '^\| 2 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+ % \|$' <<<"$out"; then ok "a row for 2 threads"
else bad "no row for 2 threads" "$out"; fi
expect_out "and what it measured" "4096 parameters (0 MB of traffic per pass), best of 1"
finish
