#!/usr/bin/env bash
# Watching a run: the log line's elapsed time and ETA, the line each
# checkpoint save prints, the summary a run ends with (its numbers checked
# against the metrics file and the checkpoint folder), validation loss
# equal at every world size, a note when a resume changes train.steps
# under a decaying schedule, `dtrain plot` rendering real PNG and SVG
# files (and running nothing a metrics file's name holds), and the crash report of a rank whose plugin segfaults (a fake
# strategy that trains, then stores to address 0x10 in a chosen method,
# the state methods a checkpoint save, load or initialisation calls too).
set -euo pipefail
bin=$1 work=$2 fakes=${3:-}  # fakes: the fake plugins' folder (a strategy that crashes)
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

# ---- validation loss does not depend on the world size ----
# The same weights (a 6-step checkpoint, then one step at lr 0) evaluated on
# 1 rank (4 micro-batches of 2 a global batch) and on 2 ranks (1 of 4 each):
# eval_steps counts global batches, so both see the same 32 sequences of the
# validation file.  Tolerance 1e-5: only the reduction order differs (the
# old per-rank count gave 2x the sequences on 2 ranks and differed by 5e-2).
"$bin" data prepare /usr/share/common-licenses/GPL-3 gpl.bin --val gpl-val.bin --val-fraction 0.1 >/dev/null
toml_from gpt2_2layer v.toml \
  '[run]' 'log_every = 100' \
  '[data]' 'train = "gpl.bin"' 'val = "gpl-val.bin"' \
  '[train]' 'micro_batch = 2' 'eval_every = 1000' 'eval_steps = 4' \
  '[checkpoint]' 'every = 6'
expect_exit 0 "6 steps on 1 rank, checkpoint at 6" "$bin" run v.toml --set run.name=pre
at_lr0=(--set checkpoint.resume=out/pre/ckpt/step-00000006 --set train.steps=7 --set train.lr=0
        --set train.min_lr=0 --set train.eval_every=7)
expect_exit 0 "its weights evaluated on 1 rank" "$bin" run v.toml "${at_lr0[@]}" --set run.name=v1 \
  --metrics v1.jsonl
expect_exit 0 "its weights evaluated on 2 ranks" "$bin" run v.toml "${at_lr0[@]}" --set run.name=v2 \
  --set launch.nproc=2 --set train.micro_batch=4 --metrics v2.jsonl
val() { grep -o '"val_loss": [^,}]*' "$1" | cut -d' ' -f2; }
v1=$(val v1.jsonl); v2=$(val v2.jsonl)
if [ -n "$v1" ] && [ -n "$v2" ] && awk -v a="$v1" -v b="$v2" 'BEGIN { d = a - b; exit !(d <= 1e-5 && d >= -1e-5) }'; then
  ok "val loss on 1 rank ($v1) = on 2 ranks ($v2) within 1e-5"
else bad "val loss differs between 1 rank ($v1) and 2 ranks ($v2)"; fi

# ---- resuming with another train.steps says the schedule changes ----
expect_exit 0 "resume the 6-step run with train.steps = 12" "$bin" run v.toml --set run.name=more \
  --set checkpoint.resume=out/pre/ckpt/step-00000006 --set train.steps=12
expect_out "one line says the cosine decay is stretched" \
  "dtrain: note: train.steps is 12, the saved run's was 6: the cosine learning-rate decay now ends at step 12 instead of 6 (lr at step 7: 0.0015, was 0)"
n=$(grep -c 'note: train.steps' <<<"$out" || true)
[ "$n" = 1 ] && ok "said once" || bad "said $n times" "$out"
expect_exit 0 "resume with the same train.steps" "$bin" run v.toml --set run.name=same \
  --set checkpoint.resume=out/pre/ckpt/step-00000006 --set train.steps=6
if grep -qF 'note: train.steps' <<<"$out"; then bad "a note without a change" "$out"
else ok "no note when train.steps is unchanged"; fi
expect_exit 0 "resume with train.steps = 8 under constant lr" "$bin" run v.toml \
  --set run.name=const --set checkpoint.resume=out/pre/ckpt/step-00000006 --set train.steps=8 \
  --set train.decay=constant
if grep -qF 'note: train.steps' <<<"$out"; then bad "a note for a schedule without decay" "$out"
else ok "no note when the schedule does not decay"; fi

# ---- dtrain plot: a real image from the metrics file just written ----
expect_exit 2 "plot -o with another extension is a usage error" "$bin" plot w.jsonl -o w.pdf
expect_out "the extension is named" "-o 'w.pdf': the name must end in .png or .svg"
expect_exit 1 "plot of a file that is not JSON lines" "$bin" plot tiny.toml -o x.png
expect_out "names the line" "tiny.toml:1: not a JSON object"
echo '{"memory": {}}' > nosteps.jsonl
expect_exit 1 "plot of a file without step records" "$bin" plot nosteps.jsonl -o x.png
expect_out "says what is missing" "nosteps.jsonl: no step records"
expect_exit 1 "plot without gnuplot on PATH" env PATH=/nonexistent "$bin" plot w.jsonl -o x.png
expect_out "names gnuplot and the package" "gnuplot is not on PATH (Debian: apt-get install gnuplot-nox"
[ ! -e x.png ] && ok "a failed plot leaves no file" || bad "x.png left behind"
if ! command -v gnuplot >/dev/null; then
  skip "dtrain plot png/svg" "gnuplot is not installed (scripts/install-deps.sh installs gnuplot-nox)"
else
  expect_exit 0 "plot to png" "$bin" plot w.jsonl -o w.png
  expect_out "says what it drew" "w.jsonl: 4 steps (1-4) and memory -> w.png"
  # a PNG: its 8-byte signature, then the IHDR chunk with width and height
  if /usr/bin/python3 - w.png <<'P'
import struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n", b[:8]
assert b[12:16] == b"IHDR", b[12:16]
w, h = struct.unpack(">II", b[16:24])
assert (w, h) == (1200, 900), (w, h)
assert b[-8:-4] == b"IEND", b[-8:]
P
  then ok "png: signature, IHDR 1200x900, IEND"; else bad "w.png is not a 1200x900 PNG"; fi
  expect_exit 0 "plot to svg" "$bin" plot w.jsonl -o w.svg
  # an SVG that parses, with every series in its key, the loss curve
  # through the 4 steps and the val loss through the 2 evaluated ones
  if out=$(/usr/bin/python3 - w.svg 2>&1 <<'P'
import re, sys
import xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
series = {}
for g in root.iter(ns + "g"):
    if not g.get("id", "").startswith("gnuplot_plot_"):
        continue
    key = [t.text for t in g.iter(ns + "text")]
    paths = [p.get("d") for p in g.iter(ns + "path")]
    if key:
        series[key[0]] = paths
want = ["loss", "val loss", "lr", "tokens/s", "grad norm", "planned", "measured"]
missing = [k for k in want if k not in series]
assert not missing, ("series missing", missing, sorted(series))
def points(d):  # the curve: the subpath after the key's sample line
    return len(re.findall(r"[ML]\s*[0-9.]+,[0-9.]+", re.split(r"(?=M)", d.strip())[2]))
assert points(series["loss"][0]) == 4, series["loss"]
assert points(series["val loss"][0]) == 2, series["val loss"]
texts = [t.text for t in root.iter(ns + "text")]
assert "activations" in texts and "optimizer" in texts, texts
P
  ); then ok "svg: parses, every series in the key, loss over 4 steps, val over 2"
  else bad "w.svg does not hold the series" "$out"; fi
  # a resumed run appends the steps after its checkpoint again: the later
  # rows replace the earlier ones (4 steps drawn, not 6)
  { grep '"step"' w.jsonl; grep -E '"step": [34],' w.jsonl; } > resumed.jsonl
  expect_exit 0 "plot a metrics file with steps 3-4 repeated" "$bin" plot resumed.jsonl -o r.svg
  expect_out "counts each step once" "resumed.jsonl: 4 steps (1-4) -> r.svg"
  # a name holding every gnuplot metacharacter: `command` and $(command)
  # substitution, both quotes, backslashes (one last), a newline, @macro,
  # %, ';' then system(), enhanced-text markup, XML's <&>, a byte that is
  # not UTF-8.  Nothing runs (no MARK file appears), the plot is drawn, and
  # the title shows the name with the newline and the bad byte as '?'.
  hostile=$'m`touch MARK1`$(touch MARK2)\'q\'"dq"\\n\\\n@GPVAL_PWD %s%d ; system(\'touch MARK3\') ; {a}^b_c <&> \xc3\xa9\xff x\\'
  cp w.jsonl "$hostile"
  rm -f MARK1 MARK2 MARK3
  expect_exit 0 "plot a metrics file whose name holds gnuplot metacharacters" \
    "$bin" plot "$hostile" -o "$hostile.svg"
  left=$(ls MARK* 2>/dev/null || true)
  [ -z "$left" ] && ok "no command in the name ran (no MARK file)" || bad "commands ran: $left"
  expect_exit 0 "and to png" "$bin" plot "$hostile" -o "$hostile.png"
  left=$(ls MARK* 2>/dev/null || true)
  [ -z "$left" ] && ok "png: no command in the name ran" || bad "png: commands ran: $left"
  if out=$(/usr/bin/python3 - "$hostile.svg" "$hostile.png" 2>&1 <<'P'
import sys
import xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
want = ("dtrain: m`touch MARK1`$(touch MARK2)'q'\"dq\"\\n\\?@GPVAL_PWD %s%d ; "
        "system('touch MARK3') ; {a}^b_c <&> \u00e9? x\\ (steps 1-4)")
titles = [t.text for t in root.iter(ns + "text") if (t.text or "").startswith("dtrain:")]
assert titles == [want], titles
texts = [t.text for t in root.iter(ns + "text")]
assert "loss" in texts and "grad norm" in texts and "activations" in texts, texts
assert open(sys.argv[2], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
P
  ); then ok "the title shows the name as text, every panel drawn, both files written"
  else bad "the title or the plot is wrong" "$out"; fi
fi

# ---- a plugin that crashes: the report names signal, plugin, method, step ----
ulimit -c 0 # no core files from the crashes below
if [ -z "$fakes" ]; then
  skip "crash reports" "no fake plugin folder given (3rd argument)"
else
  crashy=(env DTRAIN_PLUGIN_PATH="$fakes/crash" "$bin" run tiny.toml --set parallel.data=crashy
          --set train.grad_accum=2)
  expect_exit 139 "a rank whose strategy segfaults dies of SIGSEGV (128 + 11)" "${crashy[@]}" \
    --set run.name=crash1 --set crashy.method=post_backward --set crashy.step=2 \
    --set crashy.unit=1 --set crashy.micro=1
  so="$fakes/crash/dtrain_crashy.so"
  summary="[rank 0] crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy post_backward, at step 2, micro-batch 1, unit 1 (block.0), training; the faulting code is in strategy/crashy ($so); pid "
  expect_out "report: signal, plugin, method, step, micro-batch, unit, faulting object" "$summary"
  case $(tail -n 1 <<<"$out") in
    "$summary"[0-9]*) ok "the summary is the last line, with the pid" ;;
    *) bad "the summary is not the last line" "$out" ;;
  esac
  expect_out "report: a backtrace follows its header" "[rank 0] crash: backtrace (innermost first):"
  if grep -qE "^\[rank 0\]   #[0-9]+ $so\(\+0x[0-9a-f]+\)\[0x[0-9a-f]+\]\$" <<<"$out"; then
    ok "report: a backtrace frame inside the plugin"
  else bad "no backtrace frame in $so" "$out"; fi
  # the optimizer step is no unit's and no micro-batch's
  expect_exit 139 "a crash in the strategy's step" "${crashy[@]}" --set run.name=crash2 \
    --set crashy.method=step --set crashy.step=1
  expect_out "report: step 1, the optimizer step" \
    "[rank 0] crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy step, at step 1, optimizer step; the faulting code is in strategy/crashy"
  # the checkpoint paths: a crash in the strategy's state methods while a
  # save (every = 2) or a load walks the units is the strategy's, named
  # with the method, the unit and the phase (before, it read "in the core,
  # between plugin calls")
  expect_exit 139 "a crash in get_state during a checkpoint save" "${crashy[@]}" \
    --set run.name=crash4 --set crashy.method=get_state --set crashy.step=2 --set crashy.unit=1
  expect_out "report: get_state, step 2, unit 1, checkpoint save" \
    "[rank 0] crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy get_state, at step 2, unit 1 (block.0), checkpoint save; the faulting code is in strategy/crashy ($so); pid "
  expect_exit 139 "a crash in state_ranges during a checkpoint save" "${crashy[@]}" \
    --set run.name=crash5 --set crashy.method=state_ranges --set crashy.step=2
  expect_out "report: state_ranges, step 2, unit 0, checkpoint save" \
    "[rank 0] crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy state_ranges, at step 2, unit 0 (embedding), checkpoint save; the faulting code is in strategy/crashy"
  expect_exit 0 "a checkpoint to load (ddp, stopped at step 2)" "$bin" run tiny.toml \
    --set run.name=crash6 --set train.stop_at=2
  expect_exit 139 "a crash in set_state while loading it" "${crashy[@]}" --set run.name=crash6 \
    --set checkpoint.resume=latest --set crashy.method=set_state --set crashy.step=0 \
    --set crashy.unit=2
  expect_out "report: set_state, unit 2, checkpoint load" \
    "[rank 0] crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy set_state, at unit 2 (head), checkpoint load; the faulting code is in strategy/crashy"
  expect_exit 139 "a crash in set_state while initialising a fresh state" "${crashy[@]}" \
    --set run.name=crash7 --set crashy.method=set_state --set crashy.step=0 --set crashy.unit=1
  expect_out "report: set_state, unit 1, state initialisation" \
    "[rank 0] crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy set_state, at unit 1 (block.0), state initialisation; the faulting code is in strategy/crashy"
  # one of two ranks: the launcher's last line quotes its report
  sed -i 's/^comm = "self"$/comm = "shm"/' tiny.toml
  expect_exit 1 "2 ranks, rank 1 crashes in pre_backward: the launcher exits 1" "${crashy[@]}" \
    --set run.name=crash3 --set launch.nproc=2 --set launch.timeout=20 \
    --set crashy.method=pre_backward --set crashy.rank=1 --set crashy.unit=2
  expect_out "rank 1's report" "[rank 1] crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy pre_backward, at step 2, micro-batch 0, unit 2 (head), training"
  # (rank 0 either ends by itself within the launcher's report window,
  # naming the dead peer, or is stopped after it: "stopped the other 1
  # rank")
  last=$(tail -n 1 <<<"$out")
  case $last in
    "dtrain: rank 1 failed (killed by SIGSEGV); its last error line: crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy pre_backward, at step 2, micro-batch 0, unit 2 (head)"* | \
    "dtrain: rank 1 failed (killed by SIGSEGV); stopped the other 1 rank; its last error line: crash: SIGSEGV (address not mapped: 0x10) in strategy/crashy pre_backward, at step 2, micro-batch 0, unit 2 (head)"*)
      ok "the launcher's last line names the signal and quotes the report" ;;
    *) bad "the launcher's last line" "$out" ;;
  esac
  if grep -qF "[rank 0] crash:" <<<"$out"; then bad "rank 0 reported a crash" "$out"
  else ok "rank 0 did not crash (it ended or was stopped)"; fi
  job=$(sed -n 's/^dtrain: launching 2 ranks (job \(.*\))$/\1/p' <<<"$out")
  after_fault "crash of rank 1" "$job" out/crash3/ckpt "" ""
fi

finish
