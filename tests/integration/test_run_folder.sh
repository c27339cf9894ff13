#!/usr/bin/env bash
# One run per checkpoint folder, and a run's outputs checked: a fresh run
# into a folder holding checkpoints is refused (a later resume = "latest"
# would continue another run's lineage) unless checkpoint.overwrite says
# to remove them; a second run on a folder in use fails at once naming the
# folder and the holder's pid; a metrics file that cannot be written stops
# the run (exit 1) naming the file, the previous checkpoint intact.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"

tiny_run_setup "$bin"
# crc OF A CHECKPOINT: its COMPLETE marker (the manifest's checksum)
crc() { cat "$1/COMPLETE"; }

# -- 1. a fresh run into a folder holding another run's checkpoints
expect_exit 0 "a first run saves step 2" "$bin" run tiny.toml --set run.name=a
first=$(crc out/a/ckpt/step-00000002)
expect_exit 2 "a fresh run into the same folder is refused" "$bin" run tiny.toml --set run.name=a
expect_out "the refusal names the folder, the newest step and the three ways on" \
  "dtrain run: error: tiny.toml: [checkpoint] resume = \"\" starts a fresh run, but the checkpoint folder 'out/a/ckpt' already holds checkpoints (the newest: step 2): set checkpoint.resume = \"latest\" to continue them, another run.name (or checkpoint.dir) to keep them apart, or checkpoint.overwrite = true to remove them"
[ "$(crc out/a/ckpt/step-00000002)" = "$first" ] && ok "the refused run left the checkpoint as it was" ||
  bad "the checkpoint changed" "$(ls -l out/a/ckpt)"
# launched ranks: every rank says why (rank 0's message), so the launcher's
# last line, naming whichever rank ended first, gives the reason
expect_exit 2 "2 launched ranks: refused too" "$bin" run tiny.toml --set run.name=a \
  --set launch.nproc=2 --set run.comm=shm
expect_out "the launcher's last line gives the reason" "its last error line: dtrain run: error: tiny.toml: [checkpoint] resume = \"\" starts a fresh run, but the checkpoint folder 'out/a/ckpt' already holds checkpoints (the newest: step 2)"
expect_exit 0 "resume = latest continues them" "$bin" run tiny.toml --set run.name=a \
  --set checkpoint.resume=latest --set train.steps=3
expect_out "resumed from step 2" "resumed from out/a/ckpt/step-00000002 (step 2)"
expect_exit 0 "another run.name keeps them apart" "$bin" run tiny.toml --set run.name=b
[ -d out/b/ckpt/step-00000002 ] && [ -d out/a/ckpt/step-00000003 ] &&
  ok "each run has its own folder" || bad "folders" "$(ls -R out)"

# overwrite: our old checkpoints go, a link planted among them is skipped
# (never followed: the other run's checkpoint it points to stays)
ln -s "$PWD/out/b/ckpt/step-00000002" out/a/ckpt/step-00000099
expect_exit 0 "checkpoint.overwrite = true starts fresh over them" "$bin" run tiny.toml \
  --set run.name=a --set train.steps=1 --set checkpoint.overwrite=true
expect_out "overwrite says what it removes" \
  "ckpt: warning: checkpoint.overwrite = true: removing the checkpoints in 'out/a/ckpt' (the newest: step 3)"
[ -d out/a/ckpt/step-00000001 ] && [ ! -e out/a/ckpt/step-00000002 ] &&
  [ ! -e out/a/ckpt/step-00000003 ] && ok "only the new run's checkpoint is left" ||
  bad "overwrite: folder" "$(ls -l out/a/ckpt)"
[ -L out/a/ckpt/step-00000099 ] && [ -f out/b/ckpt/step-00000002/COMPLETE ] &&
  ok "the link was not followed: the linked-to checkpoint is intact" ||
  bad "overwrite followed the link" "$(ls -l out/a/ckpt out/b/ckpt/step-00000002)"
expect_exit 0 "resume = latest after overwrite" "$bin" run tiny.toml --set run.name=a \
  --set checkpoint.resume=latest --set train.steps=2
expect_out "the new lineage is continued, not the old one" \
  "resumed from out/a/ckpt/step-00000001 (step 1)"
expect_exit 0 "check lists the new key" "$bin" check tiny.toml --set checkpoint.overwrite=true

# -- 2. two runs on one folder: the second fails at once
"$bin" run tiny.toml --set run.name=busy --set train.steps=100000 \
  --set checkpoint.every=0 >busy.log 2>&1 &
holder=$!
for _ in $(seq 600); do grep -q "step     3/" busy.log && break; sleep 0.05; done
[ "$(stat -c %a out/busy/ckpt/LOCK)" = 600 ] && [ "$(cat out/busy/ckpt/LOCK)" = "$holder" ] &&
  ok "the lock file is 0600 and holds the holder's pid" ||
  bad "lock file" "$(ls -l out/busy/ckpt; cat out/busy/ckpt/LOCK)"
start=$(date +%s)
expect_exit 1 "a second run on the folder in use" timeout 20 "$bin" run tiny.toml \
  --set run.name=busy --set checkpoint.resume=latest
expect_out "it names the folder and the holder's pid" \
  "dtrain run: error: checkpoint folder 'out/busy/ckpt' is in use by another run (process $holder holds 'out/busy/ckpt/LOCK'): two runs never write one checkpoint folder; wait for it to end, or give this run another run.name or checkpoint.dir"
[ $(($(date +%s) - start)) -le 5 ] && ok "... at once" || bad "the second run took $(($(date +%s) - start)) s" ""
kill -TERM "$holder"; wait "$holder" 2>/dev/null || true
expect_exit 0 "after the holder ended, the folder is free" "$bin" run tiny.toml \
  --set run.name=busy --set checkpoint.resume=latest --set train.steps=1
# a link planted at the lock's name is not opened
mkdir -p out/lk/ckpt; printf 'x\n' > victim; ln -s "$PWD/victim" out/lk/ckpt/LOCK
expect_exit 1 "a link at the lock file" "$bin" run tiny.toml --set run.name=lk
expect_out "the link is refused, named" \
  "checkpoint folder 'out/lk/ckpt': writing 'out/lk/ckpt/LOCK': not a regular file (a symbolic link): only a regular file is replaced"
[ "$(cat victim)" = x ] && ok "the linked-to file is untouched" || bad "victim changed" ""

# -- 3. a metrics file that cannot be written: a regular file that cannot
# grow (RLIMIT_FSIZE at its size, SIGXFSZ ignored: writes fail with EFBIG
# as a full disk fails them with ENOSPC)
expect_exit 0 "a run saves step 2 (name m)" "$bin" run tiny.toml --set run.name=m
before=$(crc out/m/ckpt/step-00000002)
# (a device such as /dev/full is no metrics file: refused before step 1)
expect_exit 1 "a run whose metrics file is /dev/full" "$bin" run tiny.toml --set run.name=m \
  --set checkpoint.resume=latest --set train.steps=4 --metrics /dev/full
expect_out "/dev/full refused, named" \
  "dtrain run: error: opening metrics file '/dev/full': not a regular file (a character device): only a regular file is replaced"
head -c 1024 /dev/zero > full.jsonl
expect_exit 1 "a run whose metrics file cannot grow" bash -c 'trap "" XFSZ; ulimit -f 1
  exec "$0" run tiny.toml --set run.name=m --set checkpoint.resume=latest --set train.steps=4 \
    --metrics full.jsonl' "$bin"
expect_out "the error names the file and the cause" \
  "dtrain run: error: writing metrics file 'full.jsonl': File too large"
n=$(printf '%s\n' "$out" | grep -c "writing metrics file" || true)
[ "$n" = 1 ] && ok "reported once" || bad "reported $n times" "$out"
[ "$(crc out/m/ckpt/step-00000002)" = "$before" ] && [ ! -e out/m/ckpt/step-00000003 ] &&
  [ ! -e out/m/ckpt/step-00000004 ] && ok "the previous checkpoint is intact, none newer" ||
  bad "checkpoints after the metrics failure" "$(ls -l out/m/ckpt)"
expect_exit 0 "the previous checkpoint verifies" "$bin" ckpt inspect out/m/ckpt/step-00000002 --verify
finish
