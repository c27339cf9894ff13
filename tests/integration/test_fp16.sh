#!/usr/bin/env bash
# model.dtype = "fp16" end to end: losses within a stated tolerance of
# fp32's, the loss scale in the log line and metrics, loss scaling exact
# (a dynamic scale gives the losses of scale 1 bit for bit), an overflow
# that skips steps and lowers the scale, one at min_loss_scale that stops
# the run naming the gradient, rank and step (also under pp2 x dp2, with
# the stage); reduce_dtype bf16/fp16 for
# zero-2, zero-3 and fsdp against fp32; and bad [fp16] / reduce_dtype
# values refused naming the key; memory as planned to the byte, the cpu
# device's kernel scratch (fp16's widened weights) the only staging.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
expect_exit 0 "data prepare" "$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin
toml_from gpt2_2layer tiny.toml \
  '[run]' 'comm = "self"' 'log_every = 1' \
  '[train]' 'steps = 8' 'micro_batch = 4' 'grad_accum = 2' '-global_batch' \
  '[launch]' '-timeout'
# max_diff A.jsonl B.jsonl: the largest |loss_A - loss_B| over the steps
max_diff() {
  paste <(losses "$1") <(losses "$2") |
    awk 'BEGIN{m=0} {d=$1-$2; if(d<0)d=-d; if(d>m)m=d} END{printf "%.3g\n", m}'
}
# within NAME A B TOL: every step's loss of B within TOL of A's
within() {
  local d; d=$(max_diff "$2" "$3")
  [ "$(losses "$2" | wc -l)" = "$(losses "$3" | wc -l)" ] &&
    awk -v d="$d" -v t="$4" 'BEGIN{exit !(d <= t)}' &&
    ok "$1: largest loss difference $d <= $4" || bad "$1: largest loss difference $d > $4" ""
}

# fp16 against fp32, one rank.  fp16 compute parameters round at 2^-12
# relative (8x finer than bf16); gradients, activations and the master
# copy stay f32.  Measured: 5.3e-5 over the 8 steps; tolerance 1e-3.
expect_exit 0 "fp32 run" "$bin" run tiny.toml --set run.name=fp32 --metrics fp32.jsonl
expect_exit 0 "fp16 run" "$bin" run tiny.toml --set run.name=fp16 --set model.dtype=fp16 \
  --metrics fp16.jsonl
within "fp16 losses vs fp32" fp32.jsonl fp16.jsonl 1e-3
# memory as planned, every tag, but for the cpu device's own kernel
# scratch (measured as staging, in no plan: README "Memory"): one buffer
# per thread, the larger of attention backward's T floats and the widest
# 16-bit weight widened for a matmul (at most 2^20 floats): fp32 1 x 32 x
# 4 = 128 bytes; fp16 the LM head's V x C = 256 x 32 floats, 32768 bytes
planned_is_measured "fp32, 1 rank" fp32.jsonl 128
planned_is_measured "fp16, 1 rank" fp16.jsonl 32768
expect_out "the log line shows the scale and the skipped steps" "| scale 65536 | skipped 0"
if /usr/bin/python3 - fp16.jsonl <<'P'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert len(rows) == 8, rows
assert all(r["loss_scale"] == 65536 and r["skipped"] is False and r["skipped_steps"] == 0
           for r in rows), rows
P
then ok "metrics: loss_scale, skipped, skipped_steps per step"; else bad "metrics: loss scale fields"; fi
# Scaling by a power of two and unscaling is exact in f32: a static scale
# of 1 gives the same losses bit for bit.
expect_exit 0 "fp16 at static loss_scale 1" "$bin" run tiny.toml --set run.name=fp16s \
  --set model.dtype=fp16 --set fp16.loss_scale=1 --metrics fp16s.jsonl
if diff <(losses fp16.jsonl) <(losses fp16s.jsonl) >/dev/null; then
  ok "dynamic scale 2^16 and static scale 1 give bit-identical losses"
else bad "loss scaling changed the losses" "$(diff <(losses fp16.jsonl) <(losses fp16s.jsonl))"; fi

# A forced overflow: two ranks reducing gradients in fp16 (largest finite
# 65504) at a scale of 2^24 overflow until the scale comes down; with
# hysteresis 1 each overflow halves it, the step is skipped (no update),
# and the run goes on.
two=(--set run.comm=shm --set launch.nproc=2 --set train.micro_batch=2
     --set model.dtype=fp16 --set ddp.reduce_dtype=fp16)
expect_exit 0 "overflowing fp16 run recovers" "$bin" run tiny.toml --set run.name=ovf "${two[@]}" \
  --set fp16.initial_scale_power=24 --set fp16.hysteresis=1 --metrics ovf.jsonl
expect_out "log line: the overflow and the lowered scale" \
  "| scale 1.67772e+07 (overflow, step skipped) | skipped 1"
if grep -qE '^(\[rank 0\] )?step +1/8 \| loss [0-9.]+ \| lr [0-9.e+-]+ \| norm n/a \| .*\(overflow, step skipped\)' <<<"$out"
then ok "log line: a skipped step's norm is n/a"
else bad "log line: a skipped step's norm is not 'n/a'" "$out"; fi
case $out in *nan*) bad "a log line says nan" "$(grep nan <<<"$out")";; *) ok "no nan in the log";; esac
expect_out "warning: the scale halves" \
  "train: step 1: gradient overflowed at loss scale 1.67772e+07: step skipped, scale now 8.38861e+06"
if /usr/bin/python3 - ovf.jsonl <<'P'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert len(rows) == 8, rows
skips = [r for r in rows if r["skipped"]]
assert rows[0]["skipped"] and rows[0]["loss_scale"] == 2**24 and rows[0]["grad_norm"] is None, rows[0]
# every skip halves the scale, a clean step keeps it, skipped_steps counts
for a, b in zip(rows, rows[1:]):
    assert b["loss_scale"] == (a["loss_scale"] / 2 if a["skipped"] else a["loss_scale"]), (a, b)
assert [r["skipped_steps"] for r in rows] == [sum(x["skipped"] for x in rows[:i + 1])
                                             for i in range(8)], rows
assert 1 <= len(skips) < 8 and not rows[-1]["skipped"], rows
assert all(isinstance(r["grad_norm"], float) for r in rows if not r["skipped"]), rows
P
then ok "metrics: skips halve the scale until a step is clean"; else bad "metrics after overflow" ""; fi
# hysteresis 2 (the default): the first overflow is skipped at the same scale
expect_exit 0 "hysteresis 2" "$bin" run tiny.toml --set run.name=hyst "${two[@]}" \
  --set fp16.initial_scale_power=24 --set train.steps=2 --metrics hyst.jsonl
if /usr/bin/python3 - hyst.jsonl <<'P'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert [(r["loss_scale"], r["skipped"]) for r in rows] == [(2**24, True), (2**24, True)], rows
P
then ok "hysteresis 2: two skips at 2^24 before the first halving"; else bad "hysteresis" ""; fi

# The scaler's state is in the checkpoint: a run stopped after step 4 and
# resumed reproduces the uninterrupted run's losses, scales and skips (with
# a 2-step window the scale also grows back, then overflows again).
grow=("${two[@]}" --set fp16.initial_scale_power=20 --set fp16.hysteresis=1
      --set fp16.loss_scale_window=2)
expect_exit 0 "uninterrupted overflowing run" "$bin" run tiny.toml --set run.name=lsfull \
  "${grow[@]}" --metrics lsfull.jsonl
expect_exit 0 "stopped after step 4" "$bin" run tiny.toml --set run.name=lspart "${grow[@]}" \
  --set train.stop_at=4 --metrics lspart.jsonl
expect_exit 0 "resumed" "$bin" run tiny.toml --set run.name=lspart "${grow[@]}" \
  --set checkpoint.resume=latest --metrics lspart.jsonl
scaler() { grep -o '"loss": [^,]*\|"loss_scale": [^,]*\|"skipped[a-z_]*": [^,}]*' "$1"; }
if diff <(scaler lsfull.jsonl) <(scaler lspart.jsonl) >/dev/null &&
   [ "$(grep -c '"skipped": true' lsfull.jsonl)" -ge 2 ] &&
   grep -q '"loss_scale": 262144, "skipped": false' lsfull.jsonl; then
  ok "resumed: losses, scales and skips identical to the uninterrupted run"
else bad "resumed loss scaler differs" "$(diff <(scaler lsfull.jsonl) <(scaler lspart.jsonl))"; fi

# Unrecoverable: the scale may not go below 2^22, and 2^22 still
# overflows: exit 1 at step 3, naming the rank, the step and the tensor.
expect_exit 1 "overflow at min_loss_scale stops the run" "$bin" run tiny.toml --set run.name=min \
  "${two[@]}" --set fp16.initial_scale_power=24 --set fp16.hysteresis=1 \
  --set fp16.min_loss_scale=4194304
expect_out "names the step, the scale and the key" \
  "the gradient overflowed at loss scale 4.1943e+06, [fp16] min_loss_scale, so it cannot be lowered (2 steps skipped before)"
expect_out "names the rank" "error: step 3, rank "
expect_out "names the tensor the fp16 reduction overflowed on" \
  "first non-finite tensor: none in this rank's backward of its last micro-batch (every parameter gradient is finite before the reduction)"
expect_out "names the largest gradient" "; the largest: gradient of parameter "
expect_out "says it is beyond fp16" "(above 65504, the largest f16: a reduce_dtype = \"fp16\" reduction overflows there)"
# the same under a pipeline (pp2 x dp2): the stages re-run the step's
# micro-batches through the schedule, each searching its own units'
# gradients, and every rank names the model's largest gradient and the
# stage that holds it (a rank's error line; the launcher stops the rest)
expect_exit 1 "pp2 x dp2: overflow at min_loss_scale stops the run" "$bin" run tiny.toml \
  --set run.name=ppmin "${two[@]}" --set launch.nproc=4 --set parallel.pipeline=2 \
  --set fp16.initial_scale_power=24 --set fp16.hysteresis=1 --set fp16.min_loss_scale=4194304
expect_out "pp2 x dp2: names the step, the scale and the key" \
  "the gradient overflowed at loss scale 4.1943e+06, [fp16] min_loss_scale, so it cannot be lowered (2 steps skipped before)"
expect_out "pp2 x dp2: the stages searched the whole step's backward" \
  "first non-finite tensor: none in the backward of this step's micro-batches on any pipeline stage (every parameter gradient is finite before the reduction): the reduction overflowed (a 16-bit reduce_dtype); the largest: gradient of parameter "
if grep -qE 'the largest: gradient of parameter [^;]* \(unit (embedding|block\.[01]|head)\): element [0-9]+ of [0-9]+ is [0-9.e+]+ \(above 65504, the largest f16: [^;]*\), on pipeline stage [01]; the last checkpoint is intact' <<<"$out"
then ok "pp2 x dp2: the largest gradient and its stage named"
else bad "pp2 x dp2: the largest gradient or its stage not named" "$out"; fi
# a static scale never changes: its first overflow is the end
expect_exit 1 "overflow at a static scale stops the run" "$bin" run tiny.toml --set run.name=st \
  "${two[@]}" --set fp16.loss_scale=1e9
expect_out "static: at step 1" "error: step 1, rank "
expect_out "static: the static scale" "at loss scale 1e+09, the static [fp16] loss_scale, so it cannot be lowered (0 steps skipped before)"

# reduce_dtype for the sharding strategies, two ranks, against fp32.
# Gradients round twice at u (bf16 2^-9, fp16 2^-12) on the way through
# the reduction.  Measured over the 8 steps: bf16 8.6e-5, fp16 3.2e-5 for
# each; tolerances 1e-3 and 2.5e-4.  A run that matched fp32 bit for bit
# would mean the key did nothing: that fails too.
for s in zero2 zero3 fsdp; do
  case $s in
    zero2) sel=(--set parallel.data=zero --set zero.stage=2); key=zero.reduce_dtype ;;
    zero3) sel=(--set parallel.data=zero --set zero.stage=3); key=zero.reduce_dtype ;;
    fsdp) sel=(--set parallel.data=fsdp); key=fsdp.reduce_dtype ;;
  esac
  for r in fp32 bf16 fp16; do
    expect_exit 0 "$s reduce_dtype $r" "$bin" run tiny.toml --set run.name=$s$r \
      --set run.comm=shm --set launch.nproc=2 --set train.micro_batch=2 "${sel[@]}" \
      --set $key=$r --metrics $s$r.jsonl
  done
  within "$s reduce_dtype bf16 vs fp32" $s"fp32.jsonl" $s"bf16.jsonl" 1e-3
  within "$s reduce_dtype fp16 vs fp32" $s"fp32.jsonl" $s"fp16.jsonl" 2.5e-4
  d=$(max_diff $s"fp32.jsonl" $s"fp16.jsonl")
  awk -v d="$d" 'BEGIN{exit !(d > 0)}' && ok "$s: fp16 reduction changed the numbers ($d)" ||
    bad "$s: fp16 reduction gave fp32's losses bit for bit" ""
done

# Bad values, before any step, naming the key (exit 2).
# [fp16] beside another dtype is checked, kept and not used (one file can
# flip model.dtype from the command line), and check says so.
expect_exit 0 "[fp16] for an fp32 model: checked, not used" "$bin" check tiny.toml \
  --set fp16.hysteresis=3
expect_out "check notes it, naming the key and the dtype" \
  "# note: [fp16] is not used: fp16.hysteresis is set but only model.dtype = \"fp16\" scales the loss, and this model is \"fp32\" (its keys were checked)"
expect_exit 2 "[fp16] for an fp32 model: a bad value is still refused" "$bin" check tiny.toml \
  --set fp16.initial_scale_power=4 --set fp16.min_loss_scale=32
expect_out "names both keys" \
  "[fp16] min_loss_scale = 32: must be > 0 and at most the initial scale 2^initial_scale_power = 16"
expect_exit 2 "min_loss_scale above the initial scale" "$bin" run tiny.toml --set run.name=bad \
  --set model.dtype=fp16 --set fp16.initial_scale_power=4 --set fp16.min_loss_scale=32
expect_out "names both keys" \
  "[fp16] min_loss_scale = 32: must be > 0 and at most the initial scale 2^initial_scale_power = 16"
expect_exit 2 "dtrain check finds it too" "$bin" check tiny.toml \
  --set model.dtype=fp16 --set fp16.initial_scale_power=4 --set fp16.min_loss_scale=32
expect_out "check: the same words" \
  "tiny.toml: [fp16] min_loss_scale = 32: must be > 0 and at most the initial scale 2^initial_scale_power = 16"
expect_exit 2 "initial_scale_power out of range" "$bin" run tiny.toml --set run.name=bad \
  --set model.dtype=fp16 --set fp16.initial_scale_power=200
expect_out "range named" "initial_scale_power = 200 is out of range"
expect_exit 2 "zero reduce_dtype fp8" "$bin" run tiny.toml --set run.name=bad \
  --set parallel.data=zero --set zero.stage=2 --set zero.reduce_dtype=fp8
expect_out "zero: key and choices" \
  "--set zero.reduce_dtype=fp8: [zero] reduce_dtype = \"fp8\" is not one of \"fp32\", \"bf16\", \"fp16\""
expect_exit 2 "fsdp reduce_dtype float16" "$bin" run tiny.toml --set run.name=bad \
  --set parallel.data=fsdp --set fsdp.reduce_dtype=float16
expect_out "fsdp: key and choices" \
  "--set fsdp.reduce_dtype=float16: [fsdp] reduce_dtype = \"float16\" is not one of \"fp32\", \"bf16\", \"fp16\""
finish
