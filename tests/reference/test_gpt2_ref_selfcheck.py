#!/usr/bin/python3
"""Self-check of gpt2_ref.py, the float64 GPT-2 oracle the C tests trust.

Builds a tiny random model, runs gpt2_ref.py as a subprocess exactly as the C
tests do, and checks:
  1. loss and logits against a naive pure-Python forward (explicit loops,
     attention position by position) to 1e-12;
  2. every gradient entry of every tensor against central finite differences
     of the float64 loss;
  3. the output file's format (F64, names, shapes, 8-byte aligned header);
  4. bad input exits with status 1 and a message naming the problem.

Run: /usr/bin/python3 tests/reference/test_gpt2_ref_selfcheck.py
Exit status 0 when every check passes.  The fixtures (the F32 writer,
running the oracle, finite differences, the PASS/FAIL driver) are
ref_common.py's, shared with test_mlp_ref_selfcheck.py.
"""

import json
import math
import os
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "gpt2_ref.py")
sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, HERE)
import gpt2_ref  # noqa: E402
import ref_common  # noqa: E402

V, C, H, L, MAXT, B, T = 11, 8, 2, 2, 6, 2, 5

# Forward vs naive: both are float64 evaluations of the same formula in a
# different order, so they agree to a few ulps; 1e-12 absolute leaves ~1e3
# ulps of slack on values of order 1-10.  Finite differences: ref_common's
# FD_* (central, step 1e-6, |analytic - fd| <= max(1e-6 |fd|, 1e-9)).
FWD_ATOL = 1e-12


# --------------------------------------------------------------------------
# fixtures

def make_params(seed=1234):
    """Random float32-representable params (as float64), no zero entries.

    Std is far larger than the 0.02 init so attention is peaked, GELU is
    non-linear and LN weights are not 1: an error in any derivative term
    shows in the gradient."""
    rng = np.random.default_rng(seed)
    shapes = gpt2_ref.param_shapes(L, V, C, MAXT)
    params = {}
    for name in gpt2_ref.param_names(L):
        shape = shapes[name]
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            a = 1.0 + 0.3 * rng.standard_normal(shape)
        elif len(shape) == 1:
            a = 0.2 * rng.standard_normal(shape)
        else:
            a = 0.4 * rng.standard_normal(shape)
        a = np.where(np.abs(a) < 1e-3, 1e-3, a)  # keep every entry non-zero
        params[name] = a.astype(np.float32).astype(np.float64)
    return params


def make_tokens(seed=99):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, V, size=(B, T))
    targets = rng.integers(0, V, size=(B, T))
    inputs[1, 3] = inputs[0, 1]  # a repeated token exercises wte row sums
    return inputs, targets


def write_params(path, params, drop=None, reshape=None):
    """F32 safetensors in the dtrain layout, with a __metadata__ key (which
    the reader must ignore)."""
    ref_common.write_params(path, params, gpt2_ref.param_names(L), drop,
                            reshape, metadata={"format": "pt"})


def run_ref(d, params_path, tokens_path, n_layer=L, n_head=H):
    return ref_common.run_script(SCRIPT, d, params_path, tokens_path,
                                 ["--n-layer", n_layer, "--n-head", n_head])


# --------------------------------------------------------------------------
# naive forward: plain Python floats and loops, sharing no code with
# gpt2_ref's vectorized forward.

def naive_forward(params, inputs, targets):
    def P(name):
        return params[name].tolist()

    def ln(x, w, b):
        mu = sum(x) / len(x)
        var = sum((xi - mu) ** 2 for xi in x) / len(x)
        r = 1.0 / math.sqrt(var + 1e-5)
        return [(xi - mu) * r * wi + bi for xi, wi, bi in zip(x, w, b)]

    def lin(x, W, bias):
        return [sum(wi * xi for wi, xi in zip(row, x)) + bo
                for row, bo in zip(W, bias)]

    def gelu(u):
        return 0.5 * u * (1.0 + math.tanh(math.sqrt(2.0 / math.pi)
                                          * (u + 0.044715 * u ** 3)))

    wte, wpe = P("wte.weight"), P("wpe.weight")
    hs = C // H
    nb, nt = inputs.shape
    logits = np.zeros((nb, nt, V))
    total = 0.0
    for b in range(nb):
        xs = [[wte[inputs[b, t]][c] + wpe[t][c] for c in range(C)]
              for t in range(nt)]
        for l in range(L):
            def p(s):
                return P("h.%d.%s" % (l, s))
            qkv = [lin(ln(x, p("ln_1.weight"), p("ln_1.bias")),
                       p("attn.c_attn.weight"), p("attn.c_attn.bias"))
                   for x in xs]
            att = [[0.0] * C for _ in range(nt)]
            for h in range(H):
                for t in range(nt):
                    q = qkv[t][h * hs:(h + 1) * hs]
                    scores = []
                    for s in range(t + 1):
                        k = qkv[s][C + h * hs:C + (h + 1) * hs]
                        scores.append(sum(a * bb for a, bb in zip(q, k))
                                      / math.sqrt(hs))
                    m = max(scores)
                    e = [math.exp(sc - m) for sc in scores]
                    z = sum(e)
                    for i in range(hs):
                        att[t][h * hs + i] = sum(
                            e[s] / z * qkv[s][2 * C + h * hs + i]
                            for s in range(t + 1))
            xs = [[x[c] + y[c] for c in range(C)] for x, y in
                  zip(xs, (lin(a, p("attn.c_proj.weight"),
                               p("attn.c_proj.bias")) for a in att))]
            new = []
            for x in xs:
                f = lin(ln(x, p("ln_2.weight"), p("ln_2.bias")),
                        p("mlp.c_fc.weight"), p("mlp.c_fc.bias"))
                y = lin([gelu(u) for u in f], p("mlp.c_proj.weight"),
                        p("mlp.c_proj.bias"))
                new.append([x[c] + y[c] for c in range(C)])
            xs = new
        for t in range(nt):
            xf = ln(xs[t], P("ln_f.weight"), P("ln_f.bias"))
            lg = [sum(wte[v][c] * xf[c] for c in range(C)) for v in range(V)]
            logits[b, t] = lg
            m = max(lg)
            lse = m + math.log(sum(math.exp(g - m) for g in lg))
            total += lse - lg[targets[b, t]]
    return total / (nb * nt), logits


# --------------------------------------------------------------------------
# checks

class Ctx:
    def __init__(self, d):
        self.d = d
        self.params = make_params()
        self.inputs, self.targets = make_tokens()
        self.p_path = os.path.join(d, "P.safetensors")
        self.t_path = os.path.join(d, "T.bin")
        write_params(self.p_path, self.params)
        ref_common.write_tokens(self.t_path, self.inputs, self.targets)
        r, out = run_ref(d, self.p_path, self.t_path)
        if r.returncode != 0:
            raise AssertionError("gpt2_ref.py failed (%d): %s"
                                 % (r.returncode, r.stderr))
        self.out_path = out
        self.hlen, self.blob, self.header, self.out = ref_common.read_out(out)


def check_forward_vs_naive(ctx):
    loss, logits = naive_forward(ctx.params, ctx.inputs, ctx.targets)
    got = ctx.out["loss"][0]
    assert abs(got - loss) <= FWD_ATOL, \
        "loss %.17g vs naive %.17g (diff %.3g)" % (got, loss, got - loss)
    err = np.max(np.abs(ctx.out["logits"] - logits))
    assert err <= FWD_ATOL, "logits max abs diff %.3g > %g" % (err, FWD_ATOL)
    # the model must not be trivial: loss far from uniform log(V)
    assert abs(loss - math.log(V)) > 0.05, "loss %.6f ~ log(V)" % loss
    print("  loss %.15f (naive diff %.2g), logits max diff %.2g"
          % (got, got - loss, err))


def check_grads_vs_fd(ctx):
    params = {k: v.copy() for k, v in ctx.params.items()}

    def loss_of():
        return gpt2_ref.forward(params, L, H, ctx.inputs, ctx.targets)[0]

    nchecked, worst = ref_common.check_grads_fd(
        ctx.out, params, gpt2_ref.param_names(L), loss_of)
    # wpe rows >= T get no gradient at all (positions never used)
    assert np.all(ctx.out["grad.wpe.weight"][T:] == 0.0)
    print("  %d entries checked; worst diff/tol %.3f at %s"
          % (nchecked, worst[0], worst[1]))


def check_output_format(ctx):
    assert ctx.hlen % 8 == 0, "header length %d not a multiple of 8" % ctx.hlen
    names = ["loss", "logits"] + ["grad." + n for n in gpt2_ref.param_names(L)]
    assert list(ctx.header) == names, "names/order: %s" % list(ctx.header)
    shapes = gpt2_ref.param_shapes(L, V, C, MAXT)
    want = {"loss": [1], "logits": [B, T, V]}
    want.update({"grad." + n: list(s) for n, s in shapes.items()})
    end = 0
    for n in names:
        e = ctx.header[n]
        assert e["dtype"] == "F64", "%s dtype %s" % (n, e["dtype"])
        assert e["shape"] == want[n], "%s shape %s vs %s" % (
            n, e["shape"], want[n])
        assert e["data_offsets"][0] == end, "%s offsets not contiguous" % n
        end = e["data_offsets"][1]
    assert 8 + ctx.hlen + end == len(ctx.blob), "file size mismatch"
    # raw little-endian float64 of the loss sits at the start of the data
    (raw_loss,) = struct.unpack("<d", ctx.blob[8 + ctx.hlen:16 + ctx.hlen])
    assert raw_loss == ctx.out["loss"][0]


def check_bad_input(ctx):
    d = ctx.d
    bad_p = os.path.join(d, "bad.safetensors")
    bad_t = os.path.join(d, "bad.bin")

    def expect(params_path, tokens_path, needle, n_layer=L, n_head=H):
        ref_common.expect_error(
            lambda: run_ref(d, params_path, tokens_path, n_layer, n_head),
            needle)

    write_params(bad_p, ctx.params, drop="h.1.mlp.c_fc.bias")
    expect(bad_p, ctx.t_path, "missing tensor 'h.1.mlp.c_fc.bias'")
    write_params(bad_p, ctx.params, reshape=("h.0.attn.c_attn.weight",
                                             (C, 3 * C)))
    expect(bad_p, ctx.t_path, "tensor 'h.0.attn.c_attn.weight': shape "
           "[8, 24] does not match expected [24, 8]")
    expect(ctx.p_path, ctx.t_path, "unexpected tensor 'h.1.attn.c_attn.bias'",
           n_layer=1)
    expect(ctx.p_path, ctx.t_path, "missing tensor 'h.2.ln_1.weight'",
           n_layer=3)
    expect(ctx.p_path, ctx.t_path, "not divisible by --n-head=3", n_head=3)
    bad_in = ctx.inputs.copy()
    bad_in[1, 2] = V
    ref_common.write_tokens(bad_t, bad_in, ctx.targets)
    expect(ctx.p_path, bad_t, "input token 11 at flat position 7 out of "
           "range [0, 11)")
    long_in = np.zeros((1, MAXT + 1), dtype=np.int64)
    ref_common.write_tokens(bad_t, long_in, long_in)
    expect(ctx.p_path, bad_t, "T=7 exceeds wpe rows maxT=6")
    with open(bad_t, "wb") as f:
        f.write(struct.pack("<ii", B, T) + b"\0" * 12)
    expect(ctx.p_path, bad_t, "20 bytes, expected %d for B=2, T=5"
           % (8 + 8 * B * T))
    expect(os.path.join(d, "nope.safetensors"), ctx.t_path, "cannot read")


def check_after_training(ctx):
    """--generate: the next token is the naive forward's argmax; and
    --write-hf-to: Hugging Face's layout of the same parameters."""
    hf = os.path.join(ctx.d, "hf")
    r, out = ref_common.run_script(SCRIPT, ctx.d, ctx.p_path, ctx.t_path,
                                   ["--n-layer", L, "--n-head", H,
                                    "--generate", MAXT - T,
                                    "--write-hf-to", hf])
    assert r.returncode == 0, r.stderr
    o = ref_common.load_safetensors(out)
    _, logits = naive_forward(ctx.params, ctx.inputs[:1], ctx.targets[:1])
    last = logits[0, -1]
    assert list(o["generated"]) == [int(np.argmax(last))], o["generated"]
    top2 = np.sort(last)[-2:]
    assert abs(o["margin"][0] - (top2[1] - top2[0])) <= FWD_ATOL
    w = ref_common.load_safetensors(os.path.join(hf, "model.safetensors"))
    for name in gpt2_ref.param_names(L):
        want = ctx.params[name]
        if name.endswith(gpt2_ref.HF_CONV1D):
            want = want.T
        assert w[name].shape == want.shape and np.array_equal(w[name], want), name
    for l in range(L):
        assert np.array_equal(w["h.%d.attn.bias" % l][0, 0],
                              np.tril(np.ones((MAXT, MAXT))))
    assert "lm_head.weight" not in w
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"],
            cfg["n_positions"], cfg["activation_function"]) == \
        (L, H, C, V, MAXT, "gelu_new"), cfg


def main():
    checks = [check_forward_vs_naive, check_grads_vs_fd, check_output_format,
              check_bad_input, check_after_training]
    with tempfile.TemporaryDirectory(prefix="gpt2_ref_") as d:
        return ref_common.run_checks("gpt2_ref",
                                     [("", lambda: Ctx(d), checks)])


if __name__ == "__main__":
    sys.exit(main())
