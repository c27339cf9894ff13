"""What dtrain's float64 oracles (gpt2_ref.py, mlp_ref.py) and their
self-checks share, written once: safetensors and token-file I/O, the input
checks and their messages, the layers both models use (linear, GELU), the
mean cross-entropy, the command line, and the self-checks' fixtures (an
independent F32 writer, running an oracle, finite differences, bad-input
expectations, the PASS/FAIL driver).

Only the standard library and numpy; no autograd.  Not a program: imported
by the scripts beside it (which set sys.dont_write_bytecode first).
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import traceback

import numpy as np

GELU_SCALE = math.sqrt(2.0 / math.pi)

_ST_DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8")}


class RefError(Exception):
    """Bad input; the message is printed and the program exits with 1."""


# --------------------------------------------------------------------------
# safetensors and token I/O

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise RefError("cannot read %s: %s" % (path, e.strerror))


def load_safetensors(path):
    """Returns {name: float64 ndarray} from a safetensors file.

    Checks the header thoroughly because a malformed file written by the C
    side should fail loudly here rather than produce a misleading oracle."""
    blob = _read(path)
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


def save_safetensors(path, tensors, dtype="F64"):
    """Writes [(name, ndarray)] as little-endian F64 (or "F32")
    safetensors, in order.

    The header is padded with spaces so the data starts 8-byte aligned, as
    the format requires."""
    header = {}
    chunks = []
    offset = 0
    for name, arr in tensors:
        a = np.ascontiguousarray(arr, dtype=_ST_DTYPES[dtype])
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
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
    blob = _read(path)
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
# input checks

def check_names(params, names, flag):
    """Every name in `names` present and no other; `flag` ("--n-layer=3")
    is the command-line value a stray tensor usually means is wrong."""
    for name in names:
        if name not in params:
            raise RefError("missing tensor '%s' in params" % name)
    extra = sorted(set(params) - set(names))
    if extra:
        raise RefError("unexpected tensor '%s' in params (is %s right?)"
                       % (extra[0], flag))


def check_shapes(params, want):
    """want: {name: expected shape tuple}."""
    for name, shape in want.items():
        got = tuple(params[name].shape)
        if got != shape:
            raise RefError("tensor '%s': shape %s does not match expected %s"
                           % (name, list(got), list(shape)))


def check_token_range(inputs, targets, V):
    for what, toks in (("input", inputs), ("target", targets)):
        bad = np.flatnonzero((toks < 0) | (toks >= V))
        if bad.size:
            i = int(bad[0])
            raise RefError("%s token %d at flat position %d out of range "
                           "[0, %d)" % (what, int(toks.flat[i]), i, V))


# --------------------------------------------------------------------------
# layers: <op>_forward returns (out, cache); <op>_backward returns the input
# gradient (and, for layers with parameters, theirs).

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


def cross_entropy_forward(logits, targets):
    """Mean over all (B, T) positions of -log softmax(logits)[target];
    returns (loss, probs)."""
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    z = e.sum(axis=-1, keepdims=True)
    logp = logits - m - np.log(z)
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return float(nll.mean()), e / z


def cross_entropy_backward(probs, targets):
    """d(mean loss)/d(logits) (B, T, V)."""
    B, T = targets.shape
    dlogits = probs.copy()
    bi, ti = np.meshgrid(np.arange(B), np.arange(T), indexing="ij")
    dlogits[bi, ti, targets] -= 1.0
    dlogits /= B * T
    return dlogits


# --------------------------------------------------------------------------
# the programs

def check_loss(loss):
    """A non-finite loss means bad parameters: no oracle to give."""
    if not math.isfinite(loss):
        raise RefError("loss is not finite (%r); check the parameters" % loss)


def write_result(path, loss, logits, grads, names, extra=()):
    """The oracle's output: "loss" [1], "logits", "grad.<name>" in order,
    then `extra` [(name, array)]."""
    out = [("loss", np.array([loss])), ("logits", logits)]
    out += [("grad." + n, grads[n]) for n in names]
    out += list(extra)
    try:
        save_safetensors(path, out)
    except OSError as e:
        raise RefError("cannot write %s: %s" % (path, e.strerror))


def main(prog, description, model_args, run, argv=None, options=()):
    """The command line every oracle takes: --params, --tokens, --out, and
    `model_args` [(flag, help)] (integers, required); calls
    run(params, tokens, out, *model values, **options), `options` being
    the oracle's own optional flags [(flag, type, default, help)] by name
    ("--write-hf" -> write_hf).  Exit status 0 on success, 1 on bad input
    (message on stderr), 2 on bad usage (argparse)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--params", required=True, help="input .safetensors")
    ap.add_argument("--tokens", required=True, help="input T.bin (int32)")
    ap.add_argument("--out", required=True, help="output .safetensors (F64)")
    for flag, help_ in model_args:
        ap.add_argument(flag, type=int, required=True, help=help_)
    for flag, type_, default, help_ in options:
        ap.add_argument(flag, type=type_, default=default, help=help_)
    a = ap.parse_args(argv)
    values = [getattr(a, flag[2:].replace("-", "_")) for flag, _ in model_args]
    kw = {o[0][2:].replace("-", "_"): getattr(a, o[0][2:].replace("-", "_"))
          for o in options}
    try:
        run(a.params, a.tokens, a.out, *values, **kw)
    except RefError as e:
        print("%s: error: %s" % (prog, e), file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------
# self-check fixtures (test_*_ref_selfcheck.py)

# Finite differences: central, step 1e-6.  Truncation error is O(eps^2) ~
# 1e-12 and rounding error ~ ulp(loss)/eps ~ 1e-10, so an entry passes when
# |analytic - fd| <= max(1e-6 * |fd|, 1e-9).
FD_EPS = 1e-6
FD_RTOL = 1e-6
FD_ATOL = 1e-9


def write_params(path, params, names, drop=None, reshape=None,
                 metadata=None):
    """Writes F32 safetensors of params[name] for `names` in order, with
    its own writer (not the oracle's): without `drop`, with tensor
    reshape[0] reshaped to reshape[1], with a "__metadata__" entry (which
    the reader must ignore) when given."""
    header = {"__metadata__": metadata} if metadata is not None else {}
    chunks, off = [], 0
    for name in names:
        if name == drop:
            continue
        a = params[name].astype("<f4")
        if reshape and name == reshape[0]:
            a = a.reshape(reshape[1])
        raw = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def write_tokens(path, inputs, targets):
    b, t = inputs.shape
    with open(path, "wb") as f:
        f.write(struct.pack("<ii", b, t))
        f.write(np.asarray(inputs, dtype="<i4").tobytes())
        f.write(np.asarray(targets, dtype="<i4").tobytes())


def run_script(script, d, params_path, tokens_path, args):
    """Runs oracle `script` as the C tests do, into d/out.safetensors
    (removed first); returns (CompletedProcess, out path)."""
    out = os.path.join(d, "out.safetensors")
    if os.path.exists(out):
        os.remove(out)
    r = subprocess.run(
        [sys.executable, script, "--params", params_path, "--tokens",
         tokens_path, "--out", out] + [str(a) for a in args],
        capture_output=True, text=True, timeout=60)
    return r, out


def read_out(path):
    """Returns (header length, file bytes, header dict, {name: array})."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    return hlen, blob, header, load_safetensors(path)


def check_grads_fd(grads, params, names, loss_of):
    """Every entry of grads["grad.<name>"] against central finite
    differences of loss_of() as params (changed in place, restored) move.
    Returns (entries checked, (worst diff/tol, where))."""
    worst = (0.0, None)
    nchecked = 0
    for name in names:
        g = grads["grad." + name]
        p = params[name]
        assert g.shape == p.shape, "grad.%s shape %s vs param %s" % (
            name, g.shape, p.shape)
        for idx in np.ndindex(p.shape):  # every entry of every tensor
            orig = p[idx]
            p[idx] = orig + FD_EPS
            lp = loss_of()
            p[idx] = orig - FD_EPS
            lm = loss_of()
            p[idx] = orig
            fd = (lp - lm) / (2 * FD_EPS)
            diff = abs(g[idx] - fd)
            tol = max(FD_RTOL * abs(fd), FD_ATOL)
            assert diff <= tol, ("grad.%s%s: analytic %.12g vs fd %.12g "
                                 "(diff %.3g > tol %.3g)"
                                 % (name, list(idx), g[idx], fd, diff, tol))
            if diff / tol > worst[0]:
                worst = (diff / tol, "grad.%s%s" % (name, list(idx)))
            nchecked += 1
    return nchecked, worst


def expect_error(run, needle):
    """run() -> (CompletedProcess, out path) of an oracle on bad input: it
    must exit 1, say `needle` on stderr and write no output."""
    r, out = run()
    assert r.returncode == 1, "exit %d for %r, stderr %r" % (
        r.returncode, needle, r.stderr)
    assert needle in r.stderr, "%r not in stderr %r" % (needle, r.stderr)
    assert not os.path.exists(out), "output written despite error"


def run_checks(name, cases):
    """cases: [(label, make_ctx, [check(ctx)])]; a case whose context
    cannot be built fails all its checks.  Prints PASS/FAIL per check and
    "<name> selfcheck: N passed, M failed"; returns the exit status."""
    passed = failed = 0
    for label, make_ctx, checks in cases:
        try:
            ctx = make_ctx()
        except Exception:
            traceback.print_exc()
            failed += len(checks)
            continue
        for chk in checks:
            try:
                chk(ctx)
                print("PASS %s%s" % (chk.__name__, label))
                passed += 1
            except Exception:
                traceback.print_exc()
                print("FAIL %s%s" % (chk.__name__, label))
                failed += 1
    print("%s selfcheck: %d passed, %d failed" % (name, passed, failed))
    return 0 if failed == 0 else 1
