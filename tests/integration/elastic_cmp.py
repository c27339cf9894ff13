#!/usr/bin/env python3
# tests/integration/elastic_cmp.py - an elastic run's losses against the
# uninterrupted runs they must equal (test_elastic.sh).  Rank 0's --metrics
# file of an elastic run is appended to by every round, so a step trained
# again after a restart appears twice; the round that counts is the last
# that trained it (a round resumes after the newest checkpoint, so no later
# round trains a step below it again).
#   elastic_cmp.py RUN.jsonl FIRST LAST REF.jsonl TOL
#       the losses of steps FIRST..LAST (each step's last line in RUN)
#       equal REF's same steps within TOL (0: bit for bit); prints the
#       largest difference; exits 1 when over TOL or a step is missing
import json, sys

def losses(p):
    out = {}
    for l in open(p):
        if l.startswith('{"step"'):
            x = json.loads(l)
            out[x["step"]] = x["loss"]
    return out

run, ref = losses(sys.argv[1]), losses(sys.argv[4])
first, last, tol = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[5])
miss = [s for s in range(first, last + 1) if s not in run or s not in ref]
if miss:
    print("steps missing: %s" % miss[:10])
    sys.exit(1)
d = max(abs(run[s] - ref[s]) for s in range(first, last + 1))
print("max diff %.3g over %d steps" % (d, last - first + 1))
sys.exit(0 if d <= tol else 1)
