#!/usr/bin/python3
"""Self-check of llama_ref.py, the float64 oracle of dtrain's llama model.

Tiny random models (V=11, C=8, head_dim 4, I=12, 2 layers; B=2, T=5) in
four variants: grouped-query attention (4 query heads over 2 key/value
heads) with an untied head; multi-head (K = H = 2) with a tied head;
Qwen2's q/k/v biases; Llama 3.1's rope scaling with a large theta.  Runs
llama_ref.py as a subprocess as the C tests do, and checks:
  1. loss and logits against a naive pure-Python loop forward (sharing no
     code with llama_ref.py: its own RMSNorm, rotation by explicit pairs,
     per-head attention loop, SwiGLU) to 1e-12;
  2. every gradient entry against central finite differences of the float64
     loss (ref_common's bounds: |g - fd| <= max(1e-6 |fd|, 1e-9));
  3. the output file's names, order, shapes and dtype;
  4. bad input exits with status 1 and a message naming the problem.
When python3 has torch and transformers (not in CI: a developer's venv),
also the logits against transformers' LlamaForCausalLM / Qwen2ForCausalLM
in float64 on the files --write-hf-to writes (2e-5: transformers keeps its
rotary table in float32);
otherwise that check prints SKIP.

Run: /usr/bin/python3 tests/reference/test_llama_ref_selfcheck.py
(tests/unit/plugins/llama/test_llama_oracle.c runs it before trusting the oracle.)
Exit status 0 when every check passes, 77 (skipped) without numpy.
"""

import json
import math
import os
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # ctest reports 77 as skipped
    print("SKIP llama_ref selfcheck: /usr/bin/python3 has no numpy (python3-numpy)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "llama_ref.py")
sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import ref_common  # noqa: E402

V, C, D, I, L, B, T = 11, 8, 4, 12, 2, 2, 5
FWD_ATOL = 1e-12
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

VARIANTS = {
    "gqa": dict(n_head=4, n_kv_head=2, tied=0, qkv_bias=0, theta=10000.0,
                scaling=None),
    "mha-tied": dict(n_head=2, n_kv_head=2, tied=1, qkv_bias=0, theta=100.0,
                     scaling=None),
    "qwen2": dict(n_head=4, n_kv_head=1, tied=1, qkv_bias=1, theta=1e6,
                  scaling=None),
    "llama3-rope": dict(n_head=4, n_kv_head=2, tied=0, qkv_bias=0,
                        theta=500000.0, scaling=LLAMA3),
}


def shape_of(v):
    return llama_ref.Shape(L, v["n_head"], v["n_kv_head"], v["theta"], 1e-5,
                           v["tied"], v["qkv_bias"], v["scaling"])


def make_params(sh, seed=3):
    """Random float32-representable parameters, scaled so attention is
    peaked, SwiGLU non-linear and the norms' weights far from 1."""
    rng = np.random.default_rng(seed)
    shapes = llama_ref.param_shapes(sh, V, C, D, I)
    params = {}
    for n in llama_ref.param_names(sh):
        s = shapes[n]
        if n.endswith("norm.weight"):
            a = 1.0 + 0.5 * rng.standard_normal(s)
        elif n.endswith(".bias"):
            a = 0.3 * rng.standard_normal(s)
        else:
            a = rng.standard_normal(s) / math.sqrt(s[-1]) * 1.5
        params[n] = a.astype(np.float32).astype(np.float64)
    return params


def args_of(v):
    a = ["--n-layer", L, "--n-head", v["n_head"], "--n-kv-head", v["n_kv_head"],
         "--rope-theta", repr(v["theta"]), "--tied", v["tied"],
         "--qkv-bias", v["qkv_bias"]]
    if v["scaling"]:
        a += ["--rope-scaling", json.dumps(v["scaling"])]
    return a


def naive_forward(params, sh, inputs, targets):
    """Plain Python loops, sharing no code with llama_ref's forward."""
    H, K = sh.n_head, sh.n_kv_head
    inv = llama_ref.rope_inv_freq  # checked separately (check_rope_freqs)

    def rms(x, w):
        r = 1.0 / math.sqrt(sum(e * e for e in x) / len(x) + sh.rms_eps)
        return [e * r * wi for e, wi in zip(x, w)]

    def lin(x, W, b=None):
        y = [sum(w * xi for w, xi in zip(row, x)) for row in W.tolist()]
        return y if b is None else [e + bi for e, bi in zip(y, b.tolist())]

    freqs = inv(D, sh.rope_theta, sh.rope_scaling).tolist()

    def rot(vec, pos):  # one head: pairs (i, i + D/2)
        out = list(vec)
        for i in range(D // 2):
            c, s = math.cos(pos * freqs[i]), math.sin(pos * freqs[i])
            a, b = vec[i], vec[i + D // 2]
            out[i], out[i + D // 2] = a * c - b * s, b * c + a * s
        return out

    logits = np.zeros(inputs.shape + (V,))
    total = 0.0
    emb = params["embed_tokens.weight"].tolist()
    head = params["embed_tokens.weight" if sh.tied else "lm_head.weight"]
    for bi in range(inputs.shape[0]):
        xs = [list(emb[inputs[bi, t]]) for t in range(inputs.shape[1])]
        for l in range(sh.n_layer):
            def p(s, l=l):
                return params.get("layers.%d.%s" % (l, s))
            qs, ks, vs = [], [], []
            for t, x in enumerate(xs):
                n1 = rms(x, p("input_layernorm.weight").tolist())
                q = lin(n1, p("self_attn.q_proj.weight"), p("self_attn.q_proj.bias"))
                k = lin(n1, p("self_attn.k_proj.weight"), p("self_attn.k_proj.bias"))
                qs.append([rot(q[h * D:(h + 1) * D], t) for h in range(H)])
                ks.append([rot(k[j * D:(j + 1) * D], t) for j in range(K)])
                v = lin(n1, p("self_attn.v_proj.weight"), p("self_attn.v_proj.bias"))
                vs.append([v[j * D:(j + 1) * D] for j in range(K)])
            new = []
            for t, x in enumerate(xs):
                att = []
                for h in range(H):
                    j = h // (H // K)
                    sc = [sum(a * b for a, b in zip(qs[t][h], ks[s][j])) / math.sqrt(D)
                          for s in range(t + 1)]
                    m = max(sc)
                    e = [math.exp(z - m) for z in sc]
                    z = sum(e)
                    att += [sum(e[s] / z * vs[s][j][c] for s in range(t + 1))
                            for c in range(D)]
                hx = [a + b for a, b in zip(x, lin(att, p("self_attn.o_proj.weight")))]
                n2 = rms(hx, p("post_attention_layernorm.weight").tolist())
                g = lin(n2, p("mlp.gate_proj.weight"))
                u = lin(n2, p("mlp.up_proj.weight"))
                mm = [gi / (1.0 + math.exp(-gi)) * ui for gi, ui in zip(g, u)]
                new.append([a + b for a, b in zip(hx, lin(mm, p("mlp.down_proj.weight")))])
            xs = new
        for t, x in enumerate(xs):
            lg = lin(rms(x, params["norm.weight"].tolist()), head)
            logits[bi, t] = lg
            m = max(lg)
            total += m + math.log(sum(math.exp(g - m) for g in lg)) - lg[targets[bi, t]]
    return total / inputs.size, logits


class Ctx:
    def __init__(self, d, name):
        self.d, self.name, self.v = d, name, VARIANTS[name]
        self.sh = shape_of(self.v)
        self.params = make_params(self.sh)
        self.names = llama_ref.param_names(self.sh)
        rng = np.random.default_rng(7)
        self.inputs = rng.integers(0, V, size=(B, T))
        self.targets = rng.integers(0, V, size=(B, T))
        self.inputs[1, 3] = self.inputs[0, 0]  # a repeated embedding row
        self.p_path = os.path.join(d, "P-%s.safetensors" % name)
        self.t_path = os.path.join(d, "T.bin")
        self.hf = os.path.join(d, "hf-%s" % name)
        ref_common.write_params(self.p_path, self.params, self.names)
        ref_common.write_tokens(self.t_path, self.inputs, self.targets)
        r, out = ref_common.run_script(SCRIPT, d, self.p_path, self.t_path,
                                       args_of(self.v) + ["--write-hf-to", self.hf])
        if r.returncode != 0:
            raise AssertionError("llama_ref.py failed (%d): %s" % (r.returncode, r.stderr))
        _, _, self.header, self.out = ref_common.read_out(out)


def check_forward_vs_naive(ctx):
    loss, logits = naive_forward(ctx.params, ctx.sh, ctx.inputs, ctx.targets)
    got = ctx.out["loss"][0]
    assert abs(got - loss) <= FWD_ATOL, "loss %.17g vs naive %.17g" % (got, loss)
    err = np.max(np.abs(ctx.out["logits"] - logits))
    assert err <= FWD_ATOL, "logits max abs diff %.3g" % err
    assert abs(loss - math.log(V)) > 0.05, "loss %.6f ~ log(V)" % loss


def check_rope_freqs(ctx):
    """inv_freq by its definition, and Llama 3.1's three bands."""
    plain = llama_ref.rope_inv_freq(D, 10000.0, None)
    want = [10000.0 ** (-2.0 * i / D) for i in range(D // 2)]
    assert np.allclose(plain, want, rtol=0, atol=1e-15), plain
    d = 16
    base = llama_ref.rope_inv_freq(d, 500000.0, None)
    got = llama_ref.rope_inv_freq(d, 500000.0, LLAMA3)
    for f, g in zip(base, got):
        wl = 2 * math.pi / f
        if wl < 16 / 4.0:          # high frequency: kept
            assert g == f, (wl, f, g)
        elif wl > 16 / 1.0:        # low frequency: divided by the factor
            assert abs(g - f / 8.0) <= 1e-18, (wl, f, g)
        else:                      # between: interpolated
            s = (16 / wl - 1.0) / (4.0 - 1.0)
            assert abs(g - ((1 - s) * f / 8.0 + s * f)) <= 1e-18, (wl, f, g)
    assert any(g != f for f, g in zip(base, got)), "scaling changed nothing"


def check_grads_vs_fd(ctx):
    params = {k: v.copy() for k, v in ctx.params.items()}

    def loss_of():
        return llama_ref.forward(params, ctx.sh, ctx.inputs, ctx.targets)[0]

    n, _ = ref_common.check_grads_fd(ctx.out, params, ctx.names, loss_of)
    print("  %s: %d gradient entries checked" % (ctx.name, n))


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
    bad_p = os.path.join(d, "bad.safetensors")

    def expect(p, needle, extra=()):
        ref_common.expect_error(
            lambda: ref_common.run_script(SCRIPT, d, p, ctx.t_path,
                                          args_of(ctx.v) + list(extra)), needle)

    ref_common.write_params(bad_p, ctx.params, ctx.names,
                            drop="layers.1.mlp.up_proj.weight")
    expect(bad_p, "missing tensor 'layers.1.mlp.up_proj.weight'")
    kd = ctx.v["n_kv_head"] * D
    ref_common.write_params(bad_p, ctx.params, ctx.names,
                            reshape=("layers.1.self_attn.k_proj.weight", (1, kd * C)))
    expect(bad_p, "tensor 'layers.1.self_attn.k_proj.weight': shape [1, %d] does not "
           "match expected [%d, %d]" % (kd * C, kd, C))
    expect(ctx.p_path, "must divide", ["--n-kv-head", "3"])
    expect(ctx.p_path, "rope_type 'yarn' is not supported",
           ["--rope-scaling", '{"rope_type": "yarn", "factor": 2}'])


def check_vs_transformers(ctx):
    """transformers' model in float64 on the files --write-hf-to wrote."""
    try:
        import torch
        import transformers
    except ImportError:
        print("SKIP check_vs_transformers: python3 has no torch/transformers")
        return
    with open(os.path.join(ctx.hf, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["num_key_value_heads"] == ctx.v["n_kv_head"]
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls.from_pretrained(ctx.hf, torch_dtype=torch.float64,
                                attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor(ctx.inputs, dtype=torch.long),
                    labels=None)
    lg = out.logits.numpy()
    err = np.max(np.abs(lg - ctx.out["logits"]))
    # transformers computes the rotary table (inv_freq, cos, sin) in float32
    # whatever the model's dtype, so the two agree to float32 rounding of
    # those angles, not to float64's: a structural slip (pairing, head
    # grouping, a missing bias) is O(1)
    assert err <= 2e-5, "logits differ from transformers' by %.3g" % err
    print("  %s: transformers %s %s agrees to %.2g" % (ctx.name, transformers.__version__,
                                                      cfg["architectures"][0], err))


def main():
    full = [check_forward_vs_naive, check_grads_vs_fd, check_output_format,
            check_bad_input, check_vs_transformers]
    with tempfile.TemporaryDirectory(prefix="llama_ref_") as d:
        cases = []
        for i, name in enumerate(VARIANTS):
            checks = full if i == 0 else [check_forward_vs_naive, check_grads_vs_fd,
                                          check_vs_transformers]
            if i == 0:
                checks = [check_rope_freqs] + checks
            cases.append((" (%s)" % name, lambda name=name: Ctx(d, name), checks))
        return ref_common.run_checks("llama_ref", cases)


if __name__ == "__main__":
    sys.exit(main())
