#!/usr/bin/env bash
# `dtrain eval CKPT --data TOKENS`: a checkpoint's loss and perplexity on a
# token file.  A tiny GPT-2 trained 2 steps with a validation file saves a
# checkpoint; eval of that checkpoint on the same file with the same batch
# shape and batch count prints exactly the val loss the run printed at that
# step (the same code, the same batches, the same weights: equal to the
# last printed digit, %.9g of the same float), from the training config or
# from --set alone, on the file in uint16 and in uint32 (llm.c v7) tokens;
# on 2 ranks (ddp, fsdp, two pipeline stages) the same sequences give the
# same loss within 1e-6 relative (each rank averages its half, then the
# ranks average: another order of additions than one rank's); nothing is
# written; errors name the file and exit 2 for usage, 1 for unreadable
# input.
set -euo pipefail
bin=$1 work=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$work"; mkdir -p "$work"; cd "$work"

tiny_run_setup "$bin"
printf 'other words to validate on, some of them new. %.0s' $(seq 60) > val.txt
expect_exit 0 "data prepare val" "$bin" data prepare val.txt val.bin
expect_exit 0 "a run evaluating val.bin at step 2" "$bin" run tiny.toml --set run.name=a \
  --set 'data.val="val.bin"' --set train.eval_every=2 --set train.eval_steps=3 \
  --set 'run.metrics="m.jsonl"'
want=$(grep -o '"val_loss": [^,}]*' m.jsonl | tail -1 | cut -d' ' -f2)
[ -n "$want" ] && ok "the run's val loss at step 2: $want" || bad "no val_loss in m.jsonl" ""
ck=out/a/ckpt
sums=$(ckpt_sums out)

loss_of() { sed -n 's/.*: loss \([^,]*\), perplexity .*/\1/p' <<<"$1" | tail -1; }

expect_exit 0 "eval with the training config" "$bin" eval "$ck" --data val.bin --config tiny.toml \
  --batches 3
expect_out "the result line" "eval: out/a/ckpt/step-00000002 step 2: 3 batches of 2 x 16 tokens of 'val.bin': loss $want, perplexity "
got=$(loss_of "$out")
[ "$got" = "$want" ] && ok "eval's loss is the run's val loss ($got)" || bad "eval loss" "$got vs $want"
ppl=$(sed -n 's/.*perplexity \(.*\)$/\1/p' <<<"$out" | tail -1)
python3 -c "import math,sys; l,p=float('$got'),float('$ppl'); sys.exit(0 if abs(p-math.exp(l))<=1e-6*p else 1)" &&
  ok "perplexity is exp(loss) ($ppl)" || bad "perplexity" "$ppl vs exp($got)"
case "$out" in *"resumed from"*|*"note:"*) bad "eval printed a resumed run's notes" "$out";;
  *) ok "no resume notes";; esac

expect_exit 0 "eval from --set alone" "$bin" eval "$ck" --data val.bin --batches 3 \
  --set train.micro_batch=2 --set cpu.threads=1
got=$(loss_of "$out")
[ "$got" = "$want" ] && ok "the same loss without the config ($got)" || bad "eval loss" "$got vs $want"

# the same tokens as llm.c's uint32 file (magic 20240801, version 7)
python3 - <<'P'
import struct
d = open("val.bin", "rb").read()
h = list(struct.unpack("<256i", d[:1024]))
toks = struct.unpack("<%dH" % h[2], d[1024:])
h[0], h[1] = 20240801, 7
open("val32.bin", "wb").write(struct.pack("<256i", *h) + struct.pack("<%dI" % len(toks), *toks))
P
expect_exit 0 "eval on the uint32 file" "$bin" eval "$ck" --data val32.bin --config tiny.toml \
  --batches 3
got=$(loss_of "$out")
[ "$got" = "$want" ] && ok "uint32 tokens: the same loss ($got)" || bad "uint32 eval" "$got vs $want"

expect_exit 0 "eval on 2 ranks" "$bin" eval "$ck" --data val.bin --config tiny.toml --batches 3 \
  --set run.comm=shm --set train.micro_batch=1 --set train.global_batch=2 --nproc 2
expect_out "rank 0 prints the line" "[rank 0] eval: out/a/ckpt/step-00000002 step 2: 3 batches of 2 x 16 tokens"
got=$(loss_of "$out")
python3 -c "import sys; a,b=float('$got'),float('$want'); sys.exit(0 if abs(a-b)<=1e-6*abs(b) else 1)" &&
  ok "2 ranks: the same loss within 1e-6 ($got)" || bad "2-rank eval" "$got vs $want"

# any layout loads the checkpoint: fsdp's shards, two pipeline stages
# (a rank of fsdp takes one sequence of each batch, a pipeline stage both)
for lay in "parallel.data=fsdp train.micro_batch=1" "parallel.pipeline=2 train.micro_batch=2"; do
  set -- $lay
  expect_exit 0 "eval on 2 ranks, $1" "$bin" eval "$ck" --data val.bin --config tiny.toml \
    --batches 3 --set run.comm=shm --set train.global_batch=2 --set "$1" --set "$2" --nproc 2
  lay=$1
  got=$(loss_of "$out")
  python3 -c "import sys; a,b=float('$got'),float('$want'); sys.exit(0 if abs(a-b)<=1e-6*abs(b) else 1)" &&
    ok "$lay: the same loss within 1e-6 ($got)" || bad "$lay eval" "$got vs $want"
done

expect_exit 0 "every whole batch by default" "$bin" eval "$ck" --data val.bin --config tiny.toml
all=$(sed -n 's/.* step 2: \([0-9]*\) batches of 2 x 16 tokens.*/\1/p' <<<"$out")
[ -n "$all" ] && [ "$all" -gt 3 ] && ok "every whole batch: $all" || bad "the batch count" "$out"
[ "$(ckpt_sums out)" = "$sums" ] && ok "nothing written under out/" || bad "eval changed out/" ""

# errors
expect_exit 2 "no --data" "$bin" eval "$ck"
expect_out "says what is missing" "dtrain eval: error: missing --data TOKENS (see dtrain eval --help)"
expect_exit 2 "no checkpoint" "$bin" eval --data val.bin
expect_out "says what is missing" "missing CKPT"
expect_exit 2 "--batches 0" "$bin" eval "$ck" --data val.bin --batches 0
expect_out "names the option" "--batches '0' is not an integer >= 1"
expect_exit 2 "more batches than the file holds" "$bin" eval "$ck" --data val.bin --config tiny.toml \
  --batches $((all + 1))
expect_out "names the file and the count" "--batches $((all + 1)): 'val.bin' holds $all whole batches of 2 sequences of 16 tokens"
expect_exit 2 "an unknown option" "$bin" eval "$ck" --data val.bin --top-k 3
expect_out "names it" "unknown option '--top-k'"
expect_exit 1 "a token file that does not exist" "$bin" eval "$ck" --data nope.bin
expect_out "names the file" "data file 'nope.bin'"
expect_exit 1 "a text file for tokens" "$bin" eval "$ck" --data val.txt
expect_out "names the file" "data file 'val.txt': bad magic"
expect_exit 1 "a checkpoint that does not exist" "$bin" eval out/none --data val.bin
expect_out "names the path" "checkpoint 'out/none'"
head -c 1044 val.bin > short.bin
python3 - <<'P'
import struct
d = bytearray(open("short.bin", "rb").read())
d[8:12] = struct.pack("<i", (len(d) - 1024) // 2)
open("short.bin", "wb").write(d)
P
expect_exit 1 "a file too short for one sequence" "$bin" eval "$ck" --data short.bin \
  --config tiny.toml
expect_out "names the file and the need" "data file 'short.bin': 10 tokens hold no full sequence of seq_len 16 (need at least 17 tokens)"

finish
