"""How far a batch-1 MarianMT decoding step is from the memory-bandwidth bound, measured in
alternating rounds on a shared, noisy machine.

A batch-1 step reads every decoder weight it uses once (the output projection included) and
does little else, so its floor is bytes / read bandwidth. Each round measures the machine's
read bandwidth first (`examples/mem_bandwidth`: 2 threads, 256 MiB, best of 5 passes: an
optimistic bound) and then times 64 greedy steps (`examples/marian_speed`, on rayon's pool as
`attn` runs), so that the two see the same load; the ratio step / bound of each round is
printed with the median over rounds. The first round also warms the page cache (a model file
evicted from it is read from disk: its round says so and is left out).

The bytes per step are counted from the safetensors header: the decoder layers' matrices and
biases except the cross-attention key and value projections (computed once per sentence), and
the output projection (`lm_head.weight`, or the tied `model.shared.weight`).

    cargo build --release --example marian_speed --example mem_bandwidth
    python3 bench/step_bound.py --model-dir DIR --inputs IN_B1.safetensors [--isa avx2] [--rounds 5]
"""
import argparse
import json
import os
import re
import statistics
import struct
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def step_bytes(model_dir):
    """Bytes of weights one batch-1 decoding step reads (see the module's documentation)."""
    with open(Path(model_dir) / "model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    size = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__"}
    total = 0
    for name, b in size.items():
        decoder = ".decoder.layers." in name or name.startswith("decoder.layers.")
        once_per_sentence = "encoder_attn.k_proj" in name or "encoder_attn.v_proj" in name
        if decoder and not once_per_sentence:
            total += b
    head = "lm_head.weight" if "lm_head.weight" in size else "model.shared.weight"
    total += size[head] + size.get("final_logits_bias", 0)
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--inputs", required=True, help="safetensors with input_ids and attention_mask (one row)")
    ap.add_argument("--isa", default=None, help="ATTN_CPU_ISA for our kernels (portable, avx2, avx512)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="f32", help="f32, bf16 or int8 (bytes counted from the "
                    "model's safetensors: pass an `attn convert` directory for int8 or bf16)")
    args = ap.parse_args()
    examples = ROOT / "target" / "release" / "examples"
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    if args.isa:
        env["ATTN_CPU_ISA"] = args.isa
    nbytes = step_bytes(args.model_dir)
    print(f"# {nbytes / 1e6:.1f} MB of weights per step; {args.threads} threads; kernels: "
          f"{args.isa or 'best level'}; {args.rounds} alternating rounds")
    print("round  bandwidth GB/s  bound ms  step ms  step / bound")
    ratios = []
    for r in range(args.rounds + 1):
        bw_out = subprocess.run([examples / "mem_bandwidth", str(args.threads), "256"], capture_output=True,
                                text=True, check=True).stdout
        bw = float(re.search(r"read ([0-9.]+) GB/s", bw_out).group(1))
        out = subprocess.run([examples / "marian_speed", args.model_dir, args.inputs, str(args.steps), args.precision],
                             capture_output=True, text=True, check=True, env=env).stdout
        step = float(re.search(r"\(([0-9.]+) ms/step", out).group(1))
        bound = nbytes / (bw * 1e9) * 1e3
        note = "  (warm-up: page cache)" if r == 0 else ""
        print(f"{r:5d}  {bw:14.1f}  {bound:8.2f}  {step:7.2f}  {step / bound:12.2f}{note}")
        if r > 0:
            ratios.append(step / bound)
    print(f"median step / bound: {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
