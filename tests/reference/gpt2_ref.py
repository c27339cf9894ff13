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
"""

import argparse
import json
import math
import struct
import sys

import numpy as np

LN_EPS = 1e-5
GELU_SCALE = math.sqrt(2.0 / math.pi)

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

_ST_DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8")}


class RefError(Exception):
    """Bad input; the message is printed and the program exits with 1."""


# --------------------------------------------------------------------------
# safetensors I/O

def load_safetensors(path):
    """Returns {name: float64 ndarray} from a safetensors file.

    Checks the header thoroughly because a malformed file written by the C
    side should fail loudly here rather than produce a misleading oracle."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise RefError("cannot read %s: %s" % (path, e.strerror))
    if len(blob) < 8:
        raise RefError("%s: file too short for a safetensors header (%d bytes)"
                       % (path, len(blob)))
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        raise RefError("%s: header length %d exceeds file size %d"
                       % (path, hlen, len(blob)))
    try:
        header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RefError("%s: header is not valid JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise RefError("%s: header is not a JSON object" % path)
    data = memoryview(blob)[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_s = info["dtype"]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise RefError("%s: tensor '%s': header entry needs dtype, shape "
                           "and data_offsets" % (path, name))
        if dtype_s not in _ST_DTYPES:
            raise RefError("%s: tensor '%s': dtype %s not supported (F32 or "
                           "F64 expected)" % (path, name, dtype_s))
        dt = _ST_DTYPES[dtype_s]
        n = 1
        for d in shape:
            if d < 0:
                raise RefError("%s: tensor '%s': negative dimension in shape "
                               "%s" % (path, name, shape))
            n *= d
        if not (0 <= begin <= end <= len(data)):
            raise RefError("%s: tensor '%s': data_offsets [%d, %d] outside "
                           "data of %d bytes" % (path, name, begin, end,
                                                 len(data)))
        if end - begin != n * dt.itemsize:
            raise RefError("%s: tensor '%s': %d bytes for shape %s of %s "
                           "(expected %d)" % (path, name, end - begin, shape,
                                              dtype_s, n * dt.itemsize))
        arr = np.frombuffer(data[begin:end], dtype=dt).astype(np.float64)
        out[name] = arr.reshape(shape)
    return out


def save_safetensors(path, tensors):
    """Writes [(name, ndarray)] as little-endian F64 safetensors, in order.

    The header is padded with spaces so the data starts 8-byte aligned, as
    the format requires."""
    header = {}
    chunks = []
    offset = 0
    for name, arr in tensors:
        a = np.ascontiguousarray(arr, dtype="<f8")
        raw = a.tobytes()
        header[name] = {"dtype": "F64", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)


def load_tokens(path):
    """Returns (inputs, targets), each an int64 (B, T) array, from T.bin."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise RefError("cannot read %s: %s" % (path, e.strerror))
    if len(blob) < 8:
        raise RefError("%s: too short for the B, T header (%d bytes)"
                       % (path, len(blob)))
    B, T = struct.unpack("<ii", blob[:8])
    if B <= 0 or T <= 0:
        raise RefError("%s: B=%d, T=%d must both be positive" % (path, B, T))
    want = 8 + 2 * B * T * 4
    if len(blob) != want:
        raise RefError("%s: %d bytes, expected %d for B=%d, T=%d (header + "
                       "inputs + targets as int32)" % (path, len(blob), want,
                                                       B, T))
    toks = np.frombuffer(blob[8:], dtype="<i4").astype(np.int64)
    return toks[:B * T].reshape(B, T), toks[B * T:].reshape(B, T)


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
    names = param_names(n_layer)
    for name in names:
        if name not in params:
            raise RefError("missing tensor '%s' in params" % name)
    extra = sorted(set(params) - set(names))
    if extra:
        raise RefError("unexpected tensor '%s' in params (is --n-layer=%d "
                       "right?)" % (extra[0], n_layer))
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
    for name, want in param_shapes(n_layer, V, C, maxT).items():
        got = tuple(params[name].shape)
        if got != want:
            raise RefError("tensor '%s': shape %s does not match expected %s"
                           % (name, list(got), list(want)))
    return V, C, maxT


def check_tokens(inputs, targets, V, maxT):
    T = inputs.shape[1]
    if T > maxT:
        raise RefError("sequence length T=%d exceeds wpe rows maxT=%d"
                       % (T, maxT))
    for what, toks in (("input", inputs), ("target", targets)):
        bad = np.flatnonzero((toks < 0) | (toks >= V))
        if bad.size:
            i = int(bad[0])
            raise RefError("%s token %d at flat position %d out of range "
                           "[0, %d)" % (what, int(toks.flat[i]), i, V))


# --------------------------------------------------------------------------
# layers: <op>_forward returns (out, cache); <op>_backward returns input grads
# and adds parameter grads into the dict it is given.

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


def linear_forward(x, w, b):
    """x (..., in), w (out, in), b (out) -> (..., out)."""
    return x @ w.T + b, (x, w)


def linear_backward(dout, cache):
    """Returns (dx, dw, db)."""
    x, w = cache
    x2 = x.reshape(-1, x.shape[-1])
    d2 = dout.reshape(-1, dout.shape[-1])
    return dout @ w, d2.T @ x2, d2.sum(axis=0)


def gelu_forward(x):
    """tanh approximation, as in GPT-2 / llm.c."""
    t = np.tanh(GELU_SCALE * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1.0 + t), (x, t)


def gelu_backward(dout, cache):
    x, t = cache
    du = GELU_SCALE * (1.0 + 3.0 * 0.044715 * x * x)
    return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


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
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    z = e.sum(axis=-1, keepdims=True)
    logp = logits - m - np.log(z)
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    loss = float(nll.mean())
    probs = e / z
    return loss, logits, (inputs, targets, block_caches, c_lnf, lnf, probs)


def backward(params, n_layer, cache):
    """Returns {name: d(mean loss)/d(param)} for every parameter."""
    inputs, targets, block_caches, c_lnf, lnf, probs = cache
    B, T = inputs.shape
    wte = params["wte.weight"]
    grads = {n: np.zeros_like(params[n]) for n in param_names(n_layer)}

    dlogits = probs.copy()
    bi, ti = np.meshgrid(np.arange(B), np.arange(T), indexing="ij")
    dlogits[bi, ti, targets] -= 1.0
    dlogits /= B * T
    # tied LM head: first contribution to wte
    grads["wte.weight"] += dlogits.reshape(-1, wte.shape[0]).T @ \
        lnf.reshape(-1, lnf.shape[-1])
    dlnf = dlogits @ wte
    dx, dw, db = layernorm_backward(dlnf, c_lnf)
    grads["ln_f.weight"] += dw
    grads["ln_f.bias"] += db

    for l in reversed(range(n_layer)):
        (c_ln1, c_qkv, c_att, c_proj, c_ln2, c_fc, c_gelu,
         c_fcp) = block_caches[l]
        pre = "h.%d." % l
        # x3 = x2 + fcproj
        dx2 = dx.copy()
        dg, dw, db = linear_backward(dx, c_fcp)
        grads[pre + "mlp.c_proj.weight"] += dw
        grads[pre + "mlp.c_proj.bias"] += db
        dfc = gelu_backward(dg, c_gelu)
        dln2, dw, db = linear_backward(dfc, c_fc)
        grads[pre + "mlp.c_fc.weight"] += dw
        grads[pre + "mlp.c_fc.bias"] += db
        d, dw, db = layernorm_backward(dln2, c_ln2)
        grads[pre + "ln_2.weight"] += dw
        grads[pre + "ln_2.bias"] += db
        dx2 += d
        # x2 = x + attproj
        dxin = dx2.copy()
        datt, dw, db = linear_backward(dx2, c_proj)
        grads[pre + "attn.c_proj.weight"] += dw
        grads[pre + "attn.c_proj.bias"] += db
        dqkv = attention_backward(datt, c_att)
        dln1, dw, db = linear_backward(dqkv, c_qkv)
        grads[pre + "attn.c_attn.weight"] += dw
        grads[pre + "attn.c_attn.bias"] += db
        d, dw, db = layernorm_backward(dln1, c_ln1)
        grads[pre + "ln_1.weight"] += dw
        grads[pre + "ln_1.bias"] += db
        dx = dxin + d

    # embedding: second contribution to wte (rows may repeat, hence add.at)
    np.add.at(grads["wte.weight"], inputs.reshape(-1),
              dx.reshape(-1, dx.shape[-1]))
    grads["wpe.weight"][:T] += dx.sum(axis=0)
    return grads


def run(params_path, tokens_path, out_path, n_layer, n_head):
    params = load_safetensors(params_path)
    V, C, maxT = check_params(params, n_layer, n_head)
    inputs, targets = load_tokens(tokens_path)
    check_tokens(inputs, targets, V, maxT)
    loss, logits, cache = forward(params, n_layer, n_head, inputs, targets)
    if not math.isfinite(loss):
        raise RefError("loss is not finite (%r); check the parameters"
                       % loss)
    grads = backward(params, n_layer, cache)
    out = [("loss", np.array([loss])), ("logits", logits)]
    out += [("grad." + n, grads[n]) for n in param_names(n_layer)]
    try:
        save_safetensors(out_path, out)
    except OSError as e:
        raise RefError("cannot write %s: %s" % (out_path, e.strerror))


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="float64 reference forward/backward of dtrain's GPT-2")
    ap.add_argument("--params", required=True, help="input .safetensors")
    ap.add_argument("--tokens", required=True, help="input T.bin (int32)")
    ap.add_argument("--out", required=True, help="output .safetensors (F64)")
    ap.add_argument("--n-layer", type=int, required=True)
    ap.add_argument("--n-head", type=int, required=True)
    a = ap.parse_args(argv)
    try:
        run(a.params, a.tokens, a.out, a.n_layer, a.n_head)
    except RefError as e:
        print("gpt2_ref: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
