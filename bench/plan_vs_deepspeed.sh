#!/usr/bin/env bash
# dtrain plan's per-rank bytes with the optimizer (zero-2) or the optimizer
# and the parameters (zero-3) offloaded, beside DeepSpeed's "all cold"
# estimates for the same parameter counts (estimate_zero2_model_states_
# mem_needs_all_cold / estimate_zero3_..., whose formulas are restated in
# the Python below: ZeRO-2 with cpu_offload, ZeRO-3 with cpu_offload and
# cpu_offload_params, zero_init, additional_buffer_factor 1.5).  One node
# of N ranks (DeepSpeed's cpu figure is per node: dtrain's tier bytes per
# rank are multiplied by N).  bf16 compute parameters, as DeepSpeed's fp16.
#
#   bench/plan_vs_deepspeed.sh BUILD/dtrain [N...] > table.md
set -euo pipefail
bin=$(readlink -f "$1"); shift
worlds=${*:-1 8}
work=$(mktemp -d /tmp/dtrain-plan-ds.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
cat > p.toml <<'T'
[model]
dtype = "bf16"
[data]
train = "unused.bin"
[train]
micro_batch = 1
seq_len = 1024
T
echo "| model | N | strategy | dtrain device state/rank | DeepSpeed gpu/rank | dtrain tier/node | DeepSpeed cpu/node |"
echo "|---|---|---|---|---|---|---|"
for model in gpt2-124m gpt2-350m gpt2-774m gpt2-1558m; do
  for n in $worlds; do
    out=$("$bin" plan p.toml --model "$model" --world "$n" --offload offload_cpu \
          --set zero.param_persistence_threshold=0 2>&1)
    /usr/bin/python3 - "$model" "$n" <<P
import re, sys
model, n = sys.argv[1], int(sys.argv[2])
text = """$out"""
def b(s):
    v, u = s.split()
    return float(v) * {"TiB": 2**40, "GiB": 2**30, "MiB": 2**20}[u]
C = {"gpt2-124m": 768, "gpt2-350m": 1024, "gpt2-774m": 1280, "gpt2-1558m": 1600}[model]
L = {"gpt2-124m": 12, "gpt2-350m": 24, "gpt2-774m": 36, "gpt2-1558m": 48}[model]
P = 50257 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C   # GPT-2's parameter count
largest = 50257 * C            # the token embedding (tied with the head)
def row(label, what):
    # the strategy's row, then its offload sub-row "  <what>" (dtrain plan --offload)
    lines = text.splitlines()
    for i, l in enumerate(lines):
        if not l.startswith(label + " "):
            continue
        for s in lines[i + 1:]:
            if s and not s.startswith(" "):
                break
            if s.startswith("  " + what + " "):
                cols = re.findall(r"[0-9.]+ (?:MiB|GiB|TiB)", s)
                if len(cols) < 9:
                    return None, None
                return b(cols[5]), b(cols[8])   # model state (params + grads + optimizer), tier/rank
    return None, None
fmt = lambda x: "%.2f GiB" % (x / 2**30)
# DeepSpeed, one node of n GPUs
z2_gpu, z2_cpu = 2 * P, P * max(4 * n, 16) * 1.5
z3_gpu, z3_cpu = 4 * largest, P * 18 * 1.5
for label, what, gpu, cpu in (("zero-2", "optimizer", z2_gpu, z2_cpu),
                              ("zero-3", "optimizer_and_params", z3_gpu, z3_cpu)):
    dev, tier = row(label, what)
    if dev is None:
        print("| %s | %d | %s | not planned | | | |" % (model, n, label)); continue
    print("| %s | %d | %s | %s | %s | %s | %s |" % (model, n, label, fmt(dev), fmt(gpu), fmt(tier * n), fmt(cpu)))
P
  done
done
