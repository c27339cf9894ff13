#!/usr/bin/env python3
# tests/data/tokenizers/make_fixtures.py - how the tokenizer fixtures of
# unit.test_tokenizer were made, with Hugging Face's `tokenizers` library
# (0.23; pip install tokenizers): two byte-level BPE tokenizers trained here
# on the GPL-3 text and sample.txt, and the ids `tokenizers` gives for
# sample.txt and for edge cases, which dtrain's tokenizer must equal.
#   gpt2.json     GPT-2's pre-tokenizer (ByteLevel, use_regex), 800 ids,
#                 <|endoftext|> special, merges in the old "a b" spelling
#   gpt2_prefix.json  the same with add_prefix_space = true
#   llama3.json   Llama 3's Split pattern + ByteLevel(use_regex = false),
#                 ignore_merges, special <|begin_of_text|> / <|end_of_text|>,
#                 <mask> (lstrip, rstrip), and one added token at id 70000
#                 so the vocabulary needs uint32 token files
#   qwen2.json    Qwen2's normalizer (NFC) and pattern (single digits),
#                 special <|im_start|> / <|im_end|>, and [N] a normalized
#                 added token (matched after NFC)
#   <name>.expected.json  {"sample": [ids], "cases": [{"text", "ids"}]}
# Run from this folder; the outputs are checked in.
import json
from tokenizers import (Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers,
                        Regex, AddedToken)

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
corpus = ["/usr/share/common-licenses/GPL-3", "sample.txt"]
CASES = ["", " ", "a", "  leading", "trailing  ", "a\n\n\nb", "\r\n\r\n", "\t\t x",
         "<|endoftext|>", "<|endoftext|><|endoftext|>", "x<|endoftext|>y", "<|endoftext",
         "x<mask>y", "  <mask>  z", "<|begin_of_text|>Hi<|end_of_text|>", "It's I'M we'LL",
         "1234567 12 3", "😀😀 👨‍👩‍👧", "日本語のテキスト", "e\u0301 n\u0303", "a\u00a0b\u3000c",
         " " * 40 + "x", "x" * 300, "Hello, world!\n", "\u0100\u0101 ÿ", "the the",
         "cafe\u0301 [N] x[N]y 12345", "\u212b\u2126 A\u030a"]

def train(pre, special, vocab, norm=None):
    t = Tokenizer(models.BPE())
    if norm:
        t.normalizer = norm
    t.pre_tokenizer = pre
    t.decoder = decoders.ByteLevel()
    t.train(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=special,
                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t

def expected(name):
    t = Tokenizer.from_file(name + ".json")
    text = open("sample.txt", encoding="utf-8", newline="").read()
    out = {"sample": t.encode(text, add_special_tokens=False).ids, "cases": []}
    for c in CASES:
        out["cases"].append({"text": c, "ids": t.encode(c, add_special_tokens=False).ids})
    json.dump(out, open(name + ".expected.json", "w"), ensure_ascii=False)
    print(name, len(out["sample"]), "ids for sample.txt")

g = train(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"], 800)
g.save("gpt2.json")
d = json.load(open("gpt2.json"))
d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
json.dump(d, open("gpt2.json", "w"), ensure_ascii=False)
d["pre_tokenizer"]["add_prefix_space"] = True
json.dump(d, open("gpt2_prefix.json", "w"), ensure_ascii=False)

l = train(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                            use_regex=False)]),
          ["<|begin_of_text|>", "<|end_of_text|>"], 1200)
l.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False)])
l.save("llama3.json")
d = json.load(open("llama3.json"))
d["model"]["ignore_merges"] = True
d["model"]["vocab"]["\u0120the"] = 70000
json.dump(d, open("llama3.json", "w"), ensure_ascii=False)
q = train(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                            use_regex=False)]),
          ["<|im_start|>", "<|im_end|>"], 700, normalizers.NFC())
q.add_tokens([AddedToken("[N]", normalized=True)])
q.save("qwen2.json")
for n in ("gpt2", "gpt2_prefix", "llama3", "qwen2"):
    expected(n)
