#!/usr/bin/env bash
# Files dtrain did not make, as a hostile neighbour on the machine (or bit
# rot) leaves them: links planted where dtrain writes or prunes, FIFOs
# where it reads, a token file truncated during training, a checkpoint
# whose manifest was edited or whose tensor table is inconsistent, one
# without its COMPLETE marker.  Each must end in a clear error naming the
# file (exit 1), or a warning, never a hang, a crash or someone else's
# file overwritten or deleted.  After each failure, after_fault (lib.sh)
# checks: no sanitizer report, no temporary file under out/, and the
# step-2 checkpoint of run "a" verifies and is unchanged byte for byte.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"

tiny_run_setup "$bin"
printf "another user's file\n" > victim; chmod 600 victim; cp victim victim.orig
intact() { cmp -s victim victim.orig && ok "$1: the linked-to file is untouched" ||
  bad "$1: the linked-to file changed" "$(ls -l victim)"; }

# -- 1. a link at the temp name an atomic write used to pick ("OUT.tmp.<pid>";
# exec keeps the shell's pid, so the link sits at exactly that name)
expect_exit 0 "data prepare with a link at OUT.tmp.<pid>" \
  bash -c 'ln -s victim "$1.tmp.$$" && exec "$0" data prepare text.txt "$1"' "$bin" prepared.bin
intact "data prepare"
want_mode=$(printf '%03o' $((0666 & ~$(umask))))
[ -f prepared.bin ] && [ ! -L prepared.bin ] && [ "$(stat -c %a prepared.bin)" = "$want_mode" ] &&
  ok "data prepare: the output is a regular file of mode $want_mode (0666 less the umask)" ||
  bad "data prepare: output" "$(ls -l prepared.bin)"
expect_exit 0 "a run saving step 2" "$bin" run tiny.toml --set run.name=a
ck=out/a/ckpt/step-00000002 ck_sums=$(ckpt_sums out/a/ckpt/step-00000002)
clean_after() { after_fault "$1" "" out "$ck" "$ck_sums"; }
expect_exit 0 "export with a link at OUT.tmp.<pid>" \
  bash -c 'ln -s victim "$1.tmp.$$" && exec "$0" export out/a/ckpt "$1"' "$bin" a.st
intact "export"

# -- 2. another run's checkpoint linked into our checkpoint folder
expect_exit 0 "another run saves step 1" "$bin" run tiny.toml --set run.name=other \
  --set train.steps=1
mkdir -p out/mine/ckpt
ln -s "$PWD/out/other/ckpt/step-00000001" out/mine/ckpt/step-00000000
expect_exit 0 "a run pruning to keep = 1 beside a linked step" "$bin" run tiny.toml \
  --set run.name=mine --set train.steps=3 --set checkpoint.keep=1
expect_out "pruning warns about the link" \
  "ckpt: warning: checkpoint folder 'out/mine/ckpt': ignoring 'step-00000000': a symbolic link, not a directory"
[ -f out/other/ckpt/step-00000001/COMPLETE ] && [ -L out/mine/ckpt/step-00000000 ] &&
  [ -d out/mine/ckpt/step-00000003 ] && [ ! -e out/mine/ckpt/step-00000002 ] &&
  ok "prune removed our step 2, left the link and the other run alone" ||
  bad "prune: folders" "$(ls -l out/mine/ckpt out/other/ckpt/step-00000001)"
expect_exit 0 "the other run's checkpoint still verifies" "$bin" ckpt inspect \
  out/other/ckpt/step-00000001 --verify
ln -s "$PWD/out/other/ckpt/step-00000001" out/mine/ckpt/step-00000099
expect_exit 0 "resume latest beside a newer linked step" "$bin" run tiny.toml \
  --set run.name=mine --set train.steps=4 --set checkpoint.resume=latest
expect_out "resume takes our newest, not the link" "resumed from out/mine/ckpt/step-00000003"
expect_out "resume warns about the link" "ignoring 'step-00000099': a symbolic link, not a directory"

# -- 3. the manifest: edited after the save; inconsistent tensor tables
cp -r "$ck" edited
python3 - edited <<'P'
import json, sys
p = sys.argv[1] + "/manifest.json"
m = json.load(open(p))
m["step"] = 7
open(p, "w").write(json.dumps(m, indent=1))
P
expect_exit 1 "export of a checkpoint whose manifest was edited" "$bin" export edited e.st
expect_out "the edit is caught as a checksum mismatch of manifest.json" \
  "checkpoint 'edited': manifest.json: checksum mismatch (COMPLETE records"
expect_out "... and says what it means" "it was edited or damaged after the save"
[ ! -e e.st ] && ok "nothing exported" || bad "an export was written" ""
clean_after "manifest edited"
# table: make tensor 1 start where tensor 0 does; empty it; then reseal
# COMPLETE the way a save does, so only the table is wrong
table_case() {
  rm -rf "$1"; cp -r "$ck" "$1"
  python3 - "$1" "$2" <<'P'
import json, sys, zlib
d, how = sys.argv[1], sys.argv[2]
m = json.load(open(d + "/manifest.json"))
ts = m["model"]["tensors"]
if how == "overlap":
    ts[1]["offset"] = ts[0]["offset"]
else:
    m["model"]["tensors"] = []
raw = json.dumps(m, indent=1).encode()
open(d + "/manifest.json", "wb").write(raw)
open(d + "/COMPLETE", "w").write("dtrain checkpoint complete\nmanifest.json %d bytes crc32 %08x\n"
                                 % (len(raw), zlib.crc32(raw)))
P
}
table_case overlap overlap
expect_exit 1 "export with overlapping tensors" "$bin" export overlap o.st
expect_out "overlap named with both tensors" \
  "checkpoint 'overlap': manifest.json: entry embedding/params: tensors overlap at elements [0, 256) (wpe.weight and wte.weight)"
expect_exit 1 "inspect --verify with overlapping tensors" "$bin" ckpt inspect overlap --verify
expect_out "inspect names the overlap" "tensors overlap at elements [0, 256) (wpe.weight and wte.weight)"
clean_after "overlapping tensors"
table_case empty empty
expect_exit 1 "export with an empty tensor list" "$bin" export empty x.st
expect_out "empty table: the uncovered unit named" \
  "checkpoint 'empty': manifest.json: entry embedding/params: elements [0, 4352) are in no tensor"
[ ! -e o.st ] && [ ! -e x.st ] && ok "nothing exported from a bad table" || bad "an export was written" ""
clean_after "empty tensor list"

# -- 4. no COMPLETE marker: tools read it, warned; training never loads it
cp -r "$ck" partial; rm partial/COMPLETE
partial_warning="ckpt: warning: checkpoint 'partial' has no COMPLETE marker: it may be partial"
expect_exit 0 "inspect a checkpoint without COMPLETE" "$bin" ckpt inspect partial --verify
expect_out "inspect warns it may be partial" "$partial_warning"
expect_exit 0 "export a checkpoint without COMPLETE" "$bin" export partial p.st
expect_out "export warns it may be partial" "$partial_warning"
expect_exit 0 "consolidate a checkpoint without COMPLETE" "$bin" ckpt consolidate partial cons
expect_out "consolidate warns it may be partial" "$partial_warning"
expect_exit 1 "resume from a checkpoint without COMPLETE" "$bin" run tiny.toml --set run.name=p \
  --set checkpoint.resume=partial
expect_out "resume refuses it" "checkpoint 'partial': incomplete (no COMPLETE marker)"
clean_after "resume without COMPLETE"

# -- 5. FIFOs where files are read: an error at once, not a hang (bounded)
mkfifo fifo.bin fifo.txt
expect_exit 1 "a FIFO as data.train" timeout 20 "$bin" run tiny.toml --set data.train=fifo.bin
expect_out "FIFO data file named" "data file 'fifo.bin': not a regular file (a FIFO)"
clean_after "a FIFO as data.train"
expect_exit 1 "a FIFO as the text to prepare" timeout 20 "$bin" data prepare fifo.txt f.bin
expect_out "FIFO text file named" "text file 'fifo.txt': not a regular file (a FIFO)"
clean_after "a FIFO as the text"
cp -r "$ck" fifockpt; rm fifockpt/manifest.json; mkfifo fifockpt/manifest.json
expect_exit 1 "a FIFO as a checkpoint's manifest" timeout 20 "$bin" ckpt inspect fifockpt
expect_out "FIFO manifest named" "checkpoint 'fifockpt': manifest.json: not a regular file (a FIFO)"
clean_after "a FIFO as a manifest"

# -- 6. the token file truncated while training reads it: a clean error
cp train.bin shrink.bin
timeout 120 "$bin" run tiny.toml --set run.name=shrink --set data.train=shrink.bin \
  --set train.steps=100000 --set checkpoint.every=0 >shrink.log 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "step     3/" shrink.log && break; sleep 0.05; done
truncate -s 1100 shrink.bin
set +e; wait $pid; e=$?; set -e
out=$(cat shrink.log)
[ $e = 1 ] && ok "truncated during training: exit 1" || bad "truncated during training: exit $e" "$out"
expect_out "truncated during training: the file named" "data file 'shrink.bin': changed while in use: it now has 1100 bytes"
clean_after "truncated during training"

# -- a validation file shorter than one sequence: an error as for training
head -c 10 text.txt > short.txt
expect_exit 0 "data prepare of a 10-byte text" "$bin" data prepare short.txt short.bin
expect_exit 1 "a run with a too-short val file" "$bin" run tiny.toml --set run.name=sv \
  --set data.val=short.bin --set train.eval_every=1
expect_out "too-short val file named" \
  "data file 'short.bin': 10 tokens hold no full sequence of seq_len 16 (need at least 17 tokens)"
clean_after "a too-short val file"

# -- a link planted at the metrics file: refused, the linked-to file intact
ln -s victim planted-metrics.jsonl
expect_exit 1 "a run whose metrics file is a planted link" "$bin" run tiny.toml \
  --set run.name=pm --metrics planted-metrics.jsonl
expect_out "metrics link named" \
  "opening metrics file 'planted-metrics.jsonl': not a regular file (a symbolic link): only a regular file is replaced"
intact "metrics"
clean_after "a planted metrics link"

# -- a FIFO as the metrics file: an error, never a hang (more odd files in
# test_output_paths.sh)
mkfifo fifo.jsonl
expect_exit 1 "a FIFO as the metrics file" timeout 20 "$bin" run tiny.toml --set run.name=fm \
  --metrics fifo.jsonl
expect_out "FIFO metrics file named" \
  "opening metrics file 'fifo.jsonl': not a regular file (a FIFO): only a regular file is replaced"
[ -p fifo.jsonl ] && ok "the FIFO is left a FIFO" || bad "the FIFO was replaced" "$(ls -l fifo.jsonl)"
clean_after "a FIFO as the metrics file"

# -- a FIFO as the config file: an error, never a hang
mkfifo fifo.toml
expect_exit 2 "a FIFO as the config file" timeout 20 "$bin" check fifo.toml
expect_out "FIFO config named" \
  "cannot open config file 'fifo.toml': not a regular file (a FIFO)"
clean_after "a FIFO as the config"
finish
