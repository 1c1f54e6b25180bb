#!/usr/bin/env python3
"""Two builds of `attn` side by side, alternating in one run: is a change speed-neutral?

    python3 bench/compare_builds.py --a OLD/attn --b NEW/attn                 # attention, MHA
    python3 bench/compare_builds.py --a OLD --b NEW --model DIR --rounds 7    # + attn generate

Each round runs every case once with build A, then once with build B, then (next round) B
first, then A, so that a drift of the machine's speed (these are shared virtual machines)
falls on both alike. Quoted: the median over rounds of each build's time, the ratio
B / A (< 1: B faster), and, for `attn generate`, the child's CPU seconds (user + system) too.

Cases
* `attn bench attention` (f32, B=1, H=8, D=64, N = --sizes, plain and causal) and
  `attn bench mha` (MultiheadAttention(512, 8), N = --mha-sizes): the median of the tool's
  own iterations (`--json`'s `median_ms`).
* with --model DIR (a MarianMT directory, e.g. the opus-mt-sized random one that
  bench/compare_marian.py --model-dir DIR creates): the whole process `attn generate` for
  batch 1 greedy, batch 8 greedy and batch 8 beam 4, exactly 32 new tokens from 24-token
  sources (random ids, seeded; written once to DIR/compare_builds_b{1,8}.safetensors).

Threads: RAYON_NUM_THREADS = --threads (default 2) for both builds. Needs only Python 3 and
the two binaries (torch, if present, only writes the inputs).
"""
import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time


def write_inputs(path, batch, src_len, vocab, seed):
    """int64 input_ids (batch, src_len) ending in eos 0, attention_mask all ones."""
    import random
    rng = random.Random(seed)
    ids = []
    for _ in range(batch):
        ids += [rng.randrange(2, vocab - 1) for _ in range(src_len - 1)] + [0]
    mask = [1] * (batch * src_len)
    tensors = {"input_ids": ids, "attention_mask": mask}
    header, offset, blobs = {}, 0, []
    for name, values in tensors.items():
        blob = struct.pack(f"<{len(values)}q", *values)
        header[name] = {"dtype": "I64", "shape": [batch, src_len], "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bench_ms(attn, args, env):
    out = subprocess.run([attn] + args, env=env, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows[0]["median_ms"]


def process_s(attn, args, env):
    t = time.perf_counter()
    before = os.times()
    subprocess.run([attn] + args, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - t
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall * 1e3, cpu * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="build A (the baseline)")
    p.add_argument("--b", required=True, help="build B (the change)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default="128,512,1024")
    p.add_argument("--mha-sizes", default="128,1024")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--model", help="a MarianMT directory: also time attn generate")
    p.add_argument("--vocab", type=int, default=58101, help="the model's vocabulary (for the random inputs)")
    a = p.parse_args()
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))

    cases = []
    for n in [int(x) for x in a.sizes.split(",") if x]:
        iters = max(3, a.iters if n <= 1024 else a.iters // 4)
        for causal in (False, True):
            args = ["bench", "attention", "--batch", "1", "--heads", "8", "--seq-q", str(n), "--seq-k", str(n),
                    "--head-dim", "64", "--dtype", "f32", "--iters", str(iters), "--warmup", "2", "--json"]
            cases.append((f"SDPA B=1{' causal' if causal else ''} N={n}", "bench", args + (["--causal"] if causal else [])))
    for n in [int(x) for x in a.mha_sizes.split(",") if x]:
        args = ["bench", "mha", "--seq", str(n), "--embed-dim", "512", "--heads", "8", "--dtype", "f32",
                "--iters", str(a.iters), "--warmup", "2", "--json"]
        cases.append((f"MHA(512,8) N={n}", "bench", args))
    if a.model:
        for batch, beams in ((1, 1), (8, 1), (8, 4)):
            inputs = os.path.join(a.model, f"compare_builds_b{batch}.safetensors")
            if not os.path.exists(inputs):
                write_inputs(inputs, batch, 24, a.vocab, seed=batch)
            out = os.path.join(a.model, "compare_builds_out.safetensors")
            args = ["generate", "--model", a.model, "--inputs", inputs, "--output", out, "--beams", str(beams),
                    "--max-new-tokens", "32", "--min-new-tokens", "32"]
            cases.append((f"generate b{batch}{f' beam {beams}' if beams > 1 else ' greedy'}", "process", args))

    times = {c[0]: {"a": [], "b": [], "a_cpu": [], "b_cpu": []} for c in cases}
    for r in range(a.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        for label, kind, args in cases:
            for side in order:
                attn = a.a if side == "a" else a.b
                if kind == "bench":
                    times[label][side].append(bench_ms(attn, args, env))
                else:
                    wall, cpu = process_s(attn, args, env)
                    times[label][side].append(wall)
                    times[label][side + "_cpu"].append(cpu)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)

    load = os.getloadavg()[0]
    print(f"# {a.rounds} alternating rounds, {a.threads} threads, load {load:.1f}; medians; ratio = B / A (< 1: B faster)")
    print(f"# A = {a.a}\n# B = {a.b}")
    print("| case | A ms | B ms | B / A | A CPU s | B CPU s |")
    print("|---|---|---|---|---|---|")
    for label, _, _ in cases:
        t = times[label]
        ma, mb = statistics.median(t["a"]), statistics.median(t["b"])
        cpu = ("| {:.2f} | {:.2f} |".format(statistics.median(t["a_cpu"]) / 1e3, statistics.median(t["b_cpu"]) / 1e3)
               if t["a_cpu"] else "| | |")
        print(f"| {label} | {ma:.2f} | {mb:.2f} | {mb / ma:.3f} {cpu}")


if __name__ == "__main__":
    main()
