#!/usr/bin/python3
"""Float64 numpy reference of a LLaMA-family decoder (forward, loss and a
hand-written backward), the oracle of dtrain's `llama` model.

Independent of the C engine, as gpt2_ref.py is: it reads parameters and
tokens from files, computes everything in float64 and writes the loss, the
logits and the gradient of the mean loss w.r.t. every parameter to a
safetensors file.

    /usr/bin/python3 tests/reference/llama_ref.py --params P.safetensors \\
        --tokens T.bin --out O.safetensors --n-layer L --n-head H \\
        --n-kv-head K [--rope-theta 10000] [--rms-eps 1e-5] [--tied 0|1] \\
        [--qkv-bias 0|1] [--rope-scaling JSON]

The model is Hugging Face's LlamaForCausalLM (and Qwen2ForCausalLM with
--qkv-bias 1, MistralForCausalLM without a sliding window):
  x = embed_tokens[ids]
  per layer: h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)),
                                 v_proj(n1)))         n1 = rmsnorm(x)
             x = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))
                                                      n2 = rmsnorm(h)
  logits = rmsnorm(x) @ W.T, W = lm_head (or embed_tokens with --tied 1)
RMSNorm: x / sqrt(mean(x^2) + eps) * w.  Rotary embedding: HF's
"rotate_half" pairing (i, i + d/2) of each head of d = head_dim channels,
inv_freq[i] = theta^(-2i/d), position p's angle p * inv_freq[i] for both
halves; --rope-scaling '{"rope_type": "llama3", "factor": 8,
"low_freq_factor": 1, "high_freq_factor": 4,
"original_max_position_embeddings": 8192}' rescales inv_freq as Llama 3.1
does.  Grouped-query attention: query head h reads key/value head
h // (H / K); causal softmax with scale 1/sqrt(d).  Linear layers carry no
bias except q/k/v with --qkv-bias 1.

Inputs
  P.safetensors  "F32" (or "F64") tensors named as below (HF's names
                 without the "model." prefix), weights (out, in) row-major,
                 y = x @ W.T (+ b).  Every name must be present and no other.
                 embed_tokens.weight (V, C)
                 layers.<l>.input_layernorm.weight (C)
                 layers.<l>.self_attn.q_proj.weight (H d, C)  [.bias (H d)]
                 layers.<l>.self_attn.k_proj.weight (K d, C)  [.bias (K d)]
                 layers.<l>.self_attn.v_proj.weight (K d, C)  [.bias (K d)]
                 layers.<l>.self_attn.o_proj.weight (C, H d)
                 layers.<l>.post_attention_layernorm.weight (C)
                 layers.<l>.mlp.gate_proj.weight (I, C)
                 layers.<l>.mlp.up_proj.weight (I, C)
                 layers.<l>.mlp.down_proj.weight (C, I)
                 norm.weight (C)
                 lm_head.weight (V, C)  (absent with --tied 1)
  T.bin          little-endian int32: B, T, B*T input tokens, B*T targets.
Output (all "F64"): "loss" [1], "logits" [B, T, V], "grad.<name>" for
every parameter in the order above (the tied embedding's gradient holds the
LM head's and the lookup's parts).
Exit status: 0 on success, 1 on bad input (message on stderr), 2 on bad
usage.  Only numpy: the backward is an independent derivation that
test_llama_ref_selfcheck.py verifies by finite differences.
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
                        load_safetensors, load_tokens, save_safetensors,
                        write_result)


class Shape:
    """The hyper-parameters a parameter file does not say by itself."""

    def __init__(self, n_layer, n_head, n_kv_head, rope_theta=10000.0,
                 rms_eps=1e-5, tied=0, qkv_bias=0, rope_scaling=None):
        self.n_layer, self.n_head, self.n_kv_head = n_layer, n_head, n_kv_head
        self.rope_theta, self.rms_eps = float(rope_theta), float(rms_eps)
        self.tied, self.qkv_bias = int(tied), int(qkv_bias)
        self.rope_scaling = rope_scaling  # None or a dict (llama3)


# --------------------------------------------------------------------------
# model description

def block_suffixes(qkv_bias):
    s = ["input_layernorm.weight", "self_attn.q_proj.weight"]
    if qkv_bias:
        s.append("self_attn.q_proj.bias")
    s.append("self_attn.k_proj.weight")
    if qkv_bias:
        s.append("self_attn.k_proj.bias")
    s.append("self_attn.v_proj.weight")
    if qkv_bias:
        s.append("self_attn.v_proj.bias")
    return s + ["self_attn.o_proj.weight", "post_attention_layernorm.weight",
                "mlp.gate_proj.weight", "mlp.up_proj.weight",
                "mlp.down_proj.weight"]


def param_names(sh):
    """All parameter names in unit order: embedding, blocks, head."""
    names = ["embed_tokens.weight"]
    for l in range(sh.n_layer):
        names += ["layers.%d.%s" % (l, s) for s in block_suffixes(sh.qkv_bias)]
    names.append("norm.weight")
    if not sh.tied:
        names.append("lm_head.weight")
    return names


def param_shapes(sh, V, C, d, inter):
    H, K = sh.n_head, sh.n_kv_head
    per = {"input_layernorm.weight": (C,),
           "self_attn.q_proj.weight": (H * d, C), "self_attn.q_proj.bias": (H * d,),
           "self_attn.k_proj.weight": (K * d, C), "self_attn.k_proj.bias": (K * d,),
           "self_attn.v_proj.weight": (K * d, C), "self_attn.v_proj.bias": (K * d,),
           "self_attn.o_proj.weight": (C, H * d),
           "post_attention_layernorm.weight": (C,),
           "mlp.gate_proj.weight": (inter, C), "mlp.up_proj.weight": (inter, C),
           "mlp.down_proj.weight": (C, inter)}
    shapes = {"embed_tokens.weight": (V, C), "norm.weight": (C,)}
    for l in range(sh.n_layer):
        for s in block_suffixes(sh.qkv_bias):
            shapes["layers.%d.%s" % (l, s)] = per[s]
    if not sh.tied:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def check_params(params, sh):
    """Validates names and shapes; returns (V, C, head_dim, intermediate)."""
    if sh.n_layer < 1:
        raise RefError("--n-layer must be >= 1 (got %d)" % sh.n_layer)
    if sh.n_head < 1 or sh.n_kv_head < 1 or sh.n_head % sh.n_kv_head:
        raise RefError("--n-kv-head=%d must divide --n-head=%d"
                       % (sh.n_kv_head, sh.n_head))
    check_names(params, param_names(sh),
                "--n-layer=%d --tied=%d --qkv-bias=%d"
                % (sh.n_layer, sh.tied, sh.qkv_bias))
    emb = params["embed_tokens.weight"]
    if emb.ndim != 2:
        raise RefError("tensor 'embed_tokens.weight': shape %s, expected (V, C)"
                       % (list(emb.shape),))
    V, C = emb.shape
    q = params["layers.0.self_attn.q_proj.weight"]
    if q.ndim != 2 or q.shape[0] % sh.n_head:
        raise RefError("tensor 'layers.0.self_attn.q_proj.weight': shape %s, "
                       "expected (%d * head_dim, C)" % (list(q.shape), sh.n_head))
    d = q.shape[0] // sh.n_head
    if d % 2:
        raise RefError("head_dim %d is odd: the rotary embedding pairs channels"
                       % d)
    g = params["layers.0.mlp.gate_proj.weight"]
    if g.ndim != 2:
        raise RefError("tensor 'layers.0.mlp.gate_proj.weight': shape %s, "
                       "expected (I, C)" % (list(g.shape),))
    inter = g.shape[0]
    check_shapes(params, param_shapes(sh, V, C, d, inter))
    return V, C, d, inter


# --------------------------------------------------------------------------
# layers: <op>_forward returns (out, cache); <op>_backward the input
# gradient (and the parameters')

def rmsnorm_forward(x, w, eps):
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return x * r * w, (x, r, w)


def rmsnorm_backward(dout, cache):
    """Returns (dx, dw)."""
    x, r, w = cache
    lead = tuple(range(dout.ndim - 1))
    dw = (dout * x * r).sum(axis=lead)
    g = dout * w
    dx = r * g - x * (r ** 3) * (g * x).mean(axis=-1, keepdims=True)
    return dx, dw


def rope_inv_freq(d, theta, scaling):
    """inv_freq[i] = theta^(-2i/d), i < d/2, rescaled as Llama 3.1 does
    when `scaling` says rope_type llama3."""
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise RefError("--rope-scaling: rope_type %r is not supported "
                       "(only llama3)" % (kind,))
    factor = float(scaling["factor"])
    lo, hi = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    lo_wavelen, hi_wavelen = old / lo, old / hi
    out = np.where(wavelen > lo_wavelen, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
    return np.where(medium, smoothed, out)


def rope_tables(T, d, theta, scaling):
    """cos, sin (T, d): position p's angle p * inv_freq for both halves."""
    ang = np.arange(T, dtype=np.float64)[:, None] * rope_inv_freq(d, theta, scaling)[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang), np.sin(ang)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rotate_half_t(x):
    """The transpose of rotate_half (its inverse)."""
    h = x.shape[-1] // 2
    return np.concatenate([x[..., h:], -x[..., :h]], axis=-1)


def rope_forward(x, cos, sin):
    """x (B, nh, T, d)."""
    return x * cos + rotate_half(x) * sin


def rope_backward(dout, cos, sin):
    return dout * cos + rotate_half_t(dout * sin)


def attention_forward(q, k, v, n_rep):
    """q (B, H, T, d), k v (B, K, T, d), H = K n_rep -> (B, H, T, d)."""
    T, d = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d)
    ke, ve = np.repeat(k, n_rep, axis=1), np.repeat(v, n_rep, axis=1)
    s = (q @ ke.transpose(0, 1, 3, 2)) * scale
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    s = np.where(future, -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ ve, (q, ke, ve, p, scale, n_rep)


def attention_backward(dy, cache):
    """Returns dq (B, H, T, d), dk and dv (B, K, T, d): each key/value head
    collects the gradients of the query heads that read it."""
    q, ke, ve, p, scale, n_rep = cache
    B, H, T, d = q.shape
    dve = p.transpose(0, 1, 3, 2) @ dy
    dp = dy @ ve.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq = ds @ ke
    dke = ds.transpose(0, 1, 3, 2) @ q
    K = H // n_rep
    return (dq, dke.reshape(B, K, n_rep, T, d).sum(axis=2),
            dve.reshape(B, K, n_rep, T, d).sum(axis=2))


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu_forward(g, u):
    return silu(g) * u, (g, u)


def swiglu_backward(dout, cache):
    """Returns (dg, du)."""
    g, u = cache
    sig = 1.0 / (1.0 + np.exp(-g))
    return dout * u * sig * (1.0 + g * (1.0 - sig)), dout * g * sig


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


# --------------------------------------------------------------------------
# model

def forward(params, sh, inputs, targets):
    """Returns (loss, logits (B, T, V), cache for backward())."""
    B, T = inputs.shape
    H, K = sh.n_head, sh.n_kv_head
    emb = params["embed_tokens.weight"]
    C = emb.shape[1]
    d = params["layers.0.self_attn.q_proj.weight"].shape[0] // H
    cos, sin = rope_tables(T, d, sh.rope_theta, sh.rope_scaling)
    x = emb[inputs]
    caches = []
    for l in range(sh.n_layer):
        def p(s, l=l):
            return params.get("layers.%d.%s" % (l, s))
        n1, c_n1 = rmsnorm_forward(x, p("input_layernorm.weight"), sh.rms_eps)

        def heads(m, n):  # (B, T, n d) -> (B, n, T, d)
            return m.reshape(B, T, n, d).transpose(0, 2, 1, 3)
        q = heads(linear(n1, p("self_attn.q_proj.weight"), p("self_attn.q_proj.bias")), H)
        k = heads(linear(n1, p("self_attn.k_proj.weight"), p("self_attn.k_proj.bias")), K)
        v = heads(linear(n1, p("self_attn.v_proj.weight"), p("self_attn.v_proj.bias")), K)
        qr, kr = rope_forward(q, cos, sin), rope_forward(k, cos, sin)
        y, c_att = attention_forward(qr, kr, v, H // K)
        att = y.transpose(0, 2, 1, 3).reshape(B, T, H * d)
        h = x + linear(att, p("self_attn.o_proj.weight"))
        n2, c_n2 = rmsnorm_forward(h, p("post_attention_layernorm.weight"), sh.rms_eps)
        g = linear(n2, p("mlp.gate_proj.weight"))
        u = linear(n2, p("mlp.up_proj.weight"))
        m, c_sw = swiglu_forward(g, u)
        x = h + linear(m, p("mlp.down_proj.weight"))
        caches.append((n1, c_n1, c_att, att, n2, c_n2, c_sw, m))
    nf, c_nf = rmsnorm_forward(x, params["norm.weight"], sh.rms_eps)
    head = emb if sh.tied else params["lm_head.weight"]
    logits = nf @ head.T
    loss, probs = cross_entropy_forward(logits, targets)
    return loss, logits, (inputs, targets, caches, nf, c_nf, probs, cos, sin, C, d)


def backward(params, sh, cache):
    """Returns {name: d(mean loss)/d(param)} for every parameter."""
    inputs, targets, caches, nf, c_nf, probs, cos, sin, C, d = cache
    B, T = inputs.shape
    H, K = sh.n_head, sh.n_kv_head
    emb = params["embed_tokens.weight"]
    grads = {n: np.zeros_like(params[n]) for n in param_names(sh)}
    head_name = "embed_tokens.weight" if sh.tied else "lm_head.weight"
    head = params[head_name]

    def flat(a):
        return a.reshape(-1, a.shape[-1])

    dlogits = cross_entropy_backward(probs, targets)
    grads[head_name] += flat(dlogits).T @ flat(nf)
    dx, dw = rmsnorm_backward(dlogits @ head, c_nf)
    grads["norm.weight"] += dw

    for l in reversed(range(sh.n_layer)):
        n1, c_n1, c_att, att, n2, c_n2, c_sw, m = caches[l]
        pre = "layers.%d." % l

        def W(s):
            return params[pre + s]

        def acc(s, dy, xin):  # a linear layer's weight (and bias) gradient
            grads[pre + s + ".weight"] += flat(dy).T @ flat(xin)
            if pre + s + ".bias" in grads:
                grads[pre + s + ".bias"] += flat(dy).sum(axis=0)
        # x_out = h + down(m)
        dh = dx.copy()
        acc("mlp.down_proj", dx, m)
        dm = dx @ W("mlp.down_proj.weight")
        dg, du = swiglu_backward(dm, c_sw)
        acc("mlp.gate_proj", dg, n2)
        acc("mlp.up_proj", du, n2)
        dn2 = dg @ W("mlp.gate_proj.weight") + du @ W("mlp.up_proj.weight")
        dxn, dw = rmsnorm_backward(dn2, c_n2)
        grads[pre + "post_attention_layernorm.weight"] += dw
        dh += dxn
        # h = x + o(att)
        dxin = dh.copy()
        acc("self_attn.o_proj", dh, att)
        datt = (dh @ W("self_attn.o_proj.weight")).reshape(B, T, H, d).transpose(0, 2, 1, 3)
        dqr, dkr, dv = attention_backward(datt, c_att)
        dq, dk = rope_backward(dqr, cos, sin), rope_backward(dkr, cos, sin)

        def merge(a, n):  # (B, n, T, d) -> (B, T, n d)
            return a.transpose(0, 2, 1, 3).reshape(B, T, n * d)
        dq, dk, dv = merge(dq, H), merge(dk, K), merge(dv, K)
        acc("self_attn.q_proj", dq, n1)
        acc("self_attn.k_proj", dk, n1)
        acc("self_attn.v_proj", dv, n1)
        dn1 = (dq @ W("self_attn.q_proj.weight") + dk @ W("self_attn.k_proj.weight")
               + dv @ W("self_attn.v_proj.weight"))
        dxn, dw = rmsnorm_backward(dn1, c_n1)
        grads[pre + "input_layernorm.weight"] += dw
        dx = dxin + dxn

    np.add.at(grads["embed_tokens.weight"], inputs.reshape(-1), flat(dx))
    return grads


# --------------------------------------------------------------------------
# after training: greedy generation and Hugging Face's layout

def greedy(params, sh, prompt, n):
    """The greedy continuation of `prompt` by n tokens, each step a full
    forward (no cache); returns (ids, margins) as gpt2_ref.greedy does."""
    seq = [int(t) for t in prompt]
    ids, margins = [], []
    for _ in range(n):
        x = np.array([seq], dtype=np.int64)
        _, logits, _ = forward(params, sh, x, np.zeros_like(x))
        last = logits[0, -1]
        top2 = np.sort(last)[-2:]
        nxt = int(np.argmax(last))
        ids.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        seq.append(nxt)
    return np.array(ids, dtype=np.float64), np.array(margins)


def write_hf(params, sh, folder, max_positions):
    """folder/model.safetensors (F32, HF's "model." prefix, no lm_head when
    tied) and folder/config.json as LlamaForCausalLM (Qwen2ForCausalLM with
    q/k/v biases) saves them."""
    V, C = params["embed_tokens.weight"].shape
    d = params["layers.0.self_attn.q_proj.weight"].shape[0] // sh.n_head
    inter = params["layers.0.mlp.gate_proj.weight"].shape[0]
    out = [(n if n == "lm_head.weight" else "model." + n, params[n])
           for n in param_names(sh)]
    os.makedirs(folder, exist_ok=True)
    save_safetensors(os.path.join(folder, "model.safetensors"), out, "F32")
    qwen = bool(sh.qkv_bias)
    cfg = {"model_type": "qwen2" if qwen else "llama",
           "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
           "vocab_size": V, "hidden_size": C, "intermediate_size": inter,
           "num_hidden_layers": sh.n_layer, "num_attention_heads": sh.n_head,
           "num_key_value_heads": sh.n_kv_head, "head_dim": d,
           "hidden_act": "silu", "max_position_embeddings": max_positions,
           "rms_norm_eps": sh.rms_eps, "rope_theta": sh.rope_theta,
           "rope_scaling": sh.rope_scaling, "tie_word_embeddings": bool(sh.tied),
           "attention_bias": qwen, "mlp_bias": False, "attention_dropout": 0.0,
           "torch_dtype": "float32"}
    if qwen:
        del cfg["attention_bias"], cfg["mlp_bias"]
        cfg["use_sliding_window"] = False
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def run(params_path, tokens_path, out_path, n_layer, n_head, n_kv_head,
        rope_theta=10000.0, rms_eps=1e-5, tied=0, qkv_bias=0, rope_scaling=None,
        generate=0, write_hf_to=None):
    try:
        scaling = json.loads(rope_scaling) if rope_scaling else None
    except ValueError as e:
        raise RefError("--rope-scaling: not JSON (%s)" % e)
    sh = Shape(n_layer, n_head, n_kv_head, rope_theta, rms_eps, tied, qkv_bias,
               scaling)
    params = load_safetensors(params_path)
    V, _, _, _ = check_params(params, sh)
    inputs, targets = load_tokens(tokens_path)
    check_token_range(inputs, targets, V)
    loss, logits, cache = forward(params, sh, inputs, targets)
    check_loss(loss)
    grads = backward(params, sh, cache)
    extra = []
    if generate:
        ids, margins = greedy(params, sh, inputs[0], generate)
        extra = [("generated", ids), ("margin", margins)]
    if write_hf_to:
        write_hf(params, sh, write_hf_to, inputs.shape[1] + max(generate, 0))
    write_result(out_path, loss, logits, grads, param_names(sh), extra)


def main(argv=None):
    return ref_common.main(
        "llama_ref", "float64 reference forward/backward of a LLaMA-family model",
        [("--n-layer", None), ("--n-head", None), ("--n-kv-head", None)], run, argv,
        [("--rope-theta", float, 10000.0, "rotary base theta"),
         ("--rms-eps", float, 1e-5, "RMSNorm epsilon"),
         ("--tied", int, 0, "1: the LM head is embed_tokens (no lm_head.weight)"),
         ("--qkv-bias", int, 0, "1: q/k/v projections carry biases (Qwen2)"),
         ("--rope-scaling", str, None, "JSON of HF's rope_scaling (llama3 only)"),
         ("--generate", int, 0, "also the greedy continuation of the first "
          "sequence's inputs by N tokens: outputs 'generated' and 'margin'"),
         ("--write-hf-to", str, None, "also write the parameters as Hugging "
          "Face saves the model: FOLDER/model.safetensors and config.json")])


if __name__ == "__main__":
    sys.exit(main())
