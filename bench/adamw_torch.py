#!/usr/bin/env python3
# bench/adamw_torch.py - the peer of bench_adamw: torch.optim.AdamW with
# fused=True (PyTorch's own fused CPU kernel) stepping one flat f32
# parameter of N elements, the same values and hyper-parameters as
# bench/bench_adamw.c, on each thread count; best of REPS steps.  Prints
# one line per thread count: "torch THREADS GB/s Mparams/s" (28 bytes of
# traffic per parameter, as bench_adamw counts).
#   adamw_torch.py N THREADS(1,2) REPS
import sys, time, warnings
warnings.filterwarnings("ignore")  # torch without numpy says so on import
import torch

n, threads, reps = int(sys.argv[1]), [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
i = torch.arange(n, dtype=torch.int64)
p = torch.nn.Parameter((i % 97).to(torch.float32) * 0.01)
p.grad = (i % 89).to(torch.float32) * 0.001 - 0.04
del i
opt = torch.optim.AdamW([p], lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
for _ in range(9):  # the bias corrections of step 10, as bench_adamw
    opt.step()
for t in threads:
    torch.set_num_threads(t)
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    print("torch %d %.2f %.1f" % (t, 28.0 * n / best / 1e9, n / best / 1e6))
