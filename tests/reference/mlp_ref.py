#!/usr/bin/python3
"""Float64 numpy reference of dtrain's arch = "mlp" model (a bigram
Linear+GELU stack; plugins/mlp/mlp.c): forward, mean cross-entropy loss and a
hand-written backward, used by tests/unit/plugins/mlp/test_mlp.c as an oracle.

    /usr/bin/python3 tests/reference/mlp_ref.py --params P.safetensors \
        --tokens T.bin --out O.safetensors --mlp-layers NL

Model (every position independently: a bigram model)
  x      = embed.weight[token]                     embed (V, D)
  x      = gelu(x @ fc.l.weight.T + fc.l.bias)     l = 0..NL-1, (H, in), (H)
  logits = x @ head.weight.T + head.bias           (V, W), (V); W = H, or D
                                                   when NL = 0
  loss   = mean over B*T of -log softmax(logits)[target]
GELU is the tanh approximation.

Files are those of gpt2_ref.py (both take their safetensors / token I/O,
input checks, layer functions and command line from ref_common.py): params
F32 or F64 by name, all required and no others; T.bin int32 B, T, inputs,
targets; output all F64: "loss" [1], "logits" [B, T, V], "grad.<name>" for
every parameter in unit order.
Exit status: 0 on success, 1 on bad input (message on stderr), 2 on bad usage.
"""

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
                        write_result)


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
    check_names(params, names, "--mlp-layers=%d" % n_layers)
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
    check_shapes(params, {name: want[name] for name in names})
    return V, D, H


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
    loss, probs = cross_entropy_forward(logits, targets)
    return loss, logits, (inputs, targets, caches, c_head, probs)


def backward(params, n_layers, cache):
    """Returns {name: d(mean loss)/d(param)}."""
    inputs, targets, caches, c_head, probs = cache
    grads = {n: np.zeros_like(params[n]) for n in param_names(n_layers)}
    dlogits = cross_entropy_backward(probs, targets)
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
    check_token_range(inputs, targets, V)
    loss, logits, cache = forward(params, n_layers, inputs, targets)
    check_loss(loss)
    grads = backward(params, n_layers, cache)
    write_result(out_path, loss, logits, grads, param_names(n_layers))


def main(argv=None):
    return ref_common.main(
        "mlp_ref", "float64 reference forward/backward of dtrain's mlp",
        [("--mlp-layers", None)], run, argv)


if __name__ == "__main__":
    sys.exit(main())
