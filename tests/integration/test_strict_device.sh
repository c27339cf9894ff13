#!/usr/bin/env bash
# `dtrain run --strict-device` (issue 23): every communicator call held to
# what nccl on a GPU accepts (core/interpose/interpose_strict.c), on shm
# with the cpu device, a tiny GPT-2 (2 layers, n_embd 32, 4 heads, 16
# tokens) trained 2 steps:
#  - every layout trains under the checks and every rank says what it
#    checked, nothing refused: ddp, zero stages 1-3, fsdp FULL_SHARD and
#    HYBRID_SHARD (4 ranks), pipeline gpipe and 1f1b, tensor parallel, and
#    tp2 x pp2 x dp2 (8 ranks, zero-1 on each stage's data group); one
#    rank on `self` too;
#  - the pipeline's 1f1b goes through sendrecv (the comm profile, stacked
#    on the checks, counts it);
#  - interleaved 1f1b (virtual_stages = 2) moves activations and their
#    gradients on two groups, which one sendrecv cannot join: the checks
#    stop it (exit 1) at the first exchange nccl would deadlock on,
#    naming both calls, and every rank stops.
# The rules one by one, each broken on purpose: unit.test_interpose_strict.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
"$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin >/dev/null
toml_from gpt2_2layer s.toml \
  '[model]' 'n_head = 4' 'context = 16' \
  '[train]' 'steps = 2' 'micro_batch = 2' 'seq_len = 16' 'warmup_steps = 1' \
  '[checkpoint]' 'every = 0'

# strict N NAME ARGS...: N ranks train under the checks; every rank's
# summary line says it checked device buffers and refused nothing
strict() {
  local n=$1 name=$2; shift 2
  local t0; t0=$(date +%s%N)
  expect_exit 0 "$name under --strict-device" "$bin" run s.toml --strict-device \
    --set launch.nproc="$n" --set run.name="$name" "$@"
  local lines ok_lines
  lines=$(grep -F "strict device (rank " <<<"$out" || true)
  ok_lines=$(grep -cE "strict device \(rank [0-9]+, [a-z]+ over cpu\): [0-9]+ comm calls checked: [1-9][0-9]* buffers in device memory, [0-9]+ control messages in host memory \(at most [0-9]+ bytes\); 0 refused" <<<"$lines" || true)
  if [ "$ok_lines" = "$n" ]; then
    ok "$name: all $n ranks checked device buffers, none refused ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
  else bad "$name: expected $n summary lines with buffers checked and 0 refused" "$out"; fi
}

strict 2 ddp
strict 2 zero1 --set parallel.data=zero --set zero.stage=1
strict 2 zero2 --set parallel.data=zero --set zero.stage=2
strict 2 zero3 --set parallel.data=zero --set zero.stage=3
strict 2 fsdp --set parallel.data=fsdp --set fsdp.sharding_strategy=FULL_SHARD
strict 4 hybrid --set parallel.data=fsdp --set fsdp.sharding_strategy=HYBRID_SHARD \
  --set fsdp.hybrid_group_size=2
strict 2 gpipe --set parallel.pipeline=2 --set pipeline.schedule=gpipe
strict 2 1f1b --set parallel.pipeline=2 --set pipeline.schedule=1f1b --profile comm
# the profile's rows: "op calls bytes time waits errors"
r=$(awk '$1 == "[rank" && $2 == "0]" && $3 == "sendrecv" {print $4, $8}' <<<"$out")
if [ -n "$r" ] && [ "${r% *}" -gt 0 ] && [ "${r#* }" = 0 ]; then
  ok "1f1b: stage 0 exchanges through sendrecv (${r% *} calls, none failed)"
else bad "1f1b: no sendrecv row in rank 0's comm profile" "$out"; fi
strict 2 tp2 --set parallel.tensor=2
strict 8 3d --set parallel.tensor=2 --set parallel.pipeline=2 --set pipeline.schedule=1f1b \
  --set parallel.data=zero --set zero.stage=1
expect_exit 0 "one rank on self under --strict-device" "$bin" run s.toml --strict-device \
  --set run.comm=self --set run.name=self1
expect_out "self: nothing to check at one rank" \
  "strict device (rank 0, self over cpu): 0 comm calls checked: 0 buffers in device memory, 0 control messages in host memory (at most 0 bytes); 0 refused"

# interleaved 1f1b: reported, and every rank stops
expect_exit 1 "interleaved 1f1b under --strict-device" "$bin" run s.toml --strict-device \
  --set launch.nproc=2 --set run.name=v2 --set parallel.pipeline=2 \
  --set pipeline.virtual_stages=2 --set pipeline.schedule=1f1b
# each rank makes the same mistake; which one is caught first depends on
# timing (the other may then fail on its peer's departure), so either
# rank's exact message counts
r0="[rank 0] dtrain run: error: schedule/1f1b: strict device: recv #2 (f32, 4096 bytes from rank 1, tag 11): send #4 (f32, 4096 bytes to rank 1, tag 1) on the same group is still in flight (not waited for) and was not started with this recv: on NCCL two ranks that each send before they receive block in their sends, a deadlock once a message exceeds NCCL's buffers; start the two together with sendrecv"
r1="[rank 1] dtrain run: error: schedule/1f1b: strict device: recv #4 (f32, 4096 bytes from rank 0, tag 1): send #2 (f32, 4096 bytes to rank 0, tag 11) on the same group is still in flight (not waited for) and was not started with this recv: on NCCL two ranks that each send before they receive block in their sends, a deadlock once a message exceeds NCCL's buffers; start the two together with sendrecv"
if grep -qxF -- "$r0" <<<"$out" || grep -qxF -- "$r1" <<<"$out"; then
  ok "the exchange nccl would deadlock on, both calls named"
else bad "the exchange nccl would deadlock on: neither rank's message" "$out"; fi
n_err=$(grep -c "^\[rank [01]\] dtrain run: error: " <<<"$out" || true)
if [ "$n_err" = 2 ]; then ok "both ranks stopped with an error"
else bad "expected an error line from each rank" "$out"; fi
if grep -qE "^dtrain: rank [01] failed \(exit 1\); its last error line: dtrain run: error: schedule/1f1b: strict device: recv #" <<<"$out"
then ok "the launcher names the failed rank and its message"
else bad "the launcher's last line" "$out"; fi

expect_exit 2 "--strict-device takes no value" "$bin" run s.toml --strict-device=yes
finish
