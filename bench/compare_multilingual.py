#!/usr/bin/env python3
"""Side-by-side speed and memory of `attn generate` and transformers'
`M2M100ForConditionalGeneration.generate()` on an NLLB-200-distilled-600M-sized model.

    /work/venv/bin/python bench/compare_multilingual.py --size small      # a quick check
    /work/venv/bin/python bench/compare_multilingual.py --model-dir /tmp/nllb600m_rand --runs 3
    /work/venv/bin/python bench/compare_multilingual.py --runs 3 --json
    /work/venv/bin/python bench/compare_multilingual.py --isa avx2 --model-dir /tmp/nllb600m_rand

The model (`--size 600m`, the default) is an M2M100ForConditionalGeneration with the config of
facebook/nllb-200-distilled-600M and RANDOM weights (seeded; linear weights normal(0,
1/sqrt(fan_in)), the shared table normal(0, 0.02), random layer norms and biases, the decoder's
final layer norm with random signs: transformers' own init makes every output repeat the forced
language token, see `reinit`): d_model 1024, 12 + 12 layers (pre-norm, final layer norms), 16 heads, ffn 4096, relu,
vocab 256206 (one table shared by both embeddings and the tied output projection),
max_position_embeddings 1024 (sinusoidal, not stored), scale_embedding, pad 1, bos 0, eos 2,
decoder_start 2, dropout 0.1 / attention_dropout 0.1 / layerdrop 0 (inert in eval). It is saved
with save_pretrained: `model.safetensors` (f32, 615.1 M parameters, 2.46 GB: the 256206 x 1024
table alone is 1.05 GB) plus NLLB's own generation_config.json (bos 0, decoder start 2, eos 2,
pad 1, max_length 200; no forced_bos_token_id: as with the real model the target language is
passed per call). `--size small` is the same architecture at d_model 64, 2 + 2 layers, 4 heads,
ffn 128, vocab 4096 (seconds, for testing the script). `--model-dir` keeps the created model
and reuses it (creating the 600m one peaks at 5.1 GB of memory and takes 40 s to 2.5 min on a
busy 2-core machine).

Languages: the real NLLB layout puts the 202 language tokens at 256001.. (alphabetical, after
the 256000 SentencePiece ids + 1); the source rows start with eng_Latn = 256047 and the target
language is deu_Latn = 256042 (`forced_bos_token_id`). The small size uses 4000 (target) and
4001 (source): with random weights any id below the vocabulary works the same.

Inputs: B source rows of exactly 24 tokens, `[eng_Latn] 22 random ids in 4..255999 </s>`, no
padding, attention_mask all ones. Every run generates exactly 32 new tokens per returned row
(`min_new_tokens = max_new_tokens = 32`; the first is the forced target language, the rest
argmax / beam search over the random model). Settings: batch 1 greedy, batch 8 greedy, batch 8
beam 4.

Threads: `torch.set_num_threads(T)` here and `RAYON_NUM_THREADS=T` for `attn` (default T = 2).

What is timed
* transformers: `model.generate(input_ids=, attention_mask=, num_beams=N, max_new_tokens=32,
  min_new_tokens=32, forced_bos_token_id=256042)` with the model already loaded
  (`from_pretrained`, eval, fp32, default attention implementation); median of --runs after
  --warmup calls.
* ours: the WHOLE process `attn generate --model DIR --inputs IN.safetensors --output
  OUT.safetensors --beams N --max-new-tokens 32 --min-new-tokens 32 --forced-bos-token-id
  256042` (start-up, mapping the 2.46 GB file and the encoder included); median of --runs after
  --warmup runs. Peak RSS of that process comes from `/usr/bin/time -f %M` (the command's own
  peak, mapped file pages included; the largest over the timed runs), and is quoted against
  the size of model.safetensors (target: at most 1.2x).
tokens/s = B x 32 / seconds (for beam search also B x 32: returned tokens, not beam tokens).
ratio = ours tok/s / transformers tok/s (> 1 means candle-attention is faster).
--json adds CPU seconds (process_time for transformers, the child's user + system time for
ours), the load average, and this Python process's own peak RSS (transformers' side, model
included): on a shared machine wall times mostly measure the neighbours.

The batch-1 step against the memory bound (setting b1_greedy, unless --no-step-time): a decode
step of one row must read every decoder weight except the cross-attention k/v projections
(applied to the encoder output once, at the start) plus the output projection, i.e. the whole
256206 x 1024 table: the bytes are summed from the safetensors header (1.75 GB at 600m). Our
per-step time is measured by difference, so start-up, loading and the encoder drop out: the
same `attn generate` with max = min new tokens 1 (median of --runs) taken from the 32-token
median, divided by 31. The read bandwidth comes from the repository's
`examples/mem_bandwidth.rs` (`cargo build --release --example mem_bandwidth`; --mem-bandwidth
PATH, default `examples/mem_bandwidth` next to --attn) on T threads over 1024 MiB, the plain
read figure, measured in the same run just before that setting; or give --bandwidth-gbs. The
bound is bytes / bandwidth; the report gives our step time, the bound, and the fraction of the
bandwidth a step reaches (bound / step time).

The CLI contract: IN holds int64 `input_ids` and `attention_mask` (B, S); OUT must hold int64
`sequences` (B, T') exactly as generate() returns them (decoder start 2 first, then the target
language, pad-padded). The script checks both sides produced the same sequences and reports
the first difference if not (with random weights a near-tie between two tokens can
legitimately flip under a different float summation order; the report says where).

Duration (600m, model already created, --runs 1 with the default --warmup 1, on a 2-core Zen 4
at load 4-5): 5 min 8 s in all; transformers 25 / 90 / 141 s and ours 8 / 11 / 22 s for the
three settings (each side's warm-up and timed runs). Every extra run adds about half again.

CTranslate2 is not timed here: bench/compare_nllb_ct2.py runs it against these models (with a
stand-in vocabulary for its converter), at these sizes and the dense 1.3B and 3.3B ones.

--isa portable|avx2|avx512 limits both sides to that instruction-set level (like for like on a
CPU that has more): `ATTN_CPU_ISA` for ours, `ATEN_CPU_CAPABILITY` and
`MKL_ENABLE_INSTRUCTIONS` for torch. They are read when the libraries load, so the script
re-executes itself with them set before importing anything. The header prints each side's level.

Needs torch, transformers, safetensors (PyPI) and a release build of `attn`
(`cargo build --release`; pass --attn PATH if it lives elsewhere).
Versions used when this was written: torch 2.15.0, transformers 5.24.0, safetensors 0.8.0.
"""
import argparse
import gc
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isa_limits import ISA_ENV, reexec_with_isa_limits  # noqa: E402

reexec_with_isa_limits()

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
# The timing and checking half is compare_marian's (the same CLI contract).
from compare_marian import compare, ours_isa, time_ours, time_transformers  # noqa: E402

SETTINGS = {"b1_greedy": (1, 1), "b8_greedy": (8, 1), "b8_beam4": (8, 4)}
BOS, PAD, EOS, DECODER_START = 0, 1, 2, 2
# The architectures of facebook/nllb-200-distilled-600M, nllb-200-1.3B and nllb-200-3.3B (their
# config.json; the larger two for bench/compare_nllb_ct2.py), and a tiny one.
SIZES = {
    "600m": dict(vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12,
                 encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
                 decoder_ffn_dim=4096),
    "1.3b": dict(vocab_size=256206, d_model=1024, encoder_layers=24, decoder_layers=24,
                 encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=8192,
                 decoder_ffn_dim=8192),
    "3.3b": dict(vocab_size=256206, d_model=2048, encoder_layers=24, decoder_layers=24,
                 encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=8192,
                 decoder_ffn_dim=8192),
    "small": dict(vocab_size=4096, d_model=64, encoder_layers=2, decoder_layers=2,
                  encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                  decoder_ffn_dim=128),
}
# (source language, target language = forced_bos_token_id, first language id): eng_Latn and
# deu_Latn in the real NLLB vocabulary; stand-ins for the small one.
NLLB_LANGS = (256047, 256042, 256001)
LANGS = {"600m": NLLB_LANGS, "1.3b": NLLB_LANGS, "3.3b": NLLB_LANGS, "small": (4001, 4000, 4000)}


def build_model(dir_, size, seed):
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    torch.manual_seed(seed)
    config = M2M100Config(
        **SIZES[size], max_position_embeddings=1024, activation_function="relu",
        scale_embedding=True, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
        decoder_start_token_id=DECODER_START, tie_word_embeddings=True, dropout=0.1,
        attention_dropout=0.1, activation_dropout=0.0, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0, init_std=0.02, use_cache=True,
    )
    model = M2M100ForConditionalGeneration(config).eval()
    reinit(model)
    # NLLB-200's own generation_config.json.
    model.generation_config = GenerationConfig(
        bos_token_id=BOS, decoder_start_token_id=DECODER_START, eos_token_id=EOS,
        pad_token_id=PAD, max_length=200,
    )
    model.save_pretrained(dir_)  # transformers 5 writes model.safetensors (one tied table)
    del model
    gc.collect()


def reinit(model):
    """Random weights that make a non-degenerate model. transformers' own initialisation
    (normal(0, 0.02) everywhere, unit layer norms) gives a decoder whose residual stream is
    dominated by the input token's embedding, so the tied output projection predicts that same
    token forever (the forced language token, 32 times, for every source). Here: linear weights
    normal(0, 1/sqrt(fan_in)) (so the layers outweigh the embedding), biases normal(0, 0.02), layer norms
    normal(1, 0.1) / normal(0, 0.02), the shared table normal(0, 0.02) (pad row zero), and the
    decoder's final layer norm weight normal(0, 1): its random signs decorrelate the output
    logits from the input token's own embedding. Greedy outputs then vary from token to token
    and from source to source."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear) and mod is not model.lm_head:
                mod.weight.normal_(0.0, mod.in_features ** -0.5)
                if mod.bias is not None:
                    mod.bias.normal_(0.0, 0.02)
            elif isinstance(mod, torch.nn.LayerNorm):
                mod.weight.normal_(1.0, 0.1)
                mod.bias.normal_(0.0, 0.02)
        shared = model.model.shared.weight
        shared.normal_(0.0, 0.02)
        shared[PAD].zero_()
        model.model.decoder.layer_norm.weight.normal_(0.0, 1.0)


def make_inputs(batch, src_len, size, seed):
    src_lang, _, first_lang = LANGS[size]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, first_lang, (batch, src_len), generator=g)
    ids[:, 0] = src_lang
    ids[:, -1] = EOS
    return ids, torch.ones_like(ids)


def step_bytes(weights):
    """Bytes one batch-1 decoding step must read: every decoder tensor except the
    cross-attention k/v projections (applied to the encoder output once) plus the output
    projection (the tied shared table), from the safetensors header (int8 matrices of an
    `attn convert` file at one byte a weight, their scales included)."""
    parts = {}
    with safe_open(str(weights), framework="pt") as f:
        for k in f.keys():
            sl = f.get_slice(k)
            n = 1
            for s in sl.get_shape():
                n *= s
            nbytes = n * {"F32": 4, "F16": 2, "BF16": 2, "I8": 1}.get(sl.get_dtype(), 4)
            if k.startswith("model.decoder.") and not re.search(r"encoder_attn\.(k|v)_proj", k):
                parts["decoder"] = parts.get("decoder", 0) + nbytes
            elif k in ("lm_head.weight", "model.shared.weight"):
                parts["output projection"] = nbytes  # tied: one table
    return sum(parts.values()), parts


def measure_bandwidth(path, threads):
    """Plain read GB/s of the mem_bandwidth example on `threads` threads over 1024 MiB."""
    out = subprocess.run([path, str(threads), "1024"], check=True, capture_output=True, text=True).stdout
    m = re.search(r"read ([0-9.]+) GB/s", out)
    if not m:
        raise RuntimeError(f"cannot read a bandwidth from {path}'s output: {out!r}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default=str(Path(__file__).resolve().parent.parent / "target" / "release" / "attn"))
    p.add_argument("--size", choices=sorted(SIZES), default="600m",
                   help="600m: nllb-200-distilled-600M's architecture (1.3b, 3.3b: the dense larger "
                        "ones; transformers is slow there); small: a tiny one for testing")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3, help="timed runs per side and setting (median quoted)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--model-dir", help="use (or create, if empty/missing) this model directory instead of a temp dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-ours", action="store_true", help="time transformers only")
    p.add_argument("--no-step-time", action="store_true",
                   help="do not measure our batch-1 step time (the extra 1-token runs) against the bandwidth bound")
    p.add_argument("--mem-bandwidth", default=None,
                   help="path of the mem_bandwidth example (default: examples/mem_bandwidth next to --attn)")
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="a fixed read bandwidth in GB/s instead of running --mem-bandwidth")
    p.add_argument("--isa", choices=sorted(ISA_ENV), default=None,
                   help="limit both sides to this instruction-set level (see the module docs)")
    p.add_argument("--json", action="store_true", help="print the results as JSON (one object per setting)")
    a = p.parse_args()

    settings = [s for s in a.settings.split(",") if s]
    for s in settings:
        if s not in SETTINGS:
            p.error(f"unknown setting {s!r}; known: {', '.join(SETTINGS)}")
    if not a.skip_ours and not os.access(a.attn, os.X_OK):
        p.error(f"{a.attn} is not an executable (build it with `cargo build --release`, "
                "pass --attn PATH, or use --skip-ours)")
    if a.src_len < 3:
        p.error("--src-len must be at least 3 (language, one token, </s>)")
    want_step = not a.skip_ours and not a.no_step_time and "b1_greedy" in settings and a.new_tokens > 1
    bw_path = a.mem_bandwidth or str(Path(a.attn).resolve().parent / "examples" / "mem_bandwidth")
    if want_step and a.bandwidth_gbs is None and not os.access(bw_path, os.X_OK):
        print(f"note: {bw_path} is not an executable (cargo build --release --example mem_bandwidth); "
              "the step time is given without the bandwidth bound", file=sys.stderr)
    torch.set_num_threads(a.threads)
    _, forced_bos, _ = LANGS[a.size]

    from transformers import M2M100ForConditionalGeneration
    import transformers

    with tempfile.TemporaryDirectory(prefix="compare_multilingual_") as tmp:
        model_dir = Path(a.model_dir) if a.model_dir else Path(tmp) / f"nllb-{a.size}-random"
        if not (model_dir / "config.json").exists():
            t = time.perf_counter()
            build_model(model_dir, a.size, a.seed)
            print(f"created {model_dir} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        cfg = json.loads((model_dir / "config.json").read_text())
        if cfg.get("vocab_size") != SIZES[a.size]["vocab_size"]:
            p.error(f"{model_dir} holds a model of vocab_size {cfg.get('vocab_size')}, not the "
                    f"{a.size} size ({SIZES[a.size]['vocab_size']}): pass the matching --size")
        weights = model_dir / "model.safetensors"
        file_bytes = weights.stat().st_size
        step_b, step_parts = step_bytes(weights)
        t = time.perf_counter()
        model = M2M100ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
        load_s = time.perf_counter() - t
        params = sum(x.numel() for x in model.parameters())

        rows, bandwidth = [], a.bandwidth_gbs
        for name in settings:
            batch, beams = SETTINGS[name]
            ids, mask = make_inputs(batch, a.src_len, a.size, a.seed + 1)
            in_path, out_path = Path(tmp) / f"{name}.in.safetensors", Path(tmp) / f"{name}.out.safetensors"
            save_file({"input_ids": ids, "attention_mask": mask}, str(in_path))
            tokens = batch * a.new_tokens
            t_setting = time.perf_counter()
            hf_med, hf_min, hf_cpu, hf_seq = time_transformers(model, ids, mask, beams, a.new_tokens,
                                                               a.runs, a.warmup, forced_bos_token_id=forced_bos)
            hf_wall = time.perf_counter() - t_setting
            expect_len = 1 + a.new_tokens
            if hf_seq.shape != (batch, expect_len):
                print(f"warning: transformers returned {tuple(hf_seq.shape)}, expected {(batch, expect_len)}",
                      file=sys.stderr)
            row = {
                "setting": name, "size": a.size, "batch": batch, "beams": beams, "src_len": a.src_len,
                "new_tokens": a.new_tokens, "threads": a.threads, "runs": a.runs,
                "forced_bos_token_id": forced_bos, "parameters": params,
                "weight_file_bytes": file_bytes,
                "transformers_s": hf_med, "transformers_min_s": hf_min, "transformers_cpu_s": hf_cpu,
                "transformers_tok_s": tokens / hf_med,
                "transformers_load_s": load_s, "transformers_setting_wall_s": hf_wall,
                "transformers_process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count(),
            }
            if not a.skip_ours:
                t_ours = time.perf_counter()
                forced = ["--forced-bos-token-id", str(forced_bos)]
                o_med, o_min, o_cpu, rss, o_seq = time_ours(a.attn, model_dir, in_path, out_path, beams,
                                                            a.new_tokens, a.runs, a.warmup, a.threads, forced)
                mismatch = compare(hf_seq, o_seq)
                row.update({
                    "ours_s": o_med, "ours_min_s": o_min, "ours_cpu_s": o_cpu, "ours_tok_s": tokens / o_med,
                    "ratio": (tokens / o_med) / (tokens / hf_med), "ours_peak_rss_mib": rss,
                    "ours_rss_over_file": rss * 1024 * 1024 / file_bytes,
                    "same_sequences": mismatch is None, "mismatch": mismatch,
                })
                if mismatch:
                    print(f"{name}: sequences differ: {mismatch}", file=sys.stderr)
                if name == "b1_greedy" and want_step:
                    one_path = Path(tmp) / f"{name}.one.safetensors"
                    one_med, _, _, _, _ = time_ours(a.attn, model_dir, in_path, one_path, beams, 1, a.runs, 0,
                                                    a.threads, forced)
                    step_s = (o_med - one_med) / (a.new_tokens - 1)
                    row.update({"ours_one_token_s": one_med, "ours_step_ms": step_s * 1e3,
                                "step_bytes": step_b, "step_bytes_parts": step_parts})
                    if bandwidth is None and os.access(bw_path, os.X_OK):
                        bandwidth = measure_bandwidth(bw_path, a.threads)
                    if bandwidth:
                        bound = step_b / (bandwidth * 1e9)
                        row.update({"read_bandwidth_gbs": bandwidth, "step_bound_ms": bound * 1e3,
                                    "step_over_bound": step_s / bound,
                                    "bandwidth_fraction": bound / step_s if step_s > 0 else None})
                row["ours_setting_wall_s"] = time.perf_counter() - t_ours
            rows.append(row)
            print(f"{name} done (transformers {row['transformers_setting_wall_s']:.1f} s"
                  + (f", ours {row['ours_setting_wall_s']:.1f} s" if "ours_setting_wall_s" in row else "")
                  + ")", file=sys.stderr)

    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"NLLB-200 {a.size} (random weights, {params / 1e6:.1f} M parameters, model.safetensors "
          f"{file_bytes / 1e9:.2f} GB = {file_bytes / 2**20:.0f} MiB); forced_bos_token_id {forced_bos}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {a.threads} threads, "
          f"source length {a.src_len}, {a.new_tokens} new tokens, median of {a.runs} runs")
    limits = " ".join(f"{k}={os.environ[k]}" for k in ISA_ENV["avx2"] if k in os.environ)
    print(f"ISA: ours {ours_isa(a.attn) if not a.skip_ours else '-'}; torch "
          f"{torch.backends.cpu.get_cpu_capability()}{'; limits ' + limits if limits else ''}")
    print(f"(transformers from_pretrained took {load_s:.2f} s, not included; ours is the whole process)")
    print(f"1-minute load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times are only "
          "meaningful on an otherwise idle machine; CPU seconds in brackets)")
    hdr = (f"{'setting':10s} {'transformers tok/s':>22s} {'ours tok/s':>18s} {'vs HF':>6s} "
           f"{'ours peak RSS':>13s} {'/ file':>6s}  same")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        hf = f"{r['transformers_tok_s']:.1f} ({r['transformers_cpu_s']:.2f})"
        if "ours_tok_s" in r:
            ours = f"{r['ours_tok_s']:.1f} ({r['ours_cpu_s']:.2f})"
            print(f"{r['setting']:10s} {hf:>22s} {ours:>18s} {r['ratio']:6.2f} "
                  f"{r['ours_peak_rss_mib']:9.0f} MiB {r['ours_rss_over_file']:6.2f}  "
                  f"{'yes' if r['same_sequences'] else 'NO'}")
        else:
            print(f"{r['setting']:10s} {hf:>22s} {'-':>18s} {'-':>6s} {'-':>13s} {'-':>6s}  -")
    for r in rows:
        if "ours_step_ms" in r:
            parts = ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in r["step_bytes_parts"].items())
            line = (f"batch-1 step: ours {r['ours_step_ms']:.1f} ms ((32-token run - 1-token run) / "
                    f"{r['new_tokens'] - 1}); a step reads {r['step_bytes'] / 1e6:.0f} MB ({parts})")
            if "step_bound_ms" in r:
                frac = r["bandwidth_fraction"]
                line += (f"; at {r['read_bandwidth_gbs']:.1f} GB/s the bound is {r['step_bound_ms']:.1f} ms: "
                         f"{r['step_over_bound']:.2f}x the bound, "
                         + (f"{100 * frac:.0f}% of the bandwidth" if frac else "(step time lost in the noise)"))
            print(line)


if __name__ == "__main__":
    main()
