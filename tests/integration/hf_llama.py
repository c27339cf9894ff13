#!/usr/bin/python3
"""Helpers of test_hf_llama.sh: Hugging Face LLaMA-family model folders
written with numpy alone (safetensors by hand: 8-byte header length, JSON
header, raw little-endian data), and what the test compares.

    hf_llama.py make NAME H K HEAD_DIM TIED QKV_BIAS   random parameters
        NAME.p.safetensors (llama_ref.py's names, F32), NAME.tok.bin (its
        tokens: B=2 sequences of T=8) and NAME.val.bin (the same tokens as
        a `dtrain data prepare` file: B*T+1 uint16 tokens, sequence b
        being tokens [bT, bT+T] and its targets one later)
    hf_llama.py shard FOLDER N      FOLDER/model.safetensors split into N
        files model-0000i-of-0000N.safetensors + model.safetensors.index.json
    hf_llama.py loss OUT / gen OUT  llama_ref.py's loss / greedy ids
    hf_llama.py same A B [TIED]     the tensors of HF folder A are B's: names,
        dtypes, shapes and bytes (a tied lm_head.weight in A may be absent in B)
    hf_llama.py params FOLDER OUT   HF folder FOLDER's tensors as llama_ref.py's
        --params file OUT (its names: no "model." prefix)
    hf_llama.py tokens N SEED OUT   N random tokens below the vocabulary as a
        `dtrain data prepare` file (training data)
    hf_llama.py torch FOLDER TOK N  (torch + transformers) the folder loaded
        with AutoModelForCausalLM: its loss on TOK's tokens and the greedy
        continuation of the first sequence by N tokens
"""
import json
import os
import struct
import sys

import numpy as np

V, C, INTER, L, B, T = 96, 32, 64, 2, 2, 8


def names(tied, qkv):
    sfx = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
           "self_attn.v_proj.weight"]
    if qkv:
        sfx += ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]
    sfx += ["self_attn.o_proj.weight", "post_attention_layernorm.weight",
            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    out = ["embed_tokens.weight"]
    out += ["layers.%d.%s" % (l, s) for l in range(L) for s in sfx]
    return out + ["norm.weight"] + ([] if tied else ["lm_head.weight"])


def shape(name, H, K, d):
    s = name.split(".", 2)[-1] if name.startswith("layers.") else name
    return {"embed_tokens.weight": (V, C), "norm.weight": (C,), "lm_head.weight": (V, C),
            "input_layernorm.weight": (C,), "post_attention_layernorm.weight": (C,),
            "self_attn.q_proj.weight": (H * d, C), "self_attn.q_proj.bias": (H * d,),
            "self_attn.k_proj.weight": (K * d, C), "self_attn.k_proj.bias": (K * d,),
            "self_attn.v_proj.weight": (K * d, C), "self_attn.v_proj.bias": (K * d,),
            "self_attn.o_proj.weight": (C, H * d), "mlp.gate_proj.weight": (INTER, C),
            "mlp.up_proj.weight": (INTER, C), "mlp.down_proj.weight": (C, INTER)}[s]


def write_st(path, tensors):
    header, chunks, off = {}, [], 0
    for name, dtype, shp, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shp), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def read_st(path):
    """[(name, dtype, shape, raw bytes)] in header order."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    hdr.pop("__metadata__", None)
    base = 8 + n
    return [(k, v["dtype"], v["shape"], blob[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in hdr.items()]


def read_folder(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        for name, dt, shp, raw in read_st(os.path.join(folder, f)):
            out[name] = (dt, shp, raw)
    return out


def make(name, H, K, d, tied, qkv):
    rng = np.random.default_rng(sum(map(ord, name)))
    p = []
    for n in names(tied, qkv):
        shp = shape(n, H, K, d)
        if n.endswith("norm.weight"):
            a = 1 + rng.uniform(-0.3, 0.3, shp)
        elif len(shp) == 1:
            a = rng.uniform(-0.3, 0.3, shp)
        else:
            a = rng.normal(0, 1 / np.sqrt(shp[1]), shp)
        a = a.astype("<f4")
        p.append((n, "F32", shp, a.tobytes()))
    write_st(name + ".p.safetensors", p)
    toks = rng.integers(0, V, B * T + 1)
    inp = toks[:-1].reshape(B, T)
    tgt = toks[1:].reshape(B, T)
    with open(name + ".tok.bin", "wb") as f:
        f.write(struct.pack("<ii", B, T) + inp.astype("<i4").tobytes() + tgt.astype("<i4").tobytes())
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    with open(name + ".val.bin", "wb") as f:
        f.write(hdr.tobytes() + toks.astype("<u2").tobytes())


def shard(folder, n):
    ts = read_st(os.path.join(folder, "model.safetensors"))
    os.remove(os.path.join(folder, "model.safetensors"))
    per = (len(ts) + n - 1) // n
    wmap, total = {}, 0
    for i in range(n):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        part = ts[i * per:(i + 1) * per]
        write_st(os.path.join(folder, fn), part)
        for t in part:
            wmap[t[0]] = fn
            total += len(t[3])
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2)


def ref_out(path):
    return {n: np.frombuffer(raw, dtype="<f8").reshape(shp) for n, dt, shp, raw in read_st(path)}


def same(a, b, tied):
    ta, tb = read_folder(a), read_folder(b)
    if tied == "1":
        ta.pop("lm_head.weight", None)
    for n in sorted(set(ta) | set(tb)):
        if n not in ta or n not in tb:
            sys.exit("tensor %s only in %s" % (n, a if n in ta else b))
        if ta[n] != tb[n]:
            sys.exit("tensor %s differs (%s %s vs %s %s)" % (n, ta[n][0], ta[n][1], tb[n][0], tb[n][1]))
    print("%d tensors equal" % len(ta))


def torch_check(folder, tok, n):
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    blob = open(tok, "rb").read()
    b, t = struct.unpack("<ii", blob[:8])
    a = np.frombuffer(blob[8:], dtype="<i4").astype(np.int64)
    inp, tgt = torch.tensor(a[:b * t].reshape(b, t)), torch.tensor(a[b * t:].reshape(b, t))
    with torch.no_grad():
        logits = m(inp).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(b * t, -1), tgt.reshape(-1))
        out = m.generate(inp[:1], max_new_tokens=n, do_sample=False, pad_token_id=0,
                         eos_token_id=None)
    print("%.17g" % loss.item())
    print(" ".join(str(int(x)) for x in out[0, t:].tolist()))


def params(folder, out):
    t = read_folder(folder)
    write_st(out, [(n[len("model."):] if n.startswith("model.") else n, dt, shp, raw)
                   for n, (dt, shp, raw) in sorted(t.items())])


def tokens(n, seed, out):
    toks = np.random.default_rng(seed).integers(0, V, n)
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    with open(out, "wb") as f:
        f.write(hdr.tobytes() + toks.astype("<u2").tobytes())


def main(argv):
    cmd = argv[1]
    if cmd == "make":
        make(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), int(argv[6]), int(argv[7]))
    elif cmd == "shard":
        shard(argv[2], int(argv[3]))
    elif cmd == "loss":
        print("%.17g" % ref_out(argv[2])["loss"][0])
    elif cmd == "gen":
        print(" ".join(str(int(x)) for x in ref_out(argv[2])["generated"]))
    elif cmd == "same":
        same(argv[2], argv[3], argv[4] if len(argv) > 4 else "0")
    elif cmd == "params":
        params(argv[2], argv[3])
    elif cmd == "tokens":
        tokens(int(argv[2]), int(argv[3]), argv[4])
    elif cmd == "torch":
        torch_check(argv[2], argv[3], int(argv[4]))
    else:
        sys.exit("unknown command %s" % cmd)


if __name__ == "__main__":
    main(sys.argv)
