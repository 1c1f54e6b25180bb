#!/usr/bin/env python3
"""Side-by-side speed of `attn generate` and transformers' `MarianMTModel.generate()`.

    /work/venv/bin/python bench/compare_marian.py                       # the three settings
    /work/venv/bin/python bench/compare_marian.py --runs 3 --json
    /work/venv/bin/python bench/compare_marian.py --skip-ours           # transformers half only
    /work/venv/bin/python bench/compare_marian.py --isa avx2 --model-dir /work/bl/opus_rand

The model is an opus-mt-en-de-sized MarianMTModel with RANDOM weights (seeded): d_model 512,
6 + 6 layers, 8 heads, ffn 2048, vocab 58101 (shared, lm_head tied), swish, scale_embedding,
max_position_embeddings 512, pad = decoder_start = 58100, eos 0, and an opus-mt style
generation_config.json (num_beams 4, max_length 512, bad_words_ids [[58100]],
forced_eos_token_id 0, renormalize_logits true). transformers creates it and saves it to a
temporary directory (`model.safetensors`; `--weights-format bin|both` also or instead writes a
`pytorch_model.bin` torch zip pickle of the full state dict, as opus-mt repos ship); both sides
load that same directory.

Inputs: B source rows of exactly 24 tokens (23 random ids in 2..58099, then eos 0), no padding,
attention_mask all ones. Every run generates exactly 32 new tokens per returned row
(`min_new_tokens = max_new_tokens = 32`; the 32nd token is eos, forced by
forced_eos_token_id). Settings: batch 1 greedy, batch 8 greedy, batch 8 beam 4.

Threads: `torch.set_num_threads(T)` here and `RAYON_NUM_THREADS=T` for `attn` (default T = 2).

What is timed
* transformers: `model.generate(input_ids=, attention_mask=, num_beams=N, max_new_tokens=32,
  min_new_tokens=32)` with the model already loaded (`from_pretrained`, eval, fp32, default
  attention implementation); median of --runs after --warmup calls.
* ours: the WHOLE process `attn generate --model DIR --inputs IN.safetensors --output
  OUT.safetensors --beams N --max-new-tokens 32 --min-new-tokens 32` (start-up and model load
  included); median of --runs after --warmup runs. Peak RSS of that process comes from
  `/usr/bin/time -f %M` (the command's own peak; the largest over the timed runs).
tokens/s = B x 32 / seconds (for beam search also B x 32: returned tokens, not beam tokens).
--json adds CPU seconds (process_time for transformers, the child's user + system time for
ours) and the load average: on a shared machine wall times mostly measure the neighbours.
ratio = ours tok/s / transformers tok/s (> 1 means candle-attention is faster).

The CLI contract: IN holds int64 `input_ids` and `attention_mask` (B, S); OUT must hold int64
`sequences` (B, T') exactly as generate() returns them (decoder start first, pad-padded). The
script checks both sides produced the same sequences and reports the first difference if not
(with random weights a near-tie between two tokens can legitimately flip under different float
summation order; the report says where).

* CTranslate2 (unless --skip-ct2; needs the `ctranslate2` package): the same directory converted
  once with `ctranslate2.converters.TransformersConverter` (float32; the random model has no
  tokenizer files, so the converter is handed a stand-in vocabulary: id 0 `</s>`, 1 `<unk>`,
  `t<i>` for the others, `<pad>` last, which CTranslate2 drops), loaded once as
  `ctranslate2.Translator(dir, device="cpu", compute_type=--ct2-compute-type,
  intra_threads=T, inter_threads=1)`, then `translate_batch` on the same source ids as tokens
  with `beam_size=N, min_decoding_length=32, max_decoding_length=32`: exactly 32 new tokens per
  row (checked). Median of --runs after --warmup calls, CPU seconds from process_time. Its
  tokens are not compared for equality (it starts the decoder from a zero embedding and does
  not force EOS at the last step); the JSON gives its agreement with transformers' tokens.

--isa portable|avx2|avx512 limits every side to that instruction-set level (like for like on a
CPU that has more): `ATTN_CPU_ISA` for ours, `ATEN_CPU_CAPABILITY` and `MKL_ENABLE_INSTRUCTIONS`
for torch, `CT2_FORCE_CPU_ISA` and `ONEDNN_MAX_CPU_ISA` for CTranslate2. They are read when the
libraries load, so the script re-executes itself with them set before importing anything. The
header prints each side's level.

Needs torch, transformers, safetensors (PyPI) and a release build of `attn`
(`cargo build --release`; pass --attn PATH if it lives elsewhere).
Versions used when this was written: torch 2.15.0, transformers 5.24.0, safetensors 0.8.0.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isa_limits import ISA_ENV, reexec_with_isa_limits  # noqa: E402

reexec_with_isa_limits()

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

SETTINGS = {"b1_greedy": (1, 1), "b8_greedy": (8, 1), "b8_beam4": (8, 4)}
VOCAB, PAD, EOS = 58101, 58100, 0


def build_model(dir_, weights_format, seed):
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=VOCAB, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
        decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
        scale_embedding=True, share_encoder_decoder_embeddings=True, pad_token_id=PAD,
        decoder_start_token_id=PAD, eos_token_id=EOS, forced_eos_token_id=EOS, bos_token_id=None,
    )
    model = MarianMTModel(config).eval()
    model.generation_config = GenerationConfig(
        bad_words_ids=[[PAD]], bos_token_id=0, decoder_start_token_id=PAD, eos_token_id=EOS,
        forced_eos_token_id=EOS, max_length=512, num_beams=4, pad_token_id=PAD,
        renormalize_logits=True,
    )
    model.save_pretrained(dir_)  # transformers 5 always writes model.safetensors
    if weights_format in ("bin", "both"):
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        shared = sd["model.shared.weight"]
        for k in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
            sd[k] = shared
        torch.save(sd, Path(dir_) / "pytorch_model.bin")
    if weights_format == "bin":
        (Path(dir_) / "model.safetensors").unlink()


def make_inputs(batch, src_len, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, PAD, (batch, src_len), generator=g)
    ids[:, -1] = EOS
    return ids, torch.ones_like(ids)


def convert_ct2(model_dir, out_dir):
    """The Marian directory converted to a CTranslate2 float32 model in `out_dir` (once)."""
    import ctranslate2

    if (Path(out_dir) / "model.bin").exists():
        return out_dir

    class Vocab:
        """A stand-in tokenizer: the converter only reads the vocabulary and special tokens."""
        eos_token, unk_token, pad_token = "</s>", "<unk>", "<pad>"

        def get_vocab(self):
            names = {0: "</s>", 1: "<unk>", PAD: "<pad>"}
            return {names.get(i, f"t{i}"): i for i in range(VOCAB)}

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return Vocab()

    Converter(str(model_dir)).convert(str(out_dir), quantization=None, force=True)
    return out_dir


def ct2_tokens(ids):
    """Source ids as the stand-in vocabulary's tokens (ending with `</s>`, id 0)."""
    names = {0: "</s>", 1: "<unk>", PAD: "<pad>"}
    return [[names.get(int(i), f"t{int(i)}") for i in row] for row in ids]


def time_ct2(translator, source, beams, new_tokens, runs, warmup):
    kw = dict(beam_size=beams, min_decoding_length=new_tokens, max_decoding_length=new_tokens,
              num_hypotheses=1)
    for _ in range(warmup):
        translator.translate_batch(source, **kw)
    secs, cpu = [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        out = translator.translate_batch(source, **kw)
        secs.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    lengths = {len(r.hypotheses[0]) for r in out}
    if lengths != {new_tokens}:
        print(f"warning: CTranslate2 returned hypotheses of lengths {sorted(lengths)}, "
              f"expected {new_tokens}", file=sys.stderr)
    names = {"</s>": 0, "<unk>": 1, "<pad>": PAD}
    toks = [[names[t] if t in names else int(t[1:]) for t in r.hypotheses[0]] for r in out]
    return statistics.median(secs), min(secs), statistics.median(cpu), toks


def ours_isa(attn):
    """What `attn --version` says about the CPU and the kernels' level."""
    try:
        out = subprocess.run([attn, "--version"], check=True, capture_output=True, text=True).stdout
        return " ".join(out.split()[1:]) or "?"
    except (OSError, subprocess.CalledProcessError):
        return "?"


def time_transformers(model, ids, mask, beams, new_tokens, runs, warmup, **generate_kwargs):
    """Median and min wall seconds, median CPU seconds and the sequences of `generate()` with
    exactly `new_tokens` new tokens (`generate_kwargs` go to `generate()` as well)."""
    kw = dict(num_beams=beams, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **generate_kwargs)
    with torch.no_grad():
        for _ in range(warmup):
            model.generate(input_ids=ids, attention_mask=mask, **kw)
        secs, cpu = [], []
        for _ in range(runs):
            t, c = time.perf_counter(), time.process_time()
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
            secs.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    return statistics.median(secs), min(secs), statistics.median(cpu), out


def run_ours_once(cmd, env):
    """Run one process; return (wall seconds, CPU seconds, peak RSS in MiB).

    Linux keeps a process's peak RSS across exec, so a child forked from this (large) Python
    process would report Python's RSS as its own; /usr/bin/time forks from a small process and
    reports the command's own peak (`%M`, KiB). Without it, wait4's figure is an upper bound."""
    timer = ["/usr/bin/time", "-f", "%M"] if os.path.exists("/usr/bin/time") else []
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a chatty child cannot block
        t = time.perf_counter()
        proc = subprocess.Popen(timer + cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        # wait4 gives this child's own rusage (RUSAGE_CHILDREN would be the max over all children)
        _, status, usage = os.wait4(proc.pid, 0)
        secs = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{text[-4000:]}")
    rss = usage.ru_maxrss / 1024.0
    if timer:
        rss = int(text.strip().splitlines()[-1]) / 1024.0
    return secs, usage.ru_utime + usage.ru_stime, rss


def time_ours(attn, model_dir, in_path, out_path, beams, new_tokens, runs, warmup, threads, extra_args=()):
    """The whole `attn generate` process (`extra_args` appended): median and min wall seconds,
    median CPU seconds, peak RSS in MiB and the sequences it wrote."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    cmd = [attn, "generate", "--model", str(model_dir), "--inputs", str(in_path), "--output", str(out_path),
           "--beams", str(beams), "--max-new-tokens", str(new_tokens), "--min-new-tokens", str(new_tokens),
           *extra_args]
    for _ in range(warmup):
        run_ours_once(cmd, env)
    secs, cpu, rss = [], [], []
    for _ in range(runs):
        s, c, r = run_ours_once(cmd, env)
        secs.append(s)
        cpu.append(c)
        rss.append(r)
    out = load_file(str(out_path))
    if "sequences" not in out:
        raise RuntimeError(f"{out_path} has no `sequences` (tensors: {sorted(out)})")
    return statistics.median(secs), min(secs), statistics.median(cpu), max(rss), out["sequences"]


def compare(theirs, ours):
    """None when equal, else a description of the first difference."""
    if ours.dtype != torch.int64:
        return f"ours has dtype {ours.dtype}, expected int64"
    if tuple(ours.shape) != tuple(theirs.shape):
        return f"shape differs: transformers {tuple(theirs.shape)}, ours {tuple(ours.shape)}"
    diff = (ours != theirs).nonzero()
    if len(diff) == 0:
        return None
    r, t = (int(x) for x in diff[0])
    return (f"{len(diff)} tokens differ; first at row {r} position {t}: transformers "
            f"{int(theirs[r, t])}, ours {int(ours[r, t])}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default=str(Path(__file__).resolve().parent.parent / "target" / "release" / "attn"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=5, help="timed runs per side and setting (median quoted)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--weights-format", choices=["safetensors", "bin", "both"], default="safetensors")
    p.add_argument("--model-dir", help="use (or create, if empty/missing) this model directory instead of a temp dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-ours", action="store_true", help="time transformers only")
    p.add_argument("--skip-ct2", action="store_true", help="do not time CTranslate2")
    p.add_argument("--ct2-dir", help="where the converted CTranslate2 model lives (default: "
                   "MODEL_DIR/ctranslate2-float32, created once)")
    p.add_argument("--ct2-compute-type", default="float32")
    p.add_argument("--isa", choices=sorted(ISA_ENV), default=None,
                   help="limit every side to this instruction-set level (see the module docs)")
    p.add_argument("--json", action="store_true", help="print the results as JSON (one object per setting)")
    a = p.parse_args()

    settings = [s for s in a.settings.split(",") if s]
    for s in settings:
        if s not in SETTINGS:
            p.error(f"unknown setting {s!r}; known: {', '.join(SETTINGS)}")
    if not a.skip_ours and not os.access(a.attn, os.X_OK):
        p.error(f"{a.attn} is not an executable (build it with `cargo build --release`, "
                "pass --attn PATH, or use --skip-ours)")
    torch.set_num_threads(a.threads)

    from transformers import MarianMTModel
    import transformers

    with tempfile.TemporaryDirectory(prefix="compare_marian_") as tmp:
        model_dir = Path(a.model_dir) if a.model_dir else Path(tmp) / "opus-mt-random"
        if not (model_dir / "config.json").exists():
            t = time.perf_counter()
            build_model(model_dir, a.weights_format, a.seed)
            print(f"created {model_dir} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        t = time.perf_counter()
        model = MarianMTModel.from_pretrained(model_dir, dtype=torch.float32).eval()
        load_s = time.perf_counter() - t
        translator, ct2_version = None, None
        if not a.skip_ct2:
            import ctranslate2

            ct2_version = ctranslate2.__version__
            ct2_dir = convert_ct2(model_dir, a.ct2_dir or (model_dir / f"ctranslate2-float32"))
            translator = ctranslate2.Translator(str(ct2_dir), device="cpu",
                                                compute_type=a.ct2_compute_type,
                                                intra_threads=a.threads, inter_threads=1)

        rows = []
        for name in settings:
            batch, beams = SETTINGS[name]
            ids, mask = make_inputs(batch, a.src_len, a.seed + 1)
            in_path, out_path = Path(tmp) / f"{name}.in.safetensors", Path(tmp) / f"{name}.out.safetensors"
            save_file({"input_ids": ids, "attention_mask": mask}, str(in_path))
            tokens = batch * a.new_tokens
            hf_med, hf_min, hf_cpu, hf_seq = time_transformers(model, ids, mask, beams, a.new_tokens, a.runs, a.warmup)
            expect_len = 1 + a.new_tokens
            if hf_seq.shape != (batch, expect_len):
                print(f"warning: transformers returned {tuple(hf_seq.shape)}, expected {(batch, expect_len)}",
                      file=sys.stderr)
            row = {
                "setting": name, "batch": batch, "beams": beams, "src_len": a.src_len,
                "new_tokens": a.new_tokens, "threads": a.threads, "runs": a.runs,
                "transformers_s": hf_med, "transformers_min_s": hf_min, "transformers_cpu_s": hf_cpu,
                "transformers_tok_s": tokens / hf_med,
                "transformers_load_s": load_s,
                "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                "load_average": os.getloadavg()[0], "cpu_count": os.cpu_count(),
            }
            if translator is not None:
                c_med, c_min, c_cpu, c_toks = time_ct2(translator, ct2_tokens(ids), beams, a.new_tokens,
                                                       a.runs, a.warmup)
                hf_new = hf_seq[:, 1:].tolist()
                agree = sum(x == y for r, h in zip(c_toks, hf_new) for x, y in zip(r, h))
                row.update({
                    "ct2_s": c_med, "ct2_min_s": c_min, "ct2_cpu_s": c_cpu, "ct2_tok_s": tokens / c_med,
                    "ct2_version": ct2_version, "ct2_compute_type": a.ct2_compute_type,
                    "ct2_token_agreement": agree / max(1, sum(len(h) for h in hf_new)),
                })
            if not a.skip_ours:
                o_med, o_min, o_cpu, rss, o_seq = time_ours(a.attn, model_dir, in_path, out_path, beams,
                                                     a.new_tokens, a.runs, a.warmup, a.threads)
                mismatch = compare(hf_seq, o_seq)
                row.update({
                    "ours_s": o_med, "ours_min_s": o_min, "ours_cpu_s": o_cpu, "ours_tok_s": tokens / o_med,
                    "ratio": (tokens / o_med) / (tokens / hf_med), "ours_peak_rss_mib": rss,
                    "same_sequences": mismatch is None, "mismatch": mismatch,
                })
                if "ct2_tok_s" in row:
                    row["ratio_ct2"] = row["ours_tok_s"] / row["ct2_tok_s"]
                if mismatch:
                    print(f"{name}: sequences differ: {mismatch}", file=sys.stderr)
            rows.append(row)
            print(f"{name} done", file=sys.stderr)

    if a.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"transformers {transformers.__version__}, torch {torch.__version__}"
          f"{', CTranslate2 ' + ct2_version + ' ' + a.ct2_compute_type if ct2_version else ''}, "
          f"{a.threads} threads, source length {a.src_len}, {a.new_tokens} new tokens, median of {a.runs} runs")
    limits = " ".join(f"{k}={os.environ[k]}" for k in ISA_ENV["avx2"] if k in os.environ)
    print(f"ISA: ours {ours_isa(a.attn) if not a.skip_ours else '-'}; torch "
          f"{torch.backends.cpu.get_cpu_capability()}{'; limits ' + limits if limits else ''}")
    print(f"(transformers from_pretrained took {load_s:.2f} s, not included; CTranslate2 loaded once, not "
          "included; ours is the whole process)")
    print(f"1-minute load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times are only "
          "meaningful on an otherwise idle machine; CPU seconds in brackets)")
    hdr = (f"{'setting':10s} {'transformers tok/s':>22s} {'CTranslate2 tok/s':>20s} {'ours tok/s':>16s} "
           f"{'vs HF':>6s} {'vs CT2':>6s} {'ours peak RSS':>13s}  same")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        hf = f"{r['transformers_tok_s']:.1f} ({r['transformers_cpu_s']:.2f})"
        ct = f"{r['ct2_tok_s']:.1f} ({r['ct2_cpu_s']:.2f})" if "ct2_tok_s" in r else "-"
        if "ours_tok_s" in r:
            ours = f"{r['ours_tok_s']:.1f} ({r['ours_cpu_s']:.2f})"
            vs_ct = f"{r['ratio_ct2']:6.2f}" if "ratio_ct2" in r else f"{'-':>6s}"
            print(f"{r['setting']:10s} {hf:>22s} {ct:>20s} {ours:>16s} {r['ratio']:6.2f} {vs_ct} "
                  f"{r['ours_peak_rss_mib']:10.0f} MiB  {'yes' if r['same_sequences'] else 'NO'}")
        else:
            print(f"{r['setting']:10s} {hf:>22s} {ct:>20s} {'-':>16s} {'-':>6s} {'-':>6s} {'-':>13s}  -")


if __name__ == "__main__":
    main()
