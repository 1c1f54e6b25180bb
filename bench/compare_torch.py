#!/usr/bin/env python3
"""Side-by-side timing of PyTorch and `attn bench`, alternating in one run.

    python bench/compare_torch.py                      # the issue-4 table (SDPA, causal, padding, MHA)
    python bench/compare_torch.py --sizes 128,1024 --rounds 5 --skip-mha
    python bench/compare_torch.py --isa avx2                 # both sides limited to AVX2

Both sides get the same number of threads (default 2): `torch.set_num_threads(T)` here and
`RAYON_NUM_THREADS=T` for `attn`. Each round runs torch then `attn` on the same shape; the
table quotes the median over rounds of each side's per-round median, and the ratio
torch_ms / attn_ms (> 1 means candle-attention is faster). fp32 unless --dtype says otherwise.

With --fma-peak PATH (a release build of `examples/fma_peak.rs`: `cargo build --release
--example fma_peak`), each round also measures this CPU's multiply-add peak on the same
threads for the run's dtype (the bf16 `vdpbf16ps` peak for bf16; f16 runs on the fp32 units),
and a `ceiling` column gives the largest ratio the CPU allows: torch_ms divided by the time the
case's multiply-adds alone take at that peak (the median of the rounds'). A target ratio above
the ceiling cannot be met by any implementation. The peak is measured in the same run because
this shared virtual machine's speed moves by a third from hour to hour, for torch and for us
alike; --peak-gflops P gives a fixed peak instead. (Key-padded rows count
every key, padding included, as their GFLOP/s column does: their ceiling is generous.)

--isa portable|avx2|avx512 limits both sides to that instruction-set level (like for like on a
CPU that has more): `ATTN_CPU_ISA` for `attn` (and for `fma_peak`, whose peak is then the
level's), `ATEN_CPU_CAPABILITY` (default / avx2 / avx512) and `MKL_ENABLE_INSTRUCTIONS`
(SSE4_2 / AVX2 / AVX512) for torch. torch reads both when it loads, so with --isa this script
re-runs itself with them set before importing torch. The header prints the level each side
ran at (`attn bench` prints its own; torch's is `torch.backends.cpu.get_cpu_capability()`).

Needs torch (PyPI) and a release build of `attn`
(`cargo build --release`; pass --attn PATH if it lives elsewhere).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isa_limits import ISA_ENV, reexec_with_isa_limits  # noqa: E402

reexec_with_isa_limits()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def torch_time(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms)


def attn_json(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def measure_peak(path, threads, dtype):
    """GFLOP/s of the fma_peak example on `threads` threads: bf16 `vdpbf16ps` for bf16, fp32 FMA
    otherwise (at the level ATTN_CPU_ISA allows: the environment is passed on)."""
    out = subprocess.run([path, str(threads)], check=True, capture_output=True, text=True).stdout
    unit = "bf16 vdpbf16ps" if dtype == "bf16" else "fp32 FMA"
    pattern = re.compile(rf"^{threads} thread\(s\): {re.escape(unit)} ([0-9.]+) GFLOP/s")
    for line in out.splitlines():
        m = pattern.match(line)
        if m:
            return float(m.group(1))
    raise SystemExit(f"no '{unit}' line for {threads} thread(s) in the output of {path}:\n{out}")


def attn_isa(attn, env):
    """The instruction-set line `attn bench` prints (what our kernels run at)."""
    out = subprocess.run([attn, "bench", "attention", "--seq-q", "8", "--seq-k", "8", "--iters", "1",
                          "--warmup", "0", "--json"], env=env, check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            return r.get("isa", "?"), r.get("cpu", "?")
    return "?", "?"


def torch_dtype(name):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[name]


def iters_for(n, base):
    # About the same wall time per measurement at every N: fewer iterations for the big
    # shapes (seconds each), more for the small ones (0.2 ms each at N = 128, where 10
    # iterations would time mostly the first calls of a fresh process: thread-pool wake-up,
    # scratch growth, page faults). Both sides always get the same count; at least 3.
    if n > 1024:
        return max(3, base // 3)
    return max(3, base * min(64, (1024 // max(n, 1)) ** 2))


def warmup_for(iters, base):
    return max(base, iters // 10)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "attn"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sizes", default="128,512,1024,4096,8192")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    p.add_argument("--rounds", type=int, default=3, help="alternations torch/attn per shape")
    p.add_argument("--iters", type=int, default=10,
                   help="timed iterations per round at N = 1024 (N > 1024: a third; N < 1024: x (1024/N)^2, at most x64)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--skip-causal", action="store_true")
    p.add_argument("--padding-sizes", default="1024,4096", help="B=4 key padding rows; '' to skip")
    p.add_argument("--mha-sizes", default="128,1024,4096", help="MultiheadAttention(512, 8); '' to skip")
    p.add_argument("--flash-sizes", default="128,1024", help="also time candle-nn flash_attn at these N")
    p.add_argument("--json", action="store_true", help="print every measurement as JSON too")
    p.add_argument("--fma-peak", default=None,
                   help="path of the fma_peak example: measure the peak every round, add the ceiling column")
    p.add_argument("--peak-gflops", type=float, default=None,
                   help="a fixed peak GFLOP/s for the dtype on --threads threads instead of --fma-peak")
    p.add_argument("--isa", choices=sorted(ISA_ENV), default=None,
                   help="limit both sides to this instruction-set level (see the module docs)")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    dt = torch_dtype(a.dtype)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    flash_sizes = {int(x) for x in a.flash_sizes.split(",") if x}
    rows = []

    def round_peak():
        if a.fma_peak:
            return measure_peak(a.fma_peak, a.threads, a.dtype)
        return a.peak_gflops

    def attn_cmd(b, n, causal, impls, iters, key_lengths=None):
        cmd = [a.attn, "bench", "attention", "--batch", str(b), "--heads", str(a.heads),
               "--seq-q", str(n), "--seq-k", str(n), "--head-dim", str(a.head_dim),
               "--dtype", a.dtype, "--iters", str(iters), "--warmup", str(warmup_for(iters, a.warmup)),
               "--impl", ",".join(impls), "--json"]
        if causal:
            cmd.append("--causal")
        if key_lengths:
            cmd += ["--key-lengths", ",".join(str(x) for x in key_lengths)]
        return cmd

    def sdpa_case(label, b, n, causal, key_lengths=None):
        iters = iters_for(n, a.iters)
        torch.manual_seed(0)
        q = torch.randn(b, a.heads, n, a.head_dim, dtype=dt)
        k = torch.randn(b, a.heads, n, a.head_dim, dtype=dt)
        v = torch.randn(b, a.heads, n, a.head_dim, dtype=dt)
        mask = None
        if key_lengths:
            keep = torch.zeros(b, 1, 1, n, dtype=torch.bool)  # torch SDPA: True = attend
            for i, length in enumerate(key_lengths):
                keep[i, ..., :length] = True
            mask = keep
        impls = ["auto"] + (["candle-flash"] if n in flash_sizes and not key_lengths else [])
        t_ms, o_ms, f_ms, peaks = [], [], [], []
        for _ in range(a.rounds):
            with torch.no_grad():
                t_ms.append(torch_time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal),
                                       iters, warmup_for(iters, a.warmup)))
            res = attn_json(attn_cmd(b, n, causal, impls, iters, key_lengths), env)
            peaks.append(round_peak())
            for r in res:
                (o_ms if r["impl"] == "auto" else f_ms).append(r["median_ms"])
                if a.json:
                    print(json.dumps(r))
        flops = 4 * b * a.heads * n * n * a.head_dim * (0.5 if causal else 1.0)
        row = dict(case=label, n=n, torch_ms=statistics.median(t_ms), ours_ms=statistics.median(o_ms),
                   flash_ms=statistics.median(f_ms) if f_ms else None, flops=flops,
                   peak=statistics.median(peaks) if peaks[0] else None)
        rows.append(row)
        print_row(row, bool(peak))

    def mha_case(n):
        iters = iters_for(n, a.iters)
        torch.manual_seed(0)
        e, h = 512, 8
        mha = torch.nn.MultiheadAttention(e, h, batch_first=True).eval().to(dt)
        x = torch.randn(1, n, e, dtype=dt)
        t_ms, o_ms, peaks = [], [], []
        for _ in range(a.rounds):
            with torch.no_grad():
                t_ms.append(torch_time(lambda: mha(x, x, x, need_weights=False), iters, warmup_for(iters, a.warmup)))
            cmd = [a.attn, "bench", "mha", "--seq", str(n), "--embed-dim", str(e), "--heads", str(h),
                   "--dtype", a.dtype, "--iters", str(iters), "--warmup", str(warmup_for(iters, a.warmup)), "--json"]
            peaks.append(round_peak())
            for r in attn_json(cmd, env):
                o_ms.append(r["median_ms"])
                if a.json:
                    print(json.dumps(r))
        flops = 4 * n * n * e + 8 * n * e * e
        row = dict(case="MHA(512,8)", n=n, torch_ms=statistics.median(t_ms), ours_ms=statistics.median(o_ms),
                   flash_ms=None, flops=flops, peak=statistics.median(peaks) if peaks[0] else None)
        rows.append(row)
        print_row(row, bool(peak))

    print(f"# torch {torch.__version__}, {a.threads} threads, {a.dtype}, H={a.heads}, D={a.head_dim}, "
          f"{a.rounds} alternating rounds; medians; ratio = torch / candle-attention (>1: ours faster)")
    ours_isa, cpu = attn_isa(a.attn, env)
    limits = " ".join(f"{k}={os.environ[k]}" for k in ("ATTN_CPU_ISA", "ATEN_CPU_CAPABILITY",
                                                          "MKL_ENABLE_INSTRUCTIONS") if k in os.environ)
    print(f"# ISA: candle-attention {ours_isa}, torch {torch.backends.cpu.get_cpu_capability()}"
          f"{' (' + limits + ')' if limits else ''}; {cpu}")
    print(f"# 1-minute load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    peak = a.fma_peak or a.peak_gflops
    if peak:
        print("# ceiling = torch ms / (the case's multiply-adds at the peak GFLOP/s): the largest ratio this CPU allows")
    print("| case | N | torch ms | candle-attention ms | ratio | ours GFLOP/s | candle-nn flash_attn ms | vs flash |"
          + (" peak GFLOP/s | ceiling | ours % of peak |" if peak else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if peak else ""))
    for n in sizes:
        sdpa_case(f"SDPA B={a.batch}", a.batch, n, False)
        if not a.skip_causal:
            sdpa_case(f"SDPA B={a.batch} causal", a.batch, n, True)
    for n in [int(x) for x in a.padding_sizes.split(",") if x]:
        lengths = [n, (3 * n) // 4, n // 2, n // 4]
        sdpa_case("SDPA B=4 key padding " + "/".join(map(str, lengths)), 4, n, False, lengths)
    for n in [int(x) for x in a.mha_sizes.split(",") if x]:
        mha_case(n)


def print_row(r, with_peak=False):
    flash = f"{r['flash_ms']:.2f}" if r["flash_ms"] else ""
    vs = f"{r['flash_ms'] / r['ours_ms']:.1f}x" if r["flash_ms"] else ""
    gf = r["flops"] / (r["ours_ms"] * 1e6)
    bound = ""
    if with_peak:
        # The case's multiply-adds alone at the peak: no implementation can be faster.
        peak = r["peak"]
        floor_ms = r["flops"] / (peak * 1e6)
        bound = f" {peak:.0f} | {r['torch_ms'] / floor_ms:.2f} | {100 * gf / peak:.0f}% |"
    print(f"| {r['case']} | {r['n']} | {r['torch_ms']:.3f} | {r['ours_ms']:.3f} | "
          f"{r['torch_ms'] / r['ours_ms']:.2f} | {gf:.0f} | {flash} | {vs} |{bound}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
