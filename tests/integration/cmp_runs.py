#!/usr/bin/env python3
# tests/integration/cmp_runs.py - two training runs compared, for the
# layout tests (test_pipeline.sh, test_tensor.sh: lib.sh's same_as_n1):
#   cmp_runs.py curves A.jsonl B.jsonl LOSS_TOL NORM_TOL
#       every step's loss and grad norm (and the validation losses where
#       the first has them) within the tolerances, from --metrics files
#   cmp_runs.py params A.st B.st TOL
#       every tensor of two safetensors exports (`dtrain export --layout
#       dtrain`) within TOL absolute
# Prints the largest differences; exits 1 when one is over its tolerance.
import json, struct, sys
def steps(p):
    return [json.loads(l) for l in open(p) if l.startswith('{"step"')]
if sys.argv[1] == "curves":
    a, b = steps(sys.argv[2]), steps(sys.argv[3])
    lt, nt = float(sys.argv[4]), float(sys.argv[5])
    assert [x["step"] for x in a] == [x["step"] for x in b], "different steps"
    dl = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
    dn = max(abs(x["grad_norm"] - y["grad_norm"]) for x, y in zip(a, b))
    # validation losses where the reference has them (evaluation runs the
    # forward-only schedule)
    assert all(("val_loss" in x) == ("val_loss" in y) for x, y in zip(a, b)), "val steps"
    vals = [abs(x["val_loss"] - y["val_loss"]) for x, y in zip(a, b) if "val_loss" in x]
    dv = max(vals) if vals else 0.0
    print("max loss diff %.3g, max grad norm diff %.3g over %d steps, max val loss diff %.3g "
          "over %d evaluations" % (dl, dn, len(a), dv, len(vals)))
    sys.exit(0 if dl <= lt and dn <= nt and dv <= lt else 1)
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: np.frombuffer(d[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[2]), load(sys.argv[3])
assert a.keys() == b.keys(), "different tensor names"
worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
print("max parameter diff %.3g over %d tensors" % (worst, len(a)))
sys.exit(0 if worst <= float(sys.argv[4]) else 1)
