#!/usr/bin/env python3
# examples/finetune-llama/make_tiny_llama.py - write a tiny Hugging Face
# LlamaForCausalLM folder (config.json + model.safetensors, random
# weights, float32) for the fine-tuning example, with numpy only: what a
# downloaded model's folder holds, small enough to train in seconds.  The
# vocabulary (1280 ids) covers tokenizer.json's 1201 (a byte-level BPE
# tokenizer the project trained, tests/data/tokenizers/llama3.json).
#
#   make_tiny_llama.py OUT_DIR [--seed N]
import argparse
import json
import os
import struct

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

cfg = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 1280, "hidden_size": 64, "intermediate_size": 176,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 128, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "hidden_act": "silu", "torch_dtype": "float32",
    "bos_token_id": 0, "eos_token_id": 1,
}
rng = np.random.default_rng(a.seed)
C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
HD = cfg["head_dim"]
Q, KV = cfg["num_attention_heads"] * HD, cfg["num_key_value_heads"] * HD
t = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,),
     "lm_head.weight": (V, C)}
for i in range(cfg["num_hidden_layers"]):
    p = "model.layers.%d." % i
    t.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
              p + "self_attn.q_proj.weight": (Q, C), p + "self_attn.k_proj.weight": (KV, C),
              p + "self_attn.v_proj.weight": (KV, C), p + "self_attn.o_proj.weight": (C, Q),
              p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
              p + "mlp.down_proj.weight": (C, I)})
# transformers' init: normal(0, 0.02) weights, norms at 1
arrays = {k: (np.ones(s) if len(s) == 1 else rng.normal(0, 0.02, s)).astype("<f4")
          for k, s in sorted(t.items())}

# safetensors: an 8-byte little-endian header length, the JSON header,
# then the tensors' bytes back to back
header, off = {}, 0
for k, x in arrays.items():
    header[k] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [off, off + x.nbytes]}
    off += x.nbytes
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
os.makedirs(a.out, exist_ok=True)
with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for x in arrays.values():
        f.write(x.tobytes())
with open(os.path.join(a.out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
print("wrote %s/config.json and model.safetensors (%d parameters)"
      % (a.out, sum(x.size for x in arrays.values())))
