#!/usr/bin/python3
"""Float64 numpy reference of dtrain's arch = "mlp" model (a bigram
Linear+GELU stack; core/engine/mlp.c): forward, mean cross-entropy loss and a
hand-written backward, used by tests/unit/test_mlp.c as an oracle.

    /usr/bin/python3 tests/reference/mlp_ref.py --params P.safetensors \
        --tokens T.bin --out O.safetensors --mlp-layers NL

Model (every position independently: a bigram model)
  x      = embed.weight[token]                     embed (V, D)
  x      = gelu(x @ fc.l.weight.T + fc.l.bias)     l = 0..NL-1, (H, in), (H)
  logits = x @ head.weight.T + head.bias           (V, W), (V); W = H, or D
                                                   when NL = 0
  loss   = mean over B*T of -log softmax(logits)[target]
GELU is the tanh approximation.

Files are those of gpt2_ref.py (whose safetensors / token I/O and layer
functions this script re-uses; they are checked by its self-check): params
F32 or F64 by name, all required and no others; T.bin int32 B, T, inputs,
targets; output all F64: "loss" [1], "logits" [B, T, V], "grad.<name>" for
every parameter in unit order.
Exit status: 0 on success, 1 on bad input (message on stderr), 2 on bad usage.
"""

import argparse
import math
import os
import sys

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_ref import (RefError, gelu_backward, gelu_forward,  # noqa: E402
                      linear_backward, linear_forward, load_safetensors,
                      load_tokens, save_safetensors)


def param_names(n_layers):
    """All parameter names in unit order."""
    names = ["embed.weight"]
    for l in range(n_layers):
        names += ["fc.%d.weight" % l, "fc.%d.bias" % l]
    return names + ["head.weight", "head.bias"]


def check_params(params, n_layers):
    """Validates names and shapes; returns (V, D, H)."""
    if n_layers < 0:
        raise RefError("--mlp-layers must be >= 0 (got %d)" % n_layers)
    names = param_names(n_layers)
    for name in names:
        if name not in params:
            raise RefError("missing tensor '%s' in params" % name)
    extra = sorted(set(params) - set(names))
    if extra:
        raise RefError("unexpected tensor '%s' in params (is --mlp-layers=%d "
                       "right?)" % (extra[0], n_layers))
    emb = params["embed.weight"]
    if emb.ndim != 2:
        raise RefError("tensor 'embed.weight': shape %s, expected (V, D)"
                       % (list(emb.shape),))
    V, D = emb.shape
    H = params["fc.0.weight"].shape[0] if n_layers else D
    want = {"embed.weight": (V, D), "head.weight": (V, H), "head.bias": (V,)}
    for l in range(n_layers):
        want["fc.%d.weight" % l] = (H, D if l == 0 else H)
        want["fc.%d.bias" % l] = (H,)
    for name in names:
        got = tuple(params[name].shape)
        if got != want[name]:
            raise RefError("tensor '%s': shape %s does not match expected %s"
                           % (name, list(got), list(want[name])))
    return V, D, H


def check_tokens(inputs, targets, V):
    for what, toks in (("input", inputs), ("target", targets)):
        bad = np.flatnonzero((toks < 0) | (toks >= V))
        if bad.size:
            i = int(bad[0])
            raise RefError("%s token %d at flat position %d out of range "
                           "[0, %d)" % (what, int(toks.flat[i]), i, V))


def forward(params, n_layers, inputs, targets):
    """Returns (loss, logits (B, T, V), cache for backward())."""
    x = params["embed.weight"][inputs]                   # (B, T, D)
    caches = []
    for l in range(n_layers):
        pre, c_lin = linear_forward(x, params["fc.%d.weight" % l],
                                    params["fc.%d.bias" % l])
        x, c_gelu = gelu_forward(pre)
        caches.append((c_lin, c_gelu))
    logits, c_head = linear_forward(x, params["head.weight"],
                                    params["head.bias"])
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    z = e.sum(axis=-1, keepdims=True)
    logp = logits - m - np.log(z)
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return float(nll.mean()), logits, (inputs, targets, caches, c_head, e / z)


def backward(params, n_layers, cache):
    """Returns {name: d(mean loss)/d(param)}."""
    inputs, targets, caches, c_head, probs = cache
    B, T = inputs.shape
    grads = {n: np.zeros_like(params[n]) for n in param_names(n_layers)}
    dlogits = probs.copy()
    bi, ti = np.meshgrid(np.arange(B), np.arange(T), indexing="ij")
    dlogits[bi, ti, targets] -= 1.0
    dlogits /= B * T
    dx, grads["head.weight"], grads["head.bias"] = linear_backward(dlogits,
                                                                   c_head)
    for l in reversed(range(n_layers)):
        c_lin, c_gelu = caches[l]
        dpre = gelu_backward(dx, c_gelu)
        dx, grads["fc.%d.weight" % l], grads["fc.%d.bias" % l] = \
            linear_backward(dpre, c_lin)
    np.add.at(grads["embed.weight"], inputs.reshape(-1),
              dx.reshape(-1, dx.shape[-1]))
    return grads


def run(params_path, tokens_path, out_path, n_layers):
    params = load_safetensors(params_path)
    V, _, _ = check_params(params, n_layers)
    inputs, targets = load_tokens(tokens_path)
    check_tokens(inputs, targets, V)
    loss, logits, cache = forward(params, n_layers, inputs, targets)
    if not math.isfinite(loss):
        raise RefError("loss is not finite (%r); check the parameters" % loss)
    grads = backward(params, n_layers, cache)
    out = [("loss", np.array([loss])), ("logits", logits)]
    out += [("grad." + n, grads[n]) for n in param_names(n_layers)]
    try:
        save_safetensors(out_path, out)
    except OSError as e:
        raise RefError("cannot write %s: %s" % (out_path, e.strerror))


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="float64 reference forward/backward of dtrain's mlp")
    ap.add_argument("--params", required=True, help="input .safetensors")
    ap.add_argument("--tokens", required=True, help="input T.bin (int32)")
    ap.add_argument("--out", required=True, help="output .safetensors (F64)")
    ap.add_argument("--mlp-layers", type=int, required=True)
    a = ap.parse_args(argv)
    try:
        run(a.params, a.tokens, a.out, a.mlp_layers)
    except RefError as e:
        print("mlp_ref: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
