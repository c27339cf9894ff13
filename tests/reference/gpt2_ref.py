#!/usr/bin/python3
"""Float64 numpy reference of dtrain's GPT-2 (forward, loss and hand-written
backward), used by the C tests as an oracle.

It is deliberately independent of the C engine: it reads parameters and tokens
from files, computes everything in float64 and writes the loss, the logits and
the gradient of the mean loss w.r.t. every parameter to a safetensors file.

    /usr/bin/python3 tests/reference/gpt2_ref.py --params P.safetensors \
        --tokens T.bin --out O.safetensors --n-layer L --n-head H

Inputs
  P.safetensors  "F32" (or "F64") tensors named as in HF GPT-2 (wte.weight,
                 wpe.weight, h.<l>.ln_1.weight, ..., ln_f.bias), in dtrain's
                 layout: linear weights (out, in) row-major, y = x @ W.T + b;
                 wte (V, C); wpe (maxT, C).  Every name must be present and no
                 other name may be (a stray tensor usually means a wrong
                 --n-layer).  "__metadata__" is ignored.
  T.bin          little-endian int32: B, T, B*T input tokens, B*T targets.
Output (all "F64", little-endian)
  "loss"                 shape [1]: mean cross-entropy over all B*T positions
  "logits"               shape [B, T, V]
  "grad.<param name>"    the parameter's shape, d(mean loss)/d(param); the
                         tied wte gets both the LM-head and embedding parts.
Exit status: 0 on success, 1 on bad input (message on stderr), 2 on bad usage.

Only the standard library and numpy are used (no autograd), so the backward is
an independent derivation that the self-check verifies by finite differences.
File I/O, the input checks, linear, GELU and the cross-entropy are
ref_common.py's (shared with mlp_ref.py).
"""

import json
import math
import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_common  # noqa: E402
from ref_common import (RefError, check_loss, check_names,  # noqa: E402
                        check_shapes, check_token_range,
                        cross_entropy_backward, cross_entropy_forward,
                        gelu_backward, gelu_forward, linear_backward,
                        linear_forward, load_safetensors, load_tokens,
                        save_safetensors, write_result)

LN_EPS = 1e-5

# Per-block tensor suffixes in the contract's unit order; the shape is filled
# in from C by block_shapes().
BLOCK_SUFFIXES = (
    "ln_1.weight", "ln_1.bias",
    "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias",
)

# --------------------------------------------------------------------------
# model description

def param_names(n_layer):
    """All parameter names in the contract's unit order."""
    names = ["wte.weight", "wpe.weight"]
    for l in range(n_layer):
        names += ["h.%d.%s" % (l, s) for s in BLOCK_SUFFIXES]
    return names + ["ln_f.weight", "ln_f.bias"]


def param_shapes(n_layer, V, C, maxT):
    """{name: expected shape tuple} for the given sizes."""
    per_block = {
        "ln_1.weight": (C,), "ln_1.bias": (C,),
        "attn.c_attn.weight": (3 * C, C), "attn.c_attn.bias": (3 * C,),
        "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
        "ln_2.weight": (C,), "ln_2.bias": (C,),
        "mlp.c_fc.weight": (4 * C, C), "mlp.c_fc.bias": (4 * C,),
        "mlp.c_proj.weight": (C, 4 * C), "mlp.c_proj.bias": (C,),
    }
    shapes = {"wte.weight": (V, C), "wpe.weight": (maxT, C)}
    for l in range(n_layer):
        for s in BLOCK_SUFFIXES:
            shapes["h.%d.%s" % (l, s)] = per_block[s]
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)
    return shapes


def check_params(params, n_layer, n_head):
    """Validates names and shapes; returns (V, C, maxT)."""
    if n_layer < 1:
        raise RefError("--n-layer must be >= 1 (got %d)" % n_layer)
    if n_head < 1:
        raise RefError("--n-head must be >= 1 (got %d)" % n_head)
    check_names(params, param_names(n_layer), "--n-layer=%d" % n_layer)
    wte, wpe = params["wte.weight"], params["wpe.weight"]
    if wte.ndim != 2:
        raise RefError("tensor 'wte.weight': shape %s, expected (V, C)"
                       % (list(wte.shape),))
    V, C = wte.shape
    if wpe.ndim != 2:
        raise RefError("tensor 'wpe.weight': shape %s, expected (maxT, %d)"
                       % (list(wpe.shape), C))
    maxT = wpe.shape[0]
    if C % n_head != 0:
        raise RefError("channels C=%d not divisible by --n-head=%d"
                       % (C, n_head))
    check_shapes(params, param_shapes(n_layer, V, C, maxT))
    return V, C, maxT


def check_tokens(inputs, targets, V, maxT):
    T = inputs.shape[1]
    if T > maxT:
        raise RefError("sequence length T=%d exceeds wpe rows maxT=%d"
                       % (T, maxT))
    check_token_range(inputs, targets, V)


# --------------------------------------------------------------------------
# layers GPT-2 adds to ref_common's (linear, GELU): <op>_forward returns
# (out, cache); <op>_backward returns the input gradient (and the
# parameters').

def layernorm_forward(x, w, b):
    """x (..., C) -> (..., C); biased variance, eps LN_EPS."""
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    xhat = xc * rstd
    return xhat * w + b, (xhat, rstd, w)


def layernorm_backward(dout, cache):
    """Returns (dx, dw, db)."""
    xhat, rstd, w = cache
    lead = tuple(range(dout.ndim - 1))
    dw = (dout * xhat).sum(axis=lead)
    db = dout.sum(axis=lead)
    dxhat = dout * w
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dw, db


def attention_forward(qkv, n_head):
    """qkv (B, T, 3C) laid out [q | k | v], head h at columns h*hs..(h+1)*hs
    of each -> (B, T, C)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // n_head
    scale = 1.0 / math.sqrt(hs)

    def heads(m):  # (B, T, C) -> (B, H, T, hs)
        return m.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3)

    q, k, v = heads(qkv[..., :C]), heads(qkv[..., C:2 * C]), \
        heads(qkv[..., 2 * C:])
    s = (q @ k.transpose(0, 1, 3, 2)) * scale          # (B, H, T, T)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    s = np.where(future, -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    y = p @ v                                           # (B, H, T, hs)
    out = y.transpose(0, 2, 1, 3).reshape(B, T, C)
    return out, (q, k, v, p, scale)


def attention_backward(dout, cache):
    """Returns dqkv (B, T, 3C)."""
    q, k, v, p, scale = cache
    B, H, T, hs = q.shape
    dy = dout.reshape(B, T, H, hs).transpose(0, 2, 1, 3)
    dv = p.transpose(0, 1, 3, 2) @ dy
    dp = dy @ v.transpose(0, 1, 3, 2)
    # softmax Jacobian; masked entries have p == 0 so they get no gradient
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq = ds @ k
    dk = ds.transpose(0, 1, 3, 2) @ q

    def merge(m):  # (B, H, T, hs) -> (B, T, C)
        return m.transpose(0, 2, 1, 3).reshape(B, T, H * hs)

    return np.concatenate([merge(dq), merge(dk), merge(dv)], axis=-1)


# --------------------------------------------------------------------------
# model

def forward(params, n_layer, n_head, inputs, targets):
    """Returns (loss, logits (B, T, V), cache for backward())."""
    B, T = inputs.shape
    wte = params["wte.weight"]
    x = wte[inputs] + params["wpe.weight"][:T]          # (B, T, C)
    block_caches = []
    for l in range(n_layer):
        p = lambda s: params["h.%d.%s" % (l, s)]        # noqa: E731
        ln1, c_ln1 = layernorm_forward(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv, c_qkv = linear_forward(ln1, p("attn.c_attn.weight"),
                                    p("attn.c_attn.bias"))
        att, c_att = attention_forward(qkv, n_head)
        proj, c_proj = linear_forward(att, p("attn.c_proj.weight"),
                                      p("attn.c_proj.bias"))
        x2 = x + proj
        ln2, c_ln2 = layernorm_forward(x2, p("ln_2.weight"), p("ln_2.bias"))
        fc, c_fc = linear_forward(ln2, p("mlp.c_fc.weight"),
                                  p("mlp.c_fc.bias"))
        g, c_gelu = gelu_forward(fc)
        fcp, c_fcp = linear_forward(g, p("mlp.c_proj.weight"),
                                    p("mlp.c_proj.bias"))
        x = x2 + fcp
        block_caches.append((c_ln1, c_qkv, c_att, c_proj, c_ln2, c_fc,
                             c_gelu, c_fcp))
    lnf, c_lnf = layernorm_forward(x, params["ln_f.weight"],
                                   params["ln_f.bias"])
    logits = lnf @ wte.T                                # (B, T, V)
    loss, probs = cross_entropy_forward(logits, targets)
    return loss, logits, (inputs, targets, block_caches, c_lnf, lnf, probs)


def add_grads(grads, name, result):
    """result: a layer backward's (dx, dw, db); adds dw and db into
    grads["<name>.weight"] and grads["<name>.bias"]; returns dx."""
    dx, dw, db = result
    grads[name + ".weight"] += dw
    grads[name + ".bias"] += db
    return dx


def backward(params, n_layer, cache):
    """Returns {name: d(mean loss)/d(param)} for every parameter."""
    inputs, targets, block_caches, c_lnf, lnf, probs = cache
    T = inputs.shape[1]
    wte = params["wte.weight"]
    grads = {n: np.zeros_like(params[n]) for n in param_names(n_layer)}

    dlogits = cross_entropy_backward(probs, targets)
    # tied LM head: first contribution to wte
    grads["wte.weight"] += dlogits.reshape(-1, wte.shape[0]).T @ \
        lnf.reshape(-1, lnf.shape[-1])
    dlnf = dlogits @ wte
    dx = add_grads(grads, "ln_f", layernorm_backward(dlnf, c_lnf))

    for l in reversed(range(n_layer)):
        (c_ln1, c_qkv, c_att, c_proj, c_ln2, c_fc, c_gelu,
         c_fcp) = block_caches[l]
        pre = "h.%d." % l
        # x3 = x2 + fcproj
        dx2 = dx.copy()
        dg = add_grads(grads, pre + "mlp.c_proj", linear_backward(dx, c_fcp))
        dfc = gelu_backward(dg, c_gelu)
        dln2 = add_grads(grads, pre + "mlp.c_fc", linear_backward(dfc, c_fc))
        dx2 += add_grads(grads, pre + "ln_2", layernorm_backward(dln2, c_ln2))
        # x2 = x + attproj
        dxin = dx2.copy()
        datt = add_grads(grads, pre + "attn.c_proj",
                         linear_backward(dx2, c_proj))
        dqkv = attention_backward(datt, c_att)
        dln1 = add_grads(grads, pre + "attn.c_attn",
                         linear_backward(dqkv, c_qkv))
        dx = dxin + add_grads(grads, pre + "ln_1",
                              layernorm_backward(dln1, c_ln1))

    # embedding: second contribution to wte (rows may repeat, hence add.at)
    np.add.at(grads["wte.weight"], inputs.reshape(-1),
              dx.reshape(-1, dx.shape[-1]))
    grads["wpe.weight"][:T] += dx.sum(axis=0)
    return grads


# --------------------------------------------------------------------------
# after training: greedy generation and Hugging Face's layout

def greedy(params, n_layer, n_head, prompt, n):
    """The greedy continuation of `prompt` (1-D ids) by n tokens, each step
    a full forward of the sequence so far (no cache); returns (ids,
    margins), margins[i] the gap between the two largest logits at step i
    (how far float32 rounding is from changing the choice)."""
    seq = [int(t) for t in prompt]
    ids, margins = [], []
    for _ in range(n):
        x = np.array([seq], dtype=np.int64)
        _, logits, _ = forward(params, n_layer, n_head, x, np.zeros_like(x))
        last = logits[0, -1]
        top2 = np.sort(last)[-2:]
        nxt = int(np.argmax(last))
        ids.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        seq.append(nxt)
    return np.array(ids, dtype=np.float64), np.array(margins)


# Hugging Face's GPT-2 keeps these as Conv1D, weight (in, out): the
# transpose of dtrain's (out, in).
HF_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
             "mlp.c_proj.weight")


def write_hf(params, n_layer, n_head, folder):
    """folder/model.safetensors (F32) and folder/config.json as Hugging
    Face's GPT2LMHeadModel saves them: Conv1D weights transposed, each
    block's attn.bias causal-mask buffer (1, 1, maxT, maxT) and the older
    attn.masked_bias beside the weights, the LM head tied to wte (so not
    stored)."""
    V, C = params["wte.weight"].shape
    maxT = params["wpe.weight"].shape[0]
    out = []
    for name in param_names(n_layer):
        a = params[name]
        out.append((name, a.T if name.endswith(HF_CONV1D) else a))
    mask = np.tril(np.ones((maxT, maxT))).reshape(1, 1, maxT, maxT)
    for l in range(n_layer):
        out.append(("h.%d.attn.bias" % l, mask))
        out.append(("h.%d.attn.masked_bias" % l, np.array(-1e4)))
    os.makedirs(folder, exist_ok=True)
    save_safetensors(os.path.join(folder, "model.safetensors"), out, "F32")
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
           "n_layer": n_layer, "n_head": n_head, "n_embd": C, "vocab_size": V,
           "n_positions": maxT, "n_ctx": maxT, "layer_norm_epsilon": LN_EPS,
           "activation_function": "gelu_new", "tie_word_embeddings": True}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def run(params_path, tokens_path, out_path, n_layer, n_head, generate=0,
        write_hf_to=None):
    params = load_safetensors(params_path)
    V, C, maxT = check_params(params, n_layer, n_head)
    inputs, targets = load_tokens(tokens_path)
    check_tokens(inputs, targets, V, maxT)
    loss, logits, cache = forward(params, n_layer, n_head, inputs, targets)
    check_loss(loss)
    grads = backward(params, n_layer, cache)
    extra = []
    if generate:
        if inputs.shape[1] + generate > maxT:
            raise RefError("--generate %d after %d prompt tokens exceeds maxT=%d"
                           % (generate, inputs.shape[1], maxT))
        ids, margins = greedy(params, n_layer, n_head, inputs[0], generate)
        extra = [("generated", ids), ("margin", margins)]
    if write_hf_to:
        write_hf(params, n_layer, n_head, write_hf_to)
    write_result(out_path, loss, logits, grads, param_names(n_layer), extra)


def main(argv=None):
    return ref_common.main(
        "gpt2_ref", "float64 reference forward/backward of dtrain's GPT-2",
        [("--n-layer", None), ("--n-head", None)], run, argv,
        [("--generate", int, 0, "also the greedy continuation of the first "
          "sequence's inputs by N tokens: outputs 'generated' and 'margin'"),
         ("--write-hf-to", str, None, "also write the parameters as Hugging "
          "Face saves a GPT-2: FOLDER/model.safetensors and config.json")])


if __name__ == "__main__":
    sys.exit(main())
