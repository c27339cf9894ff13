#!/bin/bash
# The offload_cpu tier under the training loop ([parallel] offload):
#  - only where the state lives changes: with the optimizer state offloaded
#    (and with it the sharded engine's reduced gradient shard),
#    losses and final parameters equal the run without offload BIT FOR BIT,
#    for zero stages 1-3, fsdp FULL_SHARD / SHARD_GRAD_OP and ddp, on 1, 2
#    and 4 ranks, with and without accumulation, f32 and bf16, SGD (with
#    Nesterov), fsdp HYBRID_SHARD and NO_SHARD, the host optimizer on 2
#    threads;
#  - the same with the parameters offloaded too (zero stage 3, fsdp
#    FULL_SHARD; gathered from the tier per use, with and without prefetch),
#    each run's memory record planned to the byte, every tag (on 1 rank
#    the plan once took the schedule of parameters on the device: no
#    gathered group kept, none loaded ahead);
#  - checkpoints go through the same manifest: saved with offload, resumed
#    without (same ranks: bit for bit), saved without, resumed with offload
#    at another world size (bit for bit against the same resume without);
#  - [cpu] memory_limit below the model state: without offload the run
#    stops before step 1 naming the tag, the bytes and the limit and
#    suggesting offload; with offload it trains, no optimizer bytes on the
#    device;
#  - config errors: params offload outside zero stage 3 / fsdp FULL_SHARD;
#    `dtrain plugins --describe` lists the keys.
# usage: test_offload.sh DTRAIN WORKDIR
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
printf 'the text this run trains on, repeated. %.0s' $(seq 400) > text.txt
"$bin" data prepare text.txt train.bin >/dev/null
toml_from gpt2_1layer t.toml \
  '[run]' 'comm = "shm"' \
  '[train]' 'steps = 3' \
  '[launch]' 'timeout = 30.0'

# run NAME ARGS...: train, export the final parameters to NAME.st
run() {
  local name=$1; shift
  if "$bin" run t.toml --set run.name="$name" --metrics "$name.jsonl" "$@" >"$name.log" 2>&1 &&
     "$bin" export "out/$name/ckpt" "$name.st" --layout dtrain >/dev/null 2>&1; then return 0; fi
  bad "$name failed" "$(tail -n 5 "$name.log")"; return 1
}
# same NAME A B: losses (as printed) and exported parameters identical
same() {
  if [ -s "$2.jsonl" ] && cmp -s <(losses "$2.jsonl") <(losses "$3.jsonl") && cmp -s "$2.st" "$3.st"; then
    ok "$1: losses and final parameters bit for bit"
  else bad "$1: offloaded run differs" "$(paste <(losses "$2.jsonl") <(losses "$3.jsonl"))"; fi
}

# ---- bit for bit ----------------------------------------------------------
for strat in "zero zero.stage=1" "zero zero.stage=2" "zero zero.stage=3" \
             "fsdp fsdp.sharding_strategy=FULL_SHARD" "fsdp fsdp.sharding_strategy=SHARD_GRAD_OP" \
             "ddp ddp.reduce_dtype=fp32"; do
  set -- $strat
  for n in 1 2 4; do
    [ "$1" = ddp ] && [ "$n" = 4 ] && continue
    for acc in 1 2; do
      tag="$1-${2#*=}-n$n-a$acc"
      common=(--set parallel.data="$1" --set "$2" --set launch.nproc="$n" --set train.grad_accum="$acc")
      run "$tag" "${common[@]}" || continue
      run "$tag-off" "${common[@]}" --set parallel.offload=offload_cpu || continue
      same "$1 ${2#*=}, $n rank(s), accumulation $acc" "$tag" "$tag-off"
    done
  done
done
# the reduced gradient shard follows the optimizer into the tier (the
# sharded engine's zero-2/3 and fsdp; zero-1 keeps its full gradients):
# on 2 ranks the device's grads peak drops from the f32 half shard (at
# least 4 x P/2 bytes, P = 7,664 for this model: V C + T C + 12 C^2 + 13 C
# + 2 C, V 256, T 16, C 16) to 0, its comm peak (the per-group buffers
# reduced from) stays what it was, and the tier holds exactly the bytes
# the device dropped on top of zero-1's master and moments.
P=$((256 * 16 + 16 * 16 + 12 * 16 * 16 + 13 * 16 + 2 * 16))
peak() { # RUN TAG: rank 0's measured peak bytes of TAG
  grep '^{"memory"' "$1.jsonl" | head -n 1 | grep -o "\"peak_bytes\": {[^}]*}" |
    grep -oE "\"$2\": [0-9]+" | cut -d' ' -f2
}
for t in zero-2 zero-3 fsdp-FULL_SHARD fsdp-SHARD_GRAD_OP; do
  r=$t-n2-a2 g=$(peak "$t-n2-a2" grads) go=$(peak "$t-n2-a2-off" grads)
  if [ -n "$g" ] && [ "$go" = 0 ] && [ "$g" -ge $((4 * P / 2)) ] &&
     [ "$(peak "$r" comm)" = "$(peak "$r-off" comm)" ]; then
    ok "$t, 2 ranks: device grads peak $g bytes (>= 4 x P/2 = $((4 * P / 2))) -> 0 with offload, comm peak unchanged"
  else bad "$t, 2 ranks: grads peak $g -> $go, comm $(peak "$r" comm) -> $(peak "$r-off" comm)"; fi
done
g1=$(peak zero-1-n2-a2 grads)
[ -n "$g1" ] && [ "$g1" -ge $((4 * P)) ] && [ "$(peak zero-1-n2-a2-off grads)" = "$g1" ] &&
  ok "zero-1 keeps its full gradients on the device ($g1 bytes >= 4P) with offload" ||
  bad "zero-1 grads peak $g1 -> $(peak zero-1-n2-a2-off grads)"
[ "$(peak zero-2-n2-a2-off offload)" = $(( $(peak zero-1-n2-a2-off offload) + $(peak zero-2-n2-a2 grads) )) ] &&
  ok "the tier holds zero-1's master and moments plus the gradient shard the device dropped" ||
  bad "tier bytes: zero-2 $(peak zero-2-n2-a2-off offload), zero-1 $(peak zero-1-n2-a2-off offload)"

# the other optimizers and sharding layouts (SGD's momentum is the tier's
# first moment; HYBRID_SHARD's replicas each update their shard)
for v in "sgd zero zero.stage=2 --set optimizer.type=sgd" \
         "nesterov ddp ddp.overlap=true --set optimizer.type=sgd --set optimizer.nesterov=true" \
         "hybrid fsdp fsdp.sharding_strategy=HYBRID_SHARD --set fsdp.hybrid_group_size=2" \
         "noshard fsdp fsdp.sharding_strategy=NO_SHARD"; do
  set -- $v
  tag=$1 n=2; shift
  [ "$tag" = hybrid ] && n=4
  common=(--set parallel.data="$1" --set "$2" --set launch.nproc=$n "${@:3}")
  run "x-$tag" "${common[@]}" && run "x-$tag-off" "${common[@]}" --set parallel.offload=offload_cpu &&
    same "$tag ($1 ${2#*=}, $n ranks)" "x-$tag" "x-$tag-off"
done
# the host optimizer on 2 threads (the device's, [cpu] threads): a unit's
# held range of 12 x 128^2 + 13 x 128 = 198,272 elements is cut into two
# slices of at least 64 Ki; element-wise, so still bit for bit
thr=(--set parallel.data=zero --set zero.stage=3 --set model.n_embd=128 --set cpu.threads=2
     --set launch.nproc=1 --set run.comm=self --set train.grad_accum=2)
if run thr "${thr[@]}" && DTRAIN_LOG=debug run thr-off "${thr[@]}" --set parallel.offload=offload_cpu; then
  same "host optimizer on 2 threads (zero stage 3, 1 rank, n_embd 128)" thr thr-off
  grep -qF "host optimizer" thr-off.log && grep -qF "(2 thread(s))" thr-off.log &&
    ok "the offloaded optimizer says it ran on 2 threads" ||
    bad "no 2-thread host optimizer line" "$(grep -i 'offloaded optimizer' thr-off.log | head -3)"
fi
for strat in "zero zero.stage=3" "ddp ddp.init_check=broadcast"; do
  set -- $strat
  common=(--set parallel.data="$1" --set "$2" --set launch.nproc=2 --set model.dtype=bf16)
  run "bf16-$1" "${common[@]}" && run "bf16-$1-off" "${common[@]}" --set parallel.offload=offload_cpu &&
    same "bf16 parameters, $1 ${2#*=}, 2 ranks" "bf16-$1" "bf16-$1-off"
done

# parameters offloaded (zero stage 3, fsdp FULL_SHARD): alone (device
# optimizer) and with the optimizer; units gathered per use
# (param_persistence_threshold 0) and kept gathered, prefetching on and off;
# each run's memory as planned (the cpu device's scratch aside: 1 thread x
# T 16 floats of attention backward, 64 bytes)
for strat in "zero zero.param_persistence_threshold=0" "zero zero.prefetch_bucket_size=0" \
             "zero zero.param_persistence_threshold=100000" \
             "fsdp fsdp.sharding_strategy=FULL_SHARD"; do
  set -- $strat
  [ "$1" = zero ] && st=(--set zero.stage=3) || st=()
  for n in 1 2 4; do
    tag="p-${2//[.=]/-}-n$n"; tag=${tag/param_persistence_threshold/persist}
    common=(--set parallel.data="$1" "${st[@]}" --set "$2" --set launch.nproc="$n" --set train.grad_accum=2)
    run "$tag" "${common[@]}" || continue
    for w in params optimizer_and_params; do
      run "$tag-${w:0:3}" "${common[@]}" --set parallel.offload=offload_cpu --set "$1.offload_what=$w" &&
        same "offload_what = $w, $1 ${2%%=*}=${2#*=}, $n rank(s)" "$tag" "$tag-${w:0:3}" &&
        planned_is_measured "offload_what = $w, $1 ${2%%=*}=${2#*=}, $n rank(s)" "$tag-${w:0:3}.jsonl" 64
    done
  done
done
common=(--set parallel.data=zero --set zero.stage=3 --set zero.param_persistence_threshold=0
        --set launch.nproc=2 --set model.dtype=bf16)
for w in params optimizer_and_params; do
  run "bf16-p-$w" "${common[@]}" --set parallel.offload=offload_cpu --set "zero.offload_what=$w" &&
    same "bf16 parameters, offload_what = $w, zero stage 3, 2 ranks" bf16-zero "bf16-p-$w"
done
# with everything offloaded, the device holds no parameters or optimizer
# state between uses: its params peak is 0, the tier holds all of it
run all-off "${common[@]}" --set model.dtype=fp32 --set parallel.offload=offload_cpu \
  --set zero.offload_what=optimizer_and_params || true
peaks=$(grep '^{"memory"' all-off.jsonl | grep -o '"peak_bytes": {[^}]*}' || true)
if grep -qF '"params": 0, "grads": 0, "optimizer": 0,' <<<"$peaks"; then
  ok "params and optimizer offloaded: no parameter, gradient or optimizer bytes on the device"
else bad "device bytes with everything offloaded" "$peaks"; fi

# ---- checkpoints through the same manifest ----------------------------------
ck=(--set parallel.data=zero --set zero.stage=2 --set train.steps=4 --set train.global_batch=4)
run full "${ck[@]}" --set launch.nproc=2 || true
# saved with offload at step 2, resumed without by the same 2 ranks
run saved-off "${ck[@]}" --set launch.nproc=2 --set parallel.offload=offload_cpu --set train.stop_at=2 || true
mkdir -p out/resumed && cp -r out/saved-off/ckpt out/resumed/
if run resumed "${ck[@]}" --set launch.nproc=2 --set checkpoint.resume=latest; then
  if cmp -s full.st resumed.st; then ok "saved with offload, resumed without (2 ranks): final parameters bit for bit"
  else bad "saved with offload, resumed without: parameters differ"; fi
fi
# saved without offload by 2 ranks, resumed by 1 rank with and without offload
run saved "${ck[@]}" --set launch.nproc=2 --set train.stop_at=2 || true
for v in plain off; do
  mkdir -p "out/one-$v" && cp -r out/saved/ckpt "out/one-$v/"
done
run one-plain "${ck[@]}" --set launch.nproc=1 --set run.comm=self --set checkpoint.resume=latest || true
run one-off "${ck[@]}" --set launch.nproc=1 --set run.comm=self --set checkpoint.resume=latest \
  --set parallel.offload=offload_cpu || true
grep -qF "(step 2)" one-off.log && ok "the offloaded run resumed at step 2" || bad "no resume at step 2" "$(cat one-off.log)"
same "saved by 2 ranks, resumed by 1 with offload vs without" one-plain one-off

# ---- a device budget below the model state ------------------------------------
mem=(--set model.n_embd=64 --set model.n_layer=2 --set train.micro_batch=1 --set parallel.data=zero
     --set zero.stage=1 --set launch.nproc=1 --set run.comm=self --set cpu.memory_limit=1500000)
expect_exit 1 "optimizer state over memory_limit without offload" "$bin" run t.toml "${mem[@]}" \
  --set run.name=nomem
expect_out "the budget error names the tag and the bytes" "(470016 bytes) for optimizer"
expect_out "... and the limit" "over memory_limit 1.4 MiB"
expect_out "... and suggests offload" 'set [parallel] offload = "offload_cpu"'
if grep -q '^step' <<<"$out"; then bad "a step ran before the budget error" "$out"; else ok "no step ran"; fi
expect_exit 0 "the same run with the optimizer offloaded trains" "$bin" run t.toml "${mem[@]}" \
  --set run.name=fits --set parallel.offload=offload_cpu --metrics fits.jsonl
peaks=$(grep '^{"memory"' fits.jsonl | grep -o '"peak_bytes": {[^}]*}' || true)
if grep -qF '"optimizer": 0,' <<<"$peaks" && grep -qF '"params": ' <<<"$peaks"; then
  ok "no optimizer bytes on the device"
else bad "optimizer bytes on the device" "$(grep memory fits.jsonl)"; fi
# measured beside planned: the plan moves the optimizer to the tier too
expect_out "the report plans no optimizer bytes on the device" "optimizer 0.00 / 0.00"
expect_out "... and the tier's bytes as measured" "offload 1.34 / 1.34"
# the tier holds master + exp_avg + exp_avg_sq: 3 x 470016 bytes
expect_out "the report names the tier's bytes" "offload tier (rank 0, MiB held): offload_cpu 1.34"
if grep -qF '{"offload_tier": {"rank": 0, "plugin": "offload_cpu", "held_bytes": 1410048,' fits.jsonl
then ok "the metrics file has the tier's peak bytes"
else bad "no offload_tier line with 1410048 bytes" "$(grep offload_tier fits.jsonl)"; fi

# `dtrain plan` with a tier: zero-1's row plans everything on the device,
# its "optimizer" sub-row the optimizer off the device and the tier's bytes
# (test_plan.sh checks the sub-rows' numbers by hand)
expect_exit 0 "plan with offload_cpu" "$bin" plan t.toml "${mem[@]}" --set parallel.offload=offload_cpu
sub=$(sed -n '/^zero-1 /,/^[^ ]/p' <<<"$out" | grep '^  optimizer ' || true)
if grep -qE '^  optimizer +[0-9.]+ MiB +[0-9.]+ MiB +0\.00 MiB .* 1\.34 MiB +2\.69 MiB$' <<<"$sub"
then ok "plan: zero-1's optimizer sub-row: no optimizer bytes on the device, 1.34 MiB in the tier"
else bad "plan: zero-1's optimizer sub-row: $sub" "$out"; fi
if grep -qE '^zero-1 +[0-9.]+ MiB +[0-9.]+ MiB +0\.00 MiB ' <<<"$out"; then
  bad "plan: zero-1's own row leaves the optimizer off the device" "$out"
else ok "plan: zero-1's own row keeps the optimizer on the device"; fi

# ---- config errors and the keys' docs ------------------------------------------
expect_exit 2 "params offload under zero stage 2" "$bin" run t.toml --set parallel.data=zero \
  --set zero.stage=2 --set zero.offload_what=params --set parallel.offload=offload_cpu --set run.name=e1
expect_out "the error names who may offload params" \
  'offload_what = "params": parameters are offloaded only by zero stage 3 and fsdp FULL_SHARD, and this is zero stage 2'
expect_exit 2 "params offload under ddp, 2 ranks" "$bin" run t.toml --set parallel.data=ddp \
  --set ddp.offload_what=optimizer_and_params --set parallel.offload=offload_cpu \
  --set launch.nproc=2 --set run.name=e2
expect_out "the error names ddp" "and this is ddp"
expect_exit 2 "params offload under fsdp SHARD_GRAD_OP" "$bin" run t.toml --set parallel.data=fsdp \
  --set fsdp.sharding_strategy=SHARD_GRAD_OP --set fsdp.offload_what=params \
  --set parallel.offload=offload_cpu --set run.name=e3
expect_out "the error names fsdp's strategy" "and this is fsdp SHARD_GRAD_OP"
expect_exit 0 "describe offload_cpu" "$bin" plugins --describe offload_cpu
expect_out "capacity is listed with its doc" "most bytes the tier holds"
for s in zero fsdp ddp; do
  expect_exit 0 "describe $s" "$bin" plugins --describe "$s"
  expect_out "$s lists offload_what" "offload_what"
done

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
