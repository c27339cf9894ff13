#!/usr/bin/env bash
# Watching a run: the log line's elapsed time and ETA, the line each
# checkpoint save prints, the summary a run ends with (its numbers checked
# against the metrics file and the checkpoint folder), and a note when a
# resume changes train.steps under a decaying schedule.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"
tiny_run_setup "$bin" '[checkpoint]' 'every = 2'
# 4 steps, validated every 2 on 2 batches of the training file
run4=(--set train.steps=4 --set data.val=train.bin --set train.eval_every=2
      --set train.eval_steps=2)

# ---- the log line, the checkpoint line, the summary ----
expect_exit 0 "4-step run with checkpoints and validation" "$bin" run tiny.toml "${run4[@]}" \
  --metrics w.jsonl --set run.name=w
log=$out
hms='[0-9]+:[0-9]{2}:[0-9]{2}'
if grep -qE "^step +1/4 \| loss [0-9.]+ \| .* \| elapsed $hms \| eta $hms\$" <<<"$log"; then
  ok "log line of step 1 has elapsed and eta"
else bad "log line of step 1 lacks 'elapsed H:MM:SS | eta H:MM:SS'" "$log"; fi
if grep -qE "^step +4/4 \| .* \| elapsed $hms \| eta 0:00:00 \| val [0-9.]+\$" <<<"$log"; then
  ok "the last step's eta is 0:00:00, before its val loss"
else bad "the last log line's eta is not 0:00:00" "$log"; fi

for s in 2 4; do
  dir=out/w/ckpt/step-0000000$s
  bytes=$(find "$dir" -maxdepth 1 -type f -printf '%s\n' | awk '{ n += $1 } END { print n }')
  if grep -qE "^checkpoint: saved $dir \($bytes bytes, [0-9]+\.[0-9]{3} s\)\$" <<<"$log"; then
    ok "checkpoint line of step $s: path, $bytes bytes (the folder's size), seconds"
  else bad "no checkpoint line 'checkpoint: saved $dir ($bytes bytes, S s)'" "$log"; fi
done
n=$(grep -c '^checkpoint: saved' <<<"$log" || true)
[ "$n" = 2 ] && ok "one checkpoint line per save" || bad "$n checkpoint lines, expected 2" "$log"

# the summary's numbers are the run's: tokens = steps x global batch x seq_len
# (4 x 2 x 16), the last loss and val loss of the metrics file, the peak the
# memory record holds
read -r last_loss last_val peak_mib < <(/usr/bin/python3 - w.jsonl <<'P'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "step" in r]
vals = [r["val_loss"] for r in steps if "val_loss" in r]
mem = [r["memory"] for r in rows if "memory" in r][0]
print("%.4f %.4f %.2f" % (steps[-1]["loss"], vals[-1], mem["total_peak_bytes"] / 2**20))
P
)
want="summary: 4 steps (1-4 of 4), 128 tokens in "
line=$(grep '^summary: ' <<<"$log" || true)
if grep -qE "^summary: 4 steps \(1-4 of 4\), 128 tokens in [0-9]+\.[0-9]{2} s \([0-9]+ tok/s\); final loss $last_loss, val $last_val \(step 4\); peak device memory $peak_mib MiB \(rank 0\)\$" <<<"$line"; then
  ok "summary: steps, tokens, time, final loss $last_loss, val $last_val, peak $peak_mib MiB"
else bad "summary line wrong (want '$want... final loss $last_loss, val $last_val (step 4); peak device memory $peak_mib MiB (rank 0)')" "$log"; fi
[ "$(tail -n 1 <<<"$(grep -v '^\[rank' <<<"$log")")" = "$line" ] && ok "the summary is the run's last line" \
  || bad "the summary is not the last line" "$log"

expect_exit 0 "run stopped at step 2" "$bin" run tiny.toml "${run4[@]}" --set run.name=stop \
  --set train.stop_at=2
if grep -qE "^summary: 2 steps \(1-2 of 4, stopped at train.stop_at\), 64 tokens in " <<<"$out"; then
  ok "summary of a run stopped early says so"
else bad "summary of the stopped run" "$out"; fi

finish
