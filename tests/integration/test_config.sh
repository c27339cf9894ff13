#!/usr/bin/env bash
# Config that explains itself, as a user meets it: one file configuring
# every strategy with --set picking one (the tables of unselected plugins
# checked, then set aside), `check` doing run's checks that need no plugin
# instance (batch arithmetic, derived and preset values), config errors of a
# multi-rank run reported once before any rank starts, `config doc`, the
# DeepSpeed/PyTorch spellings pointed at dtrain's keys, and plugin errors
# naming the key that selected the plugin.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"

# expect_line NAME TEXT: the last command's output has TEXT as a whole line
expect_line() {
  if grep -qxF -- "$2" <<<"$out"; then ok "$1"; else bad "$1: no line '$2'" "$out"; fi
}
# expect_lines NAME N TEXT: exactly N lines of the last command's output are TEXT
expect_lines() {
  local n
  n=$(grep -cxF -- "$3" <<<"$out" || true)
  if [ "$n" = "$2" ]; then ok "$1"; else bad "$1: $n lines '$3', expected $2" "$out"; fi
}
# line_of FILE PATTERN: the number of the first line of FILE matching PATTERN
line_of() { grep -n -m1 -- "$2" "$1" | cut -d: -f1; }

# ---- one file, every strategy: --set parallel.data picks one -------------
tiny_run_setup "$bin" '[zero]' 'stage = 2' '[fsdp]' 'sharding_strategy = "SHARD_GRAD_OP"' \
  '[ddp]' 'bucket_cap_mb = 1.0'
cp tiny.toml all.toml
for s in zero fsdp ddp; do
  expect_exit 0 "run with parallel.data=$s from a file with [zero], [fsdp], [ddp]" \
    "$bin" run all.toml --set parallel.data=$s --set run.name=$s
  expect_out "the run used $s" "; strategy $s"
done
expect_exit 0 "check with parallel.data=fsdp" "$bin" check all.toml --set parallel.data=fsdp
expect_line "[fsdp] is claimed: its file value" \
  "sharding_strategy = \"SHARD_GRAD_OP\"  # file all.toml:$(line_of all.toml '^sharding_strategy')"
expect_line "check notes [zero] as not used" \
  "# note: [zero] is not used: the config does not select plugin 'zero' (its keys were checked)"
expect_line "check notes [ddp] as not used" \
  "# note: [ddp] is not used: the config does not select plugin 'ddp' (its keys were checked)"
expect_lines "the unused [zero] is not printed as resolved" 0 "[zero]"
expect_exit 0 "--set into an unselected plugin's table" "$bin" check all.toml --set zero.stage=3
# a typo inside a table no one selects is still caught, located in the file
sed 's/^bucket_cap_mb = 1.0/bucket_cap_m = 1.0/' tiny.toml > typo.toml
expect_exit 2 "typo in the unselected [ddp]" "$bin" run typo.toml --set parallel.data=zero
expect_line "typo named with file, line and key" \
  "dtrain run: error: typo.toml:$(line_of typo.toml '^bucket_cap_m '):1: unknown key 'bucket_cap_m' in [ddp]; did you mean 'bucket_cap_mb'?"
sed 's/^stage = 2/stage = 7/' tiny.toml > range.toml
expect_exit 2 "out-of-range value in the unselected [zero]" "$bin" check range.toml
expect_line "range error located" \
  "dtrain check: error: range.toml:$(line_of range.toml '^stage'):9: [zero] stage = 7 is out of range (allowed 1 .. 3)"
printf '[run]\ncomm = "self"\n[zeroo]\nstage = 2\n' > notplugin.toml
expect_exit 2 "a table named after no plugin" "$bin" check notplugin.toml
expect_out "unknown table, with the closest and why" \
  "dtrain check: error: notplugin.toml:3:1: unknown table [zeroo]"
expect_out "unknown table hint" "(a plugin's table is named after a plugin on the search path)"
finish
