#!/usr/bin/env python3
"""Accuracy of half-precision attention: ours against torch's and against an f64 reference.

    python bench/half_accuracy.py [--example PATH] [--n 1024] [--dtype bf16]

For each case (SDPA B=1 H=8 D=64 L=S=N; causal; B=4 with key padding N, 3N/4, N/2, N/4) it
draws q, k, v ~ N(0, 1) with torch (seeded), rounds them to the dtype, and compares on those
same rounded inputs:

* torch: `F.scaled_dot_product_attention` in the dtype (CPU, its own half-precision kernel);
* ours: `examples/sdpa_accuracy.rs` (the tiled kernel: for bf16 the AVX-512 BF16 `vdpbf16ps`
  path where the CPU has it, and the per-tile f32 conversion path `half_dot = false`);

against the reference: the same attention in float64 (`torch.float64`, math backend). Prints
max and mean absolute error over all output elements.

Needs a release build of the example (`cargo build --release --example sdpa_accuracy`).
Pinned: torch 2.15.0, safetensors 0.8.0, numpy 2.4.6 (the versions this was run with).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(os.path.dirname(__file__), "..", "target"))
    p.add_argument("--example", default=os.path.join(target, "release", "examples", "sdpa_accuracy"))
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    n, h, d = a.n, 8, 64
    print(f"# {a.dtype}, N={n}, H={h}, D={d}; max / mean abs error against f64 on the same rounded inputs")
    print("| case | torch (its own) | ours (default) | ours (f32 tiles) |")
    print("|---|---|---|---|")
    for name, b, causal, lengths in [
        ("SDPA", 1, False, None),
        ("SDPA causal", 1, True, None),
        ("SDPA B=4 key padding", 4, False, [n, 3 * n // 4, n // 2, n // 4]),
    ]:
        g = torch.Generator().manual_seed(a.seed)
        q, k, v = (torch.randn(b, h, n, d, generator=g).to(dt) for _ in range(3))
        mask64 = None
        tensors = {"q": q.contiguous(), "k": k.contiguous(), "v": v.contiguous()}
        if lengths:
            keep = torch.zeros(b, 1, 1, n, dtype=torch.bool)
            for i, length in enumerate(lengths):
                keep[i, ..., :length] = True
            mask64 = keep
            tensors["key_padding"] = (~keep[:, 0, 0, :]).to(torch.uint8).contiguous()
        with torch.no_grad():
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask64, is_causal=causal)
            theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask64, is_causal=causal).double()
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
            save_file(tensors, src)
            cmd = [a.example, src, dst] + (["--causal"] if causal else [])
            subprocess.run(cmd, check=True)
            outs = load_file(dst)
        ours, conv = outs["out"].double(), outs["out_converted"].double()

        def err(x):
            e = (x - ref).abs()
            return f"{e.max().item():.2e} / {e.mean().item():.2e}"

        print(f"| {name} | {err(theirs)} | {err(ours)} | {err(conv)} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
