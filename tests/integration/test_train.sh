#!/usr/bin/env bash
# Single-process training end to end on real text (the GPL-3 licence every
# Debian system ships): the loss falls, a run stopped and resumed from its
# checkpoint reproduces the uninterrupted run's losses bit for bit, a run
# reports its plugins' host memory and removes the saves a crash
# interrupted, and bad input (corrupt checkpoint, missing data, context too
# long) fails clearly.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
expect_exit 0 "data prepare" "$bin" data prepare /usr/share/common-licenses/GPL-3 train.bin
toml_from gpt2_2layer tiny.toml \
  '[run]' 'comm = "self"' 'log_every = 1' \
  '[train]' 'steps = 8' 'micro_batch = 4' 'grad_accum = 2' '-global_batch' \
  '[launch]' '-timeout'
loss() { losses "$1" | sed -n "${2}p"; }
expect_exit 0 "uninterrupted 8-step run" "$bin" run tiny.toml --metrics full.jsonl --set run.name=full
first=$(loss full.jsonl 1); last=$(loss full.jsonl 8)
if awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a - 0.3)}'; then ok "loss falls ($first -> $last)"
else bad "loss did not fall by 0.3 ($first -> $last)"; fi
# Host memory the plugins allocate through their host tables is reported
# per plugin and tag: ddp keeps its bookkeeping there.
expect_out "host memory line names the strategy" "host memory (rank 0, peak MiB by plugin): strategy/ddp "
if /usr/bin/python3 - full.jsonl <<'P'
import json, sys
h = [json.loads(l)["host_memory"] for l in open(sys.argv[1]) if '"host_memory"' in l]
assert len(h) == 1 and h[0]["rank"] == 0, h
p = h[0]["peak_bytes"]
assert sorted(p) == ["comm/self", "device/cpu", "model/gpt2", "strategy/ddp"], sorted(p)
for name, tags in p.items():
    assert tags["total"] <= sum(v for k, v in tags.items() if k != "total"), (name, tags)
assert p["strategy/ddp"]["other"] > 0, p
P
then ok "metrics: host peak bytes per plugin and tag"; else bad "metrics: host memory record"; fi
expect_exit 0 "run stopped after step 4" "$bin" run tiny.toml --metrics part.jsonl \
  --set run.name=part --set train.stop_at=4
expect_exit 0 "resume from the latest checkpoint" "$bin" run tiny.toml --metrics part.jsonl \
  --set run.name=part --set checkpoint.resume=latest
expect_out "resume announced" "resumed from out/part/ckpt/step-00000004"
if diff <(grep -o '"loss": [^,]*' full.jsonl) <(grep -o '"loss": [^,]*' part.jsonl) >/dev/null; then
  ok "resumed losses are bit-identical to the uninterrupted run"
else bad "losses differ after resume" "$(diff <(grep -o '"loss": [^,]*' full.jsonl) <(grep -o '"loss": [^,]*' part.jsonl))"; fi
shard=out/part/ckpt/step-00000008/shard-00000.bin
printf '\xff' | dd of="$shard" bs=1 seek=100 conv=notrunc status=none
expect_exit 1 "a flipped byte in a checkpoint is refused" "$bin" run tiny.toml \
  --set run.name=part --set checkpoint.resume=out/part/ckpt/step-00000008
expect_out "error names the shard file" "shard-00000.bin"
expect_out "error names the tensor" "embedding/params"
expect_out "error says checksum" "checksum mismatch"
expect_exit 1 "missing data file" "$bin" run tiny.toml --set data.train=nope.bin
expect_out "missing data named" "nope.bin"
expect_exit 2 "sequence longer than the context" "$bin" run tiny.toml --set train.seq_len=64
expect_out "context error explains" "longer than the model's context"
expect_exit 2 "batch arithmetic mismatch" "$bin" run tiny.toml --set train.global_batch=10
expect_out "batch error gives the numbers" "micro_batch (4) x grad_accum (2) x data-parallel size (1) = 8, but global_batch = 10"
# A disk that fills up during the step-4 save: a clear error, exit 1, the
# step-2 checkpoint intact and loadable.
if has_test_hooks "$bin"; then
  set +e
  out=$(DTRAIN_FAULT_WRITE_AFTER_BYTES=500000 "$bin" run tiny.toml --set run.name=full_disk \
    --set checkpoint.every=2 2>&1); e=$?
  set -e
  [ $e = 1 ] && ok "disk full while checkpointing: exit 1" || bad "disk full: exit $e" "$out"
  expect_out "disk full: the reason" "No space left on device"
  expect_out "disk full: the step" "saving checkpoint of step 4 (the previous checkpoint is intact)"
  [ -f out/full_disk/ckpt/step-00000002/COMPLETE ] && [ ! -e out/full_disk/ckpt/step-00000004 ] &&
    ! ls -d out/full_disk/ckpt/*.tmp >/dev/null 2>&1 &&
    ok "disk full: step 2 complete, nothing of step 4 left" || bad "disk full: folder" "$(ls -la out/full_disk/ckpt)"
  expect_exit 0 "disk full: resume from step 2" "$bin" run tiny.toml --set run.name=full_disk \
    --set checkpoint.resume=latest
  expect_out "disk full: resumed at step 2" "resumed from out/full_disk/ckpt/step-00000002"
else
  skip "a disk that fills while checkpointing" "test hooks (DTRAIN_FAULT_*) compiled out of $bin"
  # the step-2 checkpoint the resume test below starts from
  "$bin" run tiny.toml --set run.name=full_disk --set checkpoint.every=2 --set train.steps=2 \
    >/dev/null 2>&1 || bad "the step-2 checkpoint for the resume test" ""
fi

# Saves a crash interrupted ("step-N.tmp", "step-N.old" folders) are
# removed when the next run starts; complete checkpoints and folders that
# are not a save's are left alone.
expect_exit 0 "a run that leaves step 2" "$bin" run tiny.toml --set run.name=stale \
  --set train.stop_at=2
root=out/stale/ckpt
before=$(cd $root/step-00000002 && md5sum COMPLETE manifest.json shard-00000.bin)
mkdir -p $root/step-00000003.tmp $root/step-00000002.old $root/notes.tmp
: > $root/step-00000003.tmp/shard-00000.bin
expect_exit 0 "the next run starts" "$bin" run tiny.toml --set run.name=stale \
  --set checkpoint.resume=latest --set train.steps=3 --set checkpoint.keep=5
[ ! -e $root/step-00000003.tmp ] && [ ! -e $root/step-00000002.old ] &&
  ok "interrupted saves removed" || bad "interrupted saves left" "$(ls -la $root)"
[ -d $root/notes.tmp ] && ok "a folder that is not a save's is kept" ||
  bad "notes.tmp removed" "$(ls -la $root)"
after=$(cd $root/step-00000002 && md5sum COMPLETE manifest.json shard-00000.bin)
[ "$before" = "$after" ] && [ -f $root/step-00000003/COMPLETE ] &&
  ok "complete step 2 untouched, step 3 saved" || bad "checkpoints changed" "$(ls -laR $root)"

# A learning rate that blows the model up: the run stops at the first
# non-finite step, names it, and the last checkpoint stays loadable.
expect_exit 1 "non-finite loss stops the run" "$bin" run tiny.toml --set run.name=blowup \
  --set optimizer.type=sgd --set train.lr=10 --set train.gradient_clipping=0 \
  --set train.steps=40 --set checkpoint.every=2 --set train.grad_accum=1 --set train.warmup_steps=0
expect_out "non-finite: names the step and says so" "is non-finite"
expect_out "non-finite: last checkpoint intact" "the last checkpoint is intact"
expect_out "non-finite: names the first tensor" "first non-finite tensor: activation h."
step=$(printf '%s' "$out" | grep -o 'error: step [0-9]*' | grep -o '[0-9]*$')
last=$(ls out/blowup/ckpt | grep -o '[0-9]*$' | sort -n | tail -n 1)
[ -n "$step" ] && [ -n "$last" ] && [ $((10#$last)) -lt "$step" ] &&
  ok "non-finite at step $step; newest checkpoint is step $((10#$last))" ||
  bad "non-finite: step '$step', newest checkpoint '$last'" "$out"
expect_exit 0 "the checkpoint before the blow-up verifies" "$bin" ckpt inspect out/blowup/ckpt --verify

# The data loader's state is in the manifest: resuming with another seed or
# batch is allowed but said.
expect_exit 0 "resume with another seed" "$bin" run tiny.toml --set run.name=reseed \
  --set checkpoint.resume=out/full_disk/ckpt/step-00000002 --set run.seed=7 --set train.steps=3
expect_out "the changed data order is noted" \
  "note: the data order after step 2 differs from the saved run's: changed run.seed (was 1337)"

# The other model and the other dtype train through the same loop.
sed -e '/^\[model\]/,/^\[data\]/{/^\[/!d}' -e 's/^\[model\]/[model]\narch = "mlp"\nmlp_hidden = 64/' \
  tiny.toml > mlp.toml
expect_exit 0 "mlp model trains" "$bin" run mlp.toml --set run.name=mlp --set train.lr=3e-2 \
  --metrics mlp.jsonl
first=$(loss mlp.jsonl 1); last=$(loss mlp.jsonl 8)
awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < a - 0.2)}' && ok "mlp loss falls ($first -> $last)" ||
  bad "mlp loss did not fall ($first -> $last)"
expect_exit 0 "bf16 compute trains" "$bin" run tiny.toml --set run.name=bf16 --set model.dtype=bf16 \
  --metrics bf16.jsonl
first=$(loss bf16.jsonl 8); last=$(loss full.jsonl 8)
awk -v a="$first" -v b="$last" 'BEGIN{d=a-b; if(d<0)d=-d; exit !(d < 0.05)}' &&
  ok "bf16 final loss $first is within 0.05 of fp32's $last" || bad "bf16 loss $first vs fp32 $last"
finish
