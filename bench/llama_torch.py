#!/usr/bin/env python3
# bench/llama_torch.py - the peer of dtrain's llama step on the cpu:
# Hugging Face transformers' LlamaForCausalLM in PyTorch eager (float32,
# its default "sdpa" attention), one training step = forward, mean
# cross-entropy, backward and torch.optim.AdamW(fused=True), on random
# tokens, with torch.set_num_threads(THREADS).  Untimed warm-up steps
# first; prints "torch <mean ms> <min ms>" over the timed steps.
#
#   llama_torch.py --layers L --heads H --kv-heads K --embd C --inter I \
#       --vocab V --batch B --seq T --threads N [--steps 5] [--warmup 1]
#       [--tied 0|1] [--rope-theta 10000]
import argparse
import time
import warnings

warnings.filterwarnings("ignore")  # torch without numpy says so on import
import torch  # noqa: E402
import transformers  # noqa: E402

ap = argparse.ArgumentParser()
for k in ("layers", "heads", "kv-heads", "embd", "inter", "vocab", "batch", "seq",
          "threads"):
    ap.add_argument("--" + k, type=int, required=True)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--tied", type=int, default=0)
ap.add_argument("--rope-theta", type=float, default=10000.0)
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
cfg = transformers.LlamaConfig(
    vocab_size=a.vocab, hidden_size=a.embd, intermediate_size=a.inter,
    num_hidden_layers=a.layers, num_attention_heads=a.heads,
    num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
    rope_theta=a.rope_theta, tie_word_embeddings=bool(a.tied),
    attention_dropout=0.0)
model = transformers.LlamaForCausalLM(cfg).float().train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                        weight_decay=0.1, fused=True)
g = torch.Generator().manual_seed(1)
x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
inp, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()


def step():
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=inp).logits
    loss = torch.nn.functional.cross_entropy(logits.view(-1, a.vocab), tgt.view(-1))
    loss.backward()
    opt.step()
    return loss.item()


for _ in range(a.warmup):
    step()
times = []
for _ in range(a.steps):
    t0 = time.perf_counter()
    step()
    times.append((time.perf_counter() - t0) * 1e3)
print("torch %.1f %.1f" % (sum(times) / len(times), min(times)))
