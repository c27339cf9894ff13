#!/bin/bash
# The offload_nvme tier under the training loop:
#  - bit for bit against no offload (zero stage 3 with parameters and
#    optimizer on the tier, ddp, a buffered-I/O run; zero stage 3 on 1 and
#    on 2 ranks (bf16) with units of several pieces), its files gone after
#    a clean run;
#  - the planner's tier I/O per step equals the bytes the step moved
#    through the tier (rank 0's count, zero stage 3 on 1 and 2 ranks);
#  - a file system that refuses O_DIRECT (test hook builds): direct =
#    "auto" falls back with one log line (local rank 0's) and the same
#    losses, direct = "on" stops naming the path (exit 2);
#  - checkpoints: saved with the tier by 2 ranks and resumed without it by
#    1, and the other way round, end bit for bit alike;
#  - a rank killed mid-run: the launcher's cleanup removes the job's files;
#  - Ctrl-C or SIGTERM of a one-process run (no launcher): the core's
#    signal cleanup removes the tier's files and the missing folders of its
#    path that it made (two deep, 0700), and the run dies of the signal;
#  - a tier path in a folder others may write: refused (exit 2), nothing
#    made there;
#  - a file deleted, truncated or changed (random bytes) under a running
#    job: the run stops (exit 1, no hang) with an error naming the
#    operation, the file and the rank (a change: the block and both
#    checksums), and the last checkpoint still verifies;
#  - a full disk (a small tmpfs as the path, where this user may mount
#    one): refused before step 1 naming the path and the bytes.
# usage: test_offload_nvme.sh DTRAIN WORKDIR
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
tag="on$$"
printf 'the text this run trains on, repeated. %.0s' $(seq 400) > text.txt
"$bin" data prepare text.txt train.bin >/dev/null
nv=$work/nv
toml_from gpt2_1layer t.toml \
  '[run]' 'comm = "shm"' \
  '[train]' 'steps = 3' 'grad_accum = 2' \
  '[launch]' 'timeout = 20.0'
# the tier's settings, given with it ([offload_nvme] is allowed only then)
tier=(--set parallel.offload=offload_nvme --set offload_nvme.path="$nv"
      --set offload_nvme.block_size=8192)

run() {
  local name=$1; shift
  if "$bin" run t.toml --set run.name="$name" --metrics "$name.jsonl" "$@" >"$name.log" 2>&1 &&
     "$bin" export "out/$name/ckpt" "$name.st" --layout dtrain >/dev/null 2>&1; then return 0; fi
  bad "$name failed" "$(tail -n 5 "$name.log")"; return 1
}
no_files() {
  local left; left=$(find "$nv" -name 'dtrain-*' 2>/dev/null || true)
  [ -z "$left" ] && ok "$1: no offload file left" || bad "$1: offload files left" "$left"
}

# ---- bit for bit --------------------------------------------------------------
# `big`: units of more than one 1 Mi-element piece (two layers of 1.2M), so
# the update's pipeline, the asynchronous parameter and gradient stores
# (two pieces in flight, waited before the bytes are read again) and the
# gradient read back for accumulation run over several pieces
big="--set model.n_layer=2 --set model.n_head=4 --set model.n_embd=320"
for v in "zero3 2 --set parallel.data=zero --set zero.stage=3 --set zero.offload_what=optimizer_and_params" \
         "ddp 2 --set parallel.data=ddp --set ddp.offload_what=optimizer" \
         "zero2-buffered 1 --set parallel.data=zero --set zero.stage=2" \
         "zero3-pieces 1 --set parallel.data=zero --set zero.stage=3 --set zero.offload_what=optimizer_and_params $big" \
         "zero3-pieces-bf16 2 --set parallel.data=zero --set zero.stage=3 --set zero.offload_what=optimizer_and_params $big --set model.dtype=bf16"; do
  set -- $v
  name=$1 n=$2; shift 2
  extra=(); [ "$name" = zero2-buffered ] && extra=(--set offload_nvme.direct=off)
  run "$name" --set launch.nproc="$n" "$@" || continue
  run "$name-nvme" --set launch.nproc="$n" "$@" "${tier[@]}" "${extra[@]}" || continue
  if cmp -s <(losses "$name.jsonl") <(losses "$name-nvme.jsonl") && cmp -s "$name.st" "$name-nvme.st"
  then ok "$name on offload_nvme: losses and final parameters bit for bit"
  else bad "$name on offload_nvme differs" "$(paste <(losses "$name.jsonl") <(losses "$name-nvme.jsonl"))"; fi
  no_files "$name"
done
# the report counts the files' bytes as the tier's (zero-3, 2 ranks: each
# rank's master, moments and compute shard, 4 KiB-rounded files)
if grep -qE '^\[rank 0\] offload tier \(rank 0, MiB held\): offload_nvme 0\.0[0-9]' zero3-nvme.log &&
   held=$(grep -o '"held_bytes": [0-9]*' zero3-nvme.jsonl | cut -d' ' -f2) && [ "$held" -gt 0 ] &&
   [ $((held % 4096)) = 0 ]; then ok "the report shows the bytes the tier's files hold ($held)"
else bad "no offload_nvme line in the report" "$(grep -i offload zero3-nvme.log zero3-nvme.jsonl)"; fi

# ---- the planner's tier I/O per step is what the tier moves: rank 0's bytes
# loaded and stored in a step after the first (whose update also writes the
# initial parameters), as the strategy's debug line counts them, against
# `dtrain plan`'s "tier I/O" of the same configuration (zero-3,
# optimizer_and_params), both in MiB to two decimals -----------------------------
plan_io() { "$bin" plan t.toml "$@" > plan.txt 2>&1 || true
            awk '/^zero-3 /{z = 1} z && /^  optimizer_and_params /{print $(NF - 1); exit}' plan.txt; }
for v in "2" "1 $big"; do
  set -- $v
  n=$1; shift
  z3io=(--set launch.nproc="$n" --set parallel.data=zero --set zero.stage=3
        --set zero.offload_what=optimizer_and_params "$@" "${tier[@]}")
  name=io-$n
  DTRAIN_LOG=debug run "$name" "${z3io[@]}" || continue
  moved=$(grep -E '^(\[rank 0\] )?strategy/zero: step 2: offloaded optimizer' "$name.log" |
          sed -n 's/.*, moved \([0-9]*\)$/\1/p' || true)
  counted=$([ -n "$moved" ] && awk -v b="$moved" 'BEGIN {printf "%.2f", b / 1048576}')
  planned=$(plan_io "${z3io[@]}")
  if [ -n "$counted" ] && [ "$counted" = "$planned" ]
  then ok "zero-3 on $n rank(s): the plan's tier I/O per step is what the tier moved ($planned MiB)"
  else bad "zero-3 on $n rank(s): planned tier I/O '$planned' MiB, the tier moved '$counted' MiB" \
           "$(grep 'offloaded optimizer' "$name.log")"; fi
done

# ---- a file system that refuses O_DIRECT (tmpfs before Linux 6.6), by the test
# hook DTRAIN_FAULT_NO_ODIRECT (every O_DIRECT open fails with EINVAL) -----------
if has_test_hooks "$bin"; then
  z3=(--set launch.nproc=2 --set parallel.data=zero --set zero.stage=3
      --set zero.offload_what=optimizer_and_params)
  grep -q "refuses O_DIRECT" zero3-nvme.log && bad "the O_DIRECT run fell back" "$(cat zero3-nvme.log)"
  if DTRAIN_FAULT_NO_ODIRECT=1 run nodirect "${z3[@]}" "${tier[@]}"; then
    line="[rank 0] offload/offload_nvme: '$nv' refuses O_DIRECT (tmpfs?): buffered I/O"
    if [ "$(grep -c "refuses O_DIRECT" nodirect.log)" = 1 ] && grep -qxF "$line" nodirect.log
    then ok "direct = auto: one fallback line for the job's machine (local rank 0 says it)"
    else bad "no single fallback line '$line'" "$(cat nodirect.log)"; fi
    if cmp -s <(losses zero3-nvme.jsonl) <(losses nodirect.jsonl) && cmp -s zero3-nvme.st nodirect.st
    then ok "buffered fallback: losses and final parameters bit for bit as with O_DIRECT"
    else bad "the buffered fallback differs" "$(paste <(losses zero3-nvme.jsonl) <(losses nodirect.jsonl))"; fi
  fi
  no_files "nodirect"
  out=$(DTRAIN_FAULT_NO_ODIRECT=1 "$bin" run t.toml --set run.name=directon "${z3[@]}" "${tier[@]}" \
        --set offload_nvme.direct=on 2>&1) && code=0 || code=$?
  [ "$code" = 2 ] && ok "direct = on refused (exit 2)" || bad "direct = on: exit $code, expected 2" "$out"
  expect_out "... naming the path" "direct = \"on\", but '$nv' refuses O_DIRECT (tmpfs?); use direct = \"auto\" or another path"
  if grep -q '^step' <<<"$out"; then bad "direct = on: a step ran" "$out"; else ok "direct = on: no step ran"; fi
  no_files "direct = on"
else
  skip "O_DIRECT refused" "test hooks (DTRAIN_FAULT_*) compiled out of $bin"
fi

# ---- checkpoints: saved with the tier by 2 ranks, resumed without it by 1, and
# the other way round; both resumes end with the same parameters, bit for bit
ck=(--set parallel.data=zero --set zero.stage=2 --set train.steps=4 --set train.global_batch=4
    --set train.grad_accum=0)
run saved-nv "${ck[@]}" --set launch.nproc=2 --set train.stop_at=2 "${tier[@]}" || true
run saved-plain "${ck[@]}" --set launch.nproc=2 --set train.stop_at=2 || true
mkdir -p out/res-plain out/res-nv
cp -r out/saved-nv/ckpt out/res-plain/ && cp -r out/saved-plain/ckpt out/res-nv/
if run res-plain "${ck[@]}" --set launch.nproc=1 --set run.comm=self --set checkpoint.resume=latest &&
   run res-nv "${ck[@]}" --set launch.nproc=1 --set run.comm=self --set checkpoint.resume=latest \
     "${tier[@]}"; then
  grep -qF "(step 2)" res-nv.log && ok "the offloaded run resumed at step 2" ||
    bad "no resume at step 2" "$(cat res-nv.log)"
  if [ "$(losses res-nv.jsonl | wc -l)" = 2 ] && cmp -s res-plain.st res-nv.st &&
     cmp -s <(losses res-plain.jsonl) <(losses res-nv.jsonl); then
    ok "saved with offload_nvme (2 ranks) resumed without (1 rank) = saved without, resumed with"
  else bad "the two resumes differ" "$(paste <(losses res-plain.jsonl) <(losses res-nv.jsonl))"; fi
fi
no_files "checkpoints"

# ---- a rank killed: the launcher removes the job's files ----------------------------
long=(--set launch.nproc=2 --set parallel.data=zero --set zero.stage=2 "${tier[@]}"
      --set train.steps=1000000)
job="$tag-kill"
DTRAIN_JOB_ID=$job "$bin" run t.toml "${long[@]}" --set run.name=kill > kill.log 2>&1 & lpid=$!
if wait_for kill.log "step     2/" 30 && victim=$(rank_pid "$lpid" 1); then
  [ -n "$(find "$nv" -name "dtrain-$job-r1-*")" ] && ok "rank 1's files exist while it runs" ||
    bad "no files of rank 1 in $nv" "$(ls -la "$nv")"
  kill -KILL "$victim"
  wait_gone "$lpid" 30 && ok "the job ends after rank 1 is killed" || bad "the job did not end"
  wait "$lpid" 2>/dev/null || true
  left=$(find "$nv" -name "dtrain-$job-*")
  [ -z "$left" ] && ok "the killed rank's files were removed by the launcher" || bad "files left" "$left"
else
  kill -KILL "$lpid" 2>/dev/null || true
  bad "the run to be killed did not reach step 2" "$(cat kill.log)"
fi

# ---- Ctrl-C / SIGTERM of a one-process run: no launcher, so the core's signal
# cleanup removes the tier's files (SIGINT: in a folder that exists), and the
# folders the tier made (SIGTERM: its path two folders deep, missing: each made
# 0700) ---------------------------------------------------------------------------
one=(--set launch.nproc=1 --set run.comm=self --set parallel.data=zero --set zero.stage=2
     --set parallel.offload=offload_nvme --set offload_nvme.block_size=8192
     --set train.steps=1000000 --set checkpoint.every=0)
mkdir -p sig-INT
for sig in INT TERM; do
  top=$work/sig-$sig deep=$work/sig-$sig/tier made=0
  [ "$sig" = TERM ] && deep=$work/sig-$sig/a/tier made=1
  # (job control: a script's background job would start with SIGINT ignored)
  set -m
  "$bin" run t.toml "${one[@]}" --set offload_nvme.path="$deep" --set run.name="sig$sig" \
    > "sig$sig.log" 2>&1 &
  pid=$!
  set +m
  if wait_for "sig$sig.log" "step     2/" 30; then
    n=$(find "$deep" -name 'dtrain-*' | wc -l)
    [ "$n" -gt 0 ] && ok "SIG$sig: $n tier files while it runs" || bad "SIG$sig: no tier file in $deep"
    if [ "$made" = 1 ]; then
      modes=$(stat -c %a "$top" "$top/a" "$deep" | sort -u)
      [ "$modes" = 700 ] && ok "SIG$sig: in the 3 missing folders of its path, made 0700" ||
        bad "SIG$sig: the folders made are not 0700 ($modes)" "$(ls -laR "$top")"
    fi
    kill -"$sig" "$pid"
    code=0; wait "$pid" || code=$?
    want=$((128 + $(kill -l "$sig")))
    [ "$code" = "$want" ] && ok "SIG$sig: the run dies of it (exit $want)" ||
      bad "SIG$sig: exit $code, expected $want" "$(tail -n 5 "sig$sig.log")"
    if [ "$made" = 1 ]; then
      [ ! -e "$top" ] && ok "SIG$sig: no tier file left, nor the folders the tier made" ||
        bad "SIG$sig: left behind" "$(find "$top")"
    else
      left=$(find "$top" -mindepth 1)
      [ -z "$left" ] && ok "SIG$sig: no tier file left (the tier folder, made by it, too)" ||
        bad "SIG$sig: left behind" "$left"
    fi
  else
    kill -KILL "$pid" 2>/dev/null || true
    bad "SIG$sig: the one-process run did not reach step 2" "$(cat "sig$sig.log")"
  fi
done

# ---- a folder others may write, on the tier's way: refused before any step
mkdir -p open; chmod 0777 open
expect_exit 2 "a tier path in a folder others may write is refused" "$bin" run t.toml \
  --set run.name=open "${one[@]}" --set train.steps=2 --set offload_nvme.path="$work/open/tier"
expect_out "... naming the folder and why" "rank 0: path '$work/open/tier': the folder '$(realpath open)' is writable by others (mode 0777) and not sticky: another user could remove or replace the tier's files"
if grep -q '^step' <<<"$out" || [ -e open/tier ]; then bad "a step ran, or open/tier was made" "$out"
else ok "... no step ran, nothing made in it"; fi

# ---- a file deleted, truncated or changed under the running job --------------
fault() {
  local what=$1 cmd=$2 want=$3 job="$tag-$1" code
  DTRAIN_JOB_ID=$job "$bin" run t.toml "${long[@]}" --set run.name="$what" \
    --set checkpoint.every=20 > "$what.log" 2>&1 & local lpid=$!
  if wait_for "$what.log" "step    40/" 30; then
    local f; f=$(find "$nv" -name "dtrain-$job-r1-1.bin")
    $cmd "$f"
    if wait_gone "$lpid" 30; then ok "$what: the run stops"; else
      bad "$what: the run hangs" "$(tail -n 5 "$what.log")"; kill -KILL "$lpid" 2>/dev/null || true; fi
    set +e; wait "$lpid"; code=$?; set -e
    [ "$code" = 1 ] && ok "$what: exit 1" || bad "$what: exit $code, expected 1" "$(tail -n 5 "$what.log")"
    out=$(cat "$what.log")
    expect_out "$what: the error names the rank, the file and what failed" "rank 1: "
    expect_out "$what: ... the file" "$f"
    expect_out "$what: ... why" "$want"
    if grep -qE "(store|load) of [0-9]+ bytes at offset" <<<"$out"; then ok "$what: ... the operation"
    else bad "$what: no operation named" "$out"; fi
    after_fault "$what" "$job" "out/$what/ckpt" "" ""
    expect_exit 0 "$what: the last checkpoint verifies" "$bin" ckpt inspect "out/$what/ckpt" --verify
    local left; left=$(find "$nv" -name "dtrain-$job-*")
    [ -z "$left" ] && ok "$what: no file of the job left" || bad "$what: files left" "$left"
  else
    kill -KILL "$lpid" 2>/dev/null || true
    bad "$what: the run did not reach step 40" "$(cat "$what.log")"
  fi
}
# A truncation is seen at the next fstat of the file (before and after each
# request) or by a short read.  A buffer rewritten whole every step (the
# master parameters of this tiny model are one piece: loaded, updated,
# stored) can be truncated between its load and its store and grown back
# whole by the store, with nothing lost and nothing to see; so the
# neighbour here truncates it again and again for a second (-c: never
# re-creating it once the job has removed it), as a hostile one would.
truncate_for_a_while() {
  local i
  for i in $(seq 50); do truncate -c -s 0 "$1" 2>/dev/null || break; sleep 0.02; done
}
fault deleted "rm -f" "the file was deleted under the running job"
fault truncated truncate_for_a_while "the file was truncated"
# Random bytes over the file's first block, again and again for a second (a
# store of the block between two loads may write over one), never creating
# it again: the next load of the block finds it changed.
corrupt_for_a_while() {
  local i
  for i in $(seq 50); do
    head -c 4096 /dev/urandom |
      dd of="$1" bs=4096 count=1 conv=notrunc,nocreat status=none 2>/dev/null || break
    sleep 0.02
  done
}
fault corrupted corrupt_for_a_while "checksum mismatch in bytes [0, 4096) of the file: CRC-32C 0x"
if [ -f corrupted.log ]; then
  f=$(realpath -m "$nv/dtrain-$tag-corrupted-r1-1.bin")
  # (a load of a piece over the block, or a store of part of it, reading it first)
  line="^\[rank 1\] dtrain run: error: strategy/zero: offload/offload_nvme: rank 1: (load|store) of [0-9]+ bytes at offset [0-9]+ of '$f': checksum mismatch in bytes \[0, 4096\) of the file: CRC-32C 0x[0-9a-f]{8} as written, 0x[0-9a-f]{8} as read \(changed outside the tier\)$"
  if grep -qE "$line" corrupted.log; then ok "corrupted: the whole error line, both checksums"
  else bad "corrupted: no line matching $line" "$(grep -i error corrupted.log)"; fi
fi

# ---- a full disk: a 256 KiB tmpfs ----------------------------------------------
mkdir -p small
if mount -t tmpfs -o size=256k "$tag" small 2>/dev/null; then
  expect_exit 1 "a tier on a full disk is refused" "$bin" run t.toml --set run.name=full \
    --set model.n_embd=64 --set model.n_layer=2 --set parallel.data=zero --set zero.stage=1 \
    --set parallel.offload=offload_nvme --set offload_nvme.path="$work/small" --set run.comm=self
  expect_out "the error names the path" "$work/small/dtrain-"
  expect_out "... the bytes needed and free" "bytes for params, but its file system has 262144 bytes free"
  if grep -q '^step' <<<"$out"; then bad "a step ran" "$out"; else ok "no step ran"; fi
  umount small
else
  skip "full disk" "cannot mount a small tmpfs here"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
