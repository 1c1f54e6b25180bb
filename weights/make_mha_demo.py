#!/usr/bin/env python3
"""Write the small demo checkpoint used by `examples/mha_from_safetensors.rs`.

    python3 -m venv .venv && .venv/bin/pip install torch safetensors
    .venv/bin/python weights/make_mha_demo.py

Outputs (deterministic, seed 0):
  weights/mha_demo.safetensors         torch.nn.MultiheadAttention(64, 8, batch_first=True)
                                       state_dict under the prefix "self_attn"
  weights/mha_demo_io.safetensors      query (2, 6, 64) batch first, key_padding_mask (2, 6)
                                       bool (true = padding), and torch's outputs:
                                       expected_output (2, 6, 64), expected_weights (2, 6, 6)
                                       for a causal self-attention call.
"""
import pathlib

import torch
from safetensors.torch import save_file

torch.manual_seed(0)
torch.set_num_threads(1)
here = pathlib.Path(__file__).resolve().parent

mha = torch.nn.MultiheadAttention(64, 8, batch_first=True).eval()
with torch.no_grad():
    for p in mha.parameters():
        p.copy_(torch.randn_like(p) * (0.25 if p.dim() > 1 else 0.1))
query = torch.randn(2, 6, 64)
key_padding_mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
with torch.no_grad():
    out, weights = mha(query, query, query, key_padding_mask=key_padding_mask, attn_mask=causal,
                       need_weights=True)

save_file({f"self_attn.{k}": v.contiguous() for k, v in mha.state_dict().items()},
          str(here / "mha_demo.safetensors"))
save_file({"query": query, "key_padding_mask": key_padding_mask, "expected_output": out,
           "expected_weights": weights}, str(here / "mha_demo_io.safetensors"))
print("wrote", here / "mha_demo.safetensors", here / "mha_demo_io.safetensors")
