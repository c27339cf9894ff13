#!/usr/bin/python3
"""Self-check of mlp_ref.py, the float64 oracle of dtrain's mlp model.

Builds a tiny random model (V=7, D=3, H=5, 2 hidden layers; B=2, T=3, and a
0-layer variant), runs mlp_ref.py as a subprocess as the C test does, and
checks:
  1. loss and logits against a naive pure-Python loop forward to 1e-12;
  2. every gradient entry against central finite differences of the float64
     loss (step 1e-6; pass if |g - fd| <= max(1e-6 |fd|, 1e-9), the bounds
     and reasoning of test_gpt2_ref_selfcheck.py);
  3. the output file's names, order, shapes and dtype;
  4. bad input exits with status 1 and a message naming the problem.

Run: /usr/bin/python3 tests/reference/test_mlp_ref_selfcheck.py
(tests/unit/plugins/mlp/test_mlp.c runs it before trusting the oracle.)
Exit status 0 when every check passes.  The fixtures are ref_common.py's,
shared with test_gpt2_ref_selfcheck.py.
"""

import math
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "mlp_ref.py")
sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, HERE)
import mlp_ref  # noqa: E402
import ref_common  # noqa: E402

V, D, H, B, T = 7, 3, 5, 2, 3
FWD_ATOL = 1e-12


def make_params(n_layers, seed=5):
    """Random float32-representable params, large enough that GELU is
    non-linear and the softmax is far from uniform."""
    rng = np.random.default_rng(seed)
    params = {"embed.weight": rng.standard_normal((V, D))}
    width = D
    for l in range(n_layers):
        params["fc.%d.weight" % l] = rng.standard_normal((H, width))
        params["fc.%d.bias" % l] = 0.5 * rng.standard_normal(H)
        width = H
    params["head.weight"] = rng.standard_normal((V, width))
    params["head.bias"] = 0.5 * rng.standard_normal(V)
    return {k: v.astype(np.float32).astype(np.float64)
            for k, v in params.items()}


def run_ref(d, p, t, n_layers):
    return ref_common.run_script(SCRIPT, d, p, t, ["--mlp-layers", n_layers])


def naive_forward(params, n_layers, inputs, targets):
    """Plain Python loops, sharing no code with mlp_ref's forward."""
    def gelu(u):
        return 0.5 * u * (1.0 + math.tanh(math.sqrt(2.0 / math.pi)
                                          * (u + 0.044715 * u ** 3)))

    def lin(x, W, b):
        return [sum(w * xi for w, xi in zip(row, x)) + bo
                for row, bo in zip(W.tolist(), b.tolist())]

    logits = np.zeros(inputs.shape + (V,))
    total = 0.0
    for b in range(inputs.shape[0]):
        for t in range(inputs.shape[1]):
            x = params["embed.weight"][inputs[b, t]].tolist()
            for l in range(n_layers):
                x = [gelu(u) for u in lin(x, params["fc.%d.weight" % l],
                                          params["fc.%d.bias" % l])]
            lg = lin(x, params["head.weight"], params["head.bias"])
            logits[b, t] = lg
            m = max(lg)
            total += m + math.log(sum(math.exp(g - m) for g in lg)) \
                - lg[targets[b, t]]
    return total / inputs.size, logits


class Ctx:
    def __init__(self, d, n_layers):
        self.d, self.n_layers = d, n_layers
        self.params = make_params(n_layers)
        self.names = mlp_ref.param_names(n_layers)
        rng = np.random.default_rng(11)
        self.inputs = rng.integers(0, V, size=(B, T))
        self.targets = rng.integers(0, V, size=(B, T))
        self.inputs[1, 2] = self.inputs[0, 0]  # a repeated embedding row
        self.p_path = os.path.join(d, "P%d.safetensors" % n_layers)
        self.t_path = os.path.join(d, "T.bin")
        ref_common.write_params(self.p_path, self.params, self.names)
        ref_common.write_tokens(self.t_path, self.inputs, self.targets)
        r, out = run_ref(d, self.p_path, self.t_path, n_layers)
        if r.returncode != 0:
            raise AssertionError("mlp_ref.py failed (%d): %s"
                                 % (r.returncode, r.stderr))
        _, _, self.header, self.out = ref_common.read_out(out)


def check_forward_vs_naive(ctx):
    loss, logits = naive_forward(ctx.params, ctx.n_layers, ctx.inputs,
                                 ctx.targets)
    got = ctx.out["loss"][0]
    assert abs(got - loss) <= FWD_ATOL, "loss %.17g vs naive %.17g" % (
        got, loss)
    err = np.max(np.abs(ctx.out["logits"] - logits))
    assert err <= FWD_ATOL, "logits max abs diff %.3g" % err
    assert abs(loss - math.log(V)) > 0.05, "loss %.6f ~ log(V)" % loss


def check_grads_vs_fd(ctx):
    params = {k: v.copy() for k, v in ctx.params.items()}

    def loss_of():
        return mlp_ref.forward(params, ctx.n_layers, ctx.inputs,
                               ctx.targets)[0]

    n, _ = ref_common.check_grads_fd(ctx.out, params, ctx.names, loss_of)
    print("  %d layers: %d gradient entries checked" % (ctx.n_layers, n))


def check_output_format(ctx):
    names = ["loss", "logits"] + ["grad." + n for n in ctx.names]
    assert list(ctx.header) == names, "names/order: %s" % list(ctx.header)
    assert ctx.header["logits"]["shape"] == [B, T, V]
    for n in names:
        assert ctx.header[n]["dtype"] == "F64", n
    for n in ctx.names:
        assert ctx.header["grad." + n]["shape"] == list(ctx.params[n].shape)


def check_bad_input(ctx):
    d = ctx.d
    bad_p, bad_t = os.path.join(d, "bad.safetensors"), os.path.join(d, "b.bin")

    def expect(p, t, needle, n_layers=ctx.n_layers):
        ref_common.expect_error(lambda: run_ref(d, p, t, n_layers), needle)

    ref_common.write_params(bad_p, ctx.params, ctx.names, drop="fc.1.bias")
    expect(bad_p, ctx.t_path, "missing tensor 'fc.1.bias'")
    ref_common.write_params(bad_p, ctx.params, ctx.names,
                            reshape=("fc.1.weight", (1, 25)))
    expect(bad_p, ctx.t_path,
           "tensor 'fc.1.weight': shape [1, 25] does not match expected [5, 5]")
    expect(ctx.p_path, ctx.t_path, "unexpected tensor 'fc.1.bias'", 1)
    bad_in = ctx.targets.copy()
    bad_in[0, 1] = V
    ref_common.write_tokens(bad_t, ctx.inputs, bad_in)
    expect(ctx.p_path, bad_t,
           "target token 7 at flat position 1 out of range [0, 7)")


def main():
    full = [check_forward_vs_naive, check_grads_vs_fd, check_output_format,
            check_bad_input]
    with tempfile.TemporaryDirectory(prefix="mlp_ref_") as d:
        return ref_common.run_checks("mlp_ref", [
            (" (2 layers)", lambda: Ctx(d, 2), full),
            (" (0 layers)", lambda: Ctx(d, 0),
             [check_forward_vs_naive, check_grads_vs_fd])])


if __name__ == "__main__":
    sys.exit(main())
