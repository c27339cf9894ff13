#!/usr/bin/env bash
# A run's output folders are checked before step 1, not at the first
# checkpoint: an out_dir that cannot be created or written, or one too long
# for checkpoint paths, stops the run at once naming the key and the path;
# a first checkpoint that fails does not claim an earlier one is intact.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
expect_exit 0 "data prepare" "$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin
toml_from gpt2_1layer tiny.toml '[run]' 'name = "t"' '[train]' '-lr' '-warmup_steps'

# a file where the folder should be: no step is taken
echo x > afile
expect_exit 1 "out_dir that is a file" "$bin" run tiny.toml --set run.out_dir=afile
expect_out "out_dir error names key and path" 'dtrain run: error: run.out_dir = "afile": cannot create the run'"'"'s folder afile/t'
case $out in *"step 1"*|*loss*) bad "out_dir checked before step 1" "$out";; *) ok "out_dir checked before step 1";; esac

long=$(printf 'd%.0s' $(seq 1 2100))
expect_exit 2 "out_dir too long for checkpoint paths" "$bin" run tiny.toml --set "run.out_dir=$long"
expect_out "too-long out_dir names the limit" "dtrain run: error: run.out_dir = \"$long\": the checkpoint folder <run.out_dir>/<run.name>/ckpt would be 2107 bytes, longer than checkpoint paths may be (2047 bytes)"

expect_exit 0 "a writable out_dir trains" "$bin" run tiny.toml
[ -d out/t ] && ok "out_dir/name created" || bad "out_dir/name created" "$(ls -la out)"
grep -q dtrain-write-test <<<"$(ls -A out/t)" && bad "write test file removed" "$(ls -A out/t)" || ok "write test file removed"

if has_test_hooks "$bin"; then
  set +e
  out=$(DTRAIN_FAULT_WRITE_AFTER_BYTES=1000 "$bin" run tiny.toml --set run.name=first \
    --set checkpoint.every=1 2>&1); e=$?
  set -e
  [ $e = 1 ] && ok "first save fails: exit 1" || bad "first save fails: exit $e" "$out"
  expect_out "first save: no earlier checkpoint" "saving checkpoint of step 1 (there is no earlier checkpoint to fall back on)"
  case $out in *"is intact"*) bad "first save claims nothing intact" "$out";; *) ok "first save claims nothing intact";; esac
else
  skip "a failing first checkpoint" "test hooks (DTRAIN_FAULT_*) compiled out of $bin"
fi
finish
