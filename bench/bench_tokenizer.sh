#!/usr/bin/env bash
# bench/bench_tokenizer.sh - `dtrain data prepare --tokenizer` beside
# Hugging Face's `tokenizers` on the same multi-megabyte text, in the same
# run: the ids compared one by one, and the throughput of each (MB/s of
# text), ROUNDS interleaved rounds with the load average.
#
#   bench/bench_tokenizer.sh BUILD [MB] [ROUNDS]        (32, 3)
#
# The text: this machine's license texts and fortunes, and the suite's
# multilingual sample (tests/data/tokenizers/sample.txt), repeated to MB
# megabytes.  The tokenizers: trained here by `tokenizers` on that text
# (GPT-2's pre-tokenizer with 32000 ids, and Llama 3's pattern with 32000
# ids).  `tokenizers` encodes the text in one call
# (encode(text, add_special_tokens=False), which runs on one thread for
# one text); dtrain runs on 1 thread and on every core.  Needs a python
# with `tokenizers` ($PYTHON, default python3; pip install tokenizers).
# Results: bench/results/tokenizer.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: bench/bench_tokenizer.sh BUILD [MB] [ROUNDS]}
mb=${2:-32} rounds=${3:-3}
py=${PYTHON:-python3}
bin=$build/dtrain
"$py" -c 'import tokenizers' 2>/dev/null || {
  echo "bench_tokenizer.sh: $py has no tokenizers (pip install tokenizers)" >&2; exit 2; }
work=$(mktemp -d /tmp/dtrain-bench-tok.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$py" - "$work" "$mb" "$here/../tests/data/tokenizers/sample.txt" <<'PY'
import glob, os, sys, warnings
warnings.filterwarnings("ignore")
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, Regex
work, mb, sample = sys.argv[1], int(sys.argv[2]), sys.argv[3]
parts = [open(sample, encoding="utf-8", newline="").read()]
for f in sorted(glob.glob("/usr/share/common-licenses/*") + glob.glob("/usr/share/games/fortunes/*")):
    if os.path.isfile(f) and not f.endswith(".dat"):
        parts.append(open(f, encoding="utf-8", errors="replace").read())
base = "".join(parts)
text = (base * (mb * 1000000 // len(base.encode()) + 1))
text = text.encode()[:mb * 1000000].decode("utf-8", errors="ignore")
open(os.path.join(work, "text.txt"), "w", encoding="utf-8", newline="").write(text)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
pres = {"gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False),
        "llama3": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated"),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                    use_regex=False)])}
for name, pre in pres.items():
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([base], trainers.BpeTrainer(
        vocab_size=32000, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    t.save(os.path.join(work, name + ".json"))
PY
bytes=$(stat -c %s "$work/text.txt")
echo "text: $((bytes / 1000000)) MB ($(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'))"
echo
echo "| round | tokenizer | tokenizers encode MB/s | tokenizers encode_batch (lines, $(nproc) threads) MB/s | dtrain 1 thread MB/s | dtrain $(nproc) threads MB/s | dtrain 1 thread / encode | dtrain $(nproc) threads / encode_batch | ids equal | load |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for ((r = 1; r <= rounds; r++)); do
  for name in gpt2 llama3; do
    tk=$("$py" - "$work" "$name" <<'PY'
import sys, time, warnings, array
warnings.filterwarnings("ignore")
from tokenizers import Tokenizer
work, name = sys.argv[1], sys.argv[2]
t = Tokenizer.from_file(f"{work}/{name}.json")
text = open(f"{work}/text.txt", encoding="utf-8", newline="").read()
t0 = time.perf_counter()
ids = t.encode(text, add_special_tokens=False).ids
dt = time.perf_counter() - t0
array.array("H", ids).tofile(open(f"{work}/{name}.ref", "wb"))
# as a datasets user would: the text cut into lines, encode_batch on every
# core (the cut changes some ids at line ends: timing only)
lines = text.splitlines(keepends=True)
t0 = time.perf_counter()
t.encode_batch(lines, add_special_tokens=False)
db = time.perf_counter() - t0
print("%.3f %.3f" % (dt, db))
PY
)
    t1=$( { /usr/bin/time -f %e "$bin" data prepare "$work/text.txt" "$work/$name.1.bin" \
            --tokenizer "$work/$name.json" --threads 1 >/dev/null; } 2>&1 | tail -1)
    tn=$( { /usr/bin/time -f %e "$bin" data prepare "$work/text.txt" "$work/$name.n.bin" \
            --tokenizer "$work/$name.json" --threads "$(nproc)" >/dev/null; } 2>&1 | tail -1)
    same=no
    if tail -c +1025 "$work/$name.1.bin" | cmp -s - "$work/$name.ref" && \
       cmp -s "$work/$name.1.bin" "$work/$name.n.bin"; then same=yes; fi
    awk -v r=$r -v n=$name -v b=$bytes -v tk="${tk% *}" -v tb="${tk#* }" -v t1=$t1 -v tn=$tn \
        -v s=$same -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
      printf "| %d | %s | %.2f | %.2f | %.1f | %.1f | %.1fx | %.1fx | %s | %s |\n", r, n,
             b / tk / 1e6, b / tb / 1e6, b / t1 / 1e6, b / tn / 1e6, tk / t1, tb / tn, s, l }'
  done
done
