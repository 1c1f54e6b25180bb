#!/usr/bin/env python3
"""Corpus throughput of `attn translate --model DIR` (the bulk path) against CTranslate2's
`translate_iterable` and transformers' translation pipeline, side by side in one run.

    /work/venv/bin/python bench/compare_bulk.py [--attn target/release/attn] [--lines 5000] \
        [--beams 1,4] [--workdir /work/bench_models/bulk] [--hf-lines 400] [--json]

What is built (once, in --workdir; reused when present):

* **Corpus**: sentences of the licence texts and package copyright files of this machine
  (`/usr/share/common-licenses/*`, `/usr/share/doc/*/copyright`: English legal and
  documentation prose), split at sentence ends, 3 to 600 characters, deduplicated, shuffled
  with a fixed seed; the first --lines (≥ 5,000) are the corpus. Its length distribution (in
  tokens) is printed: from a few tokens to a few hundred, as real corpora are.
* **Tokenizer**: a SentencePiece unigram model trained here on the corpus (8,000 pieces,
  nmt_nfkc, as Marian's spm_train), used as both source.spm and target.spm, and a vocab.json
  as Helsinki-NLP's conversion writes it.
* **Model**: an opus-mt-en-de-sized MarianMTModel (d_model 512, 6 + 6 layers, 8 heads, ffn
  2048, swish, scale_embedding, tied embeddings, max_position_embeddings 512) with random
  weights (seeded), whose length behaviour is made plausible by one number: the
  `final_logits_bias` of EOS, chosen by bisection so that greedy outputs of a sample of the
  corpus average about 24 tokens (random weights alone never stop, or always stop at once).
  Outputs then end at varied, plausible lengths, so sorting and dropping finished sentences
  matter as they do with a real model.

What is timed (2 threads everywhere; wall and CPU seconds; the machine is shared: medians of
--runs alternating runs):

* ours: the WHOLE `attn translate --model DIR --input corpus.txt --output out.txt --beam B
  --max-new-tokens 128` process (model loading included), default window and token budget;
  and the same binary with `--window 16 --max-batch-tokens 1000000000`, which is exactly the
  previous input-order batching (padded batches of 16 lines in input order), as the baseline
  of the bulk path's own gain;
* CTranslate2 4.8.5: the model converted with `TransformersConverter` (float32), loaded once,
  `translate_iterable(tokens, max_batch_size=4096, batch_type="tokens", beam_size=B,
  max_decoding_length=128)` with `intra_threads=2`, SentencePiece tokenisation and decoding
  included in the time;
* transformers 5.24 (which removed the translation pipeline): what the pipeline did, padded
  batches of 16 in input order through `generate()` with `num_beams=B,
  max_new_tokens=128`, on the first --hf-lines lines (it is slow; its throughput is per line).

Reports lines/s and generated tokens/s per system, the ratios, and how often the systems'
outputs agree (token-level near-ties between engines legitimately flip outputs of a random
model; the agreement says how comparable the work is).
"""
import argparse
import glob
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def build_corpus(path: Path, n: int, seed: int = 0) -> list:
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
    sents = []
    seen = set()
    for f in files:
        try:
            text = open(f, encoding="utf-8", errors="ignore").read()
        except (IsADirectoryError, PermissionError):
            continue
        text = re.sub(r"\s+", " ", text)
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(\"'])", text):
            s = s.strip()
            if 3 <= len(s) <= 600 and re.search(r"[A-Za-z]{3}", s) and s not in seen:
                seen.add(s)
                sents.append(s)
    random.Random(seed).shuffle(sents)
    if len(sents) < n:
        sys.exit(f"only {len(sents)} sentences found on this machine, {n} asked for")
    sents = sents[:n]
    path.write_text("\n".join(sents) + "\n", encoding="utf-8")
    return sents


def build_model(workdir: Path, sents: list, seed: int = 0):
    import sentencepiece as spm
    import torch
    from collections import Counter
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sents), model_prefix=str(workdir / "spm"), model_type="unigram",
        vocab_size=8000, character_coverage=1.0, normalization_rule_name="nmt_nfkc",
        num_threads=2, hard_vocab_limit=False, minloglevel=2)
    for name in ("source.spm", "target.spm"):
        (workdir / name).write_bytes((workdir / "spm.model").read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(workdir / "spm.model"))
    counts, order = Counter(), {}
    for s in sents:
        for p in sp.encode(s, out_type=str):
            counts[p] += 1
            order.setdefault(p, len(order))
    vocab = {"</s>": 0, "<unk>": 1}
    for p in sorted(counts, key=lambda p: (-counts[p], order[p])):
        vocab.setdefault(p, len(vocab))
    for i in range(sp.get_piece_size()):  # every piece, so CTranslate2's vocabulary is complete
        p = sp.id_to_piece(i)
        if not (sp.is_control(i) or sp.is_unknown(i)):
            vocab.setdefault(p, len(vocab))
    vocab["<pad>"] = len(vocab)
    (workdir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1))
    (workdir / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    (workdir / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}))
    v = len(vocab)
    pad = v - 1
    torch.manual_seed(seed)
    cfg = MarianConfig(vocab_size=v, decoder_vocab_size=v, d_model=512, encoder_layers=6, decoder_layers=6,
                       encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048,
                       decoder_ffn_dim=2048, max_position_embeddings=512, activation_function="swish",
                       scale_embedding=True, share_encoder_decoder_embeddings=True, pad_token_id=pad,
                       decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0, bos_token_id=None)
    model = MarianMTModel(cfg).eval()
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        max_length=512, num_beams=4, pad_token_id=pad, renormalize_logits=True)
    tok = MarianTokenizer(str(workdir / "source.spm"), str(workdir / "target.spm"), str(workdir / "vocab.json"))
    sample = sents[:48]
    batch = tok(sample, padding=True, return_tensors="pt")

    def mean_len(bias):
        with torch.no_grad():
            model.final_logits_bias[0, 0] = bias
            out = model.generate(**batch, num_beams=1, max_new_tokens=128)
        lens = [(row != pad).sum().item() - 1 for row in out]
        return statistics.mean(lens)

    lo, hi = 0.0, 20.0
    for _ in range(12):
        mid = (lo + hi) / 2
        if mean_len(mid) > 24:
            lo = mid
        else:
            hi = mid
    bias = (lo + hi) / 2
    with torch.no_grad():
        model.final_logits_bias[0, 0] = bias
    model.save_pretrained(workdir / "model")
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json", "special_tokens_map.json"):
        (workdir / "model" / name).write_bytes((workdir / name).read_bytes())
    return bias, mean_len(bias)


def ct2_convert(workdir: Path):
    import ctranslate2
    out = workdir / "ct2_float32"
    if not out.exists():
        ctranslate2.converters.TransformersConverter(str(workdir / "model")).convert(str(out), quantization="float32")
    return out


def run_ours(attn, model, corpus, out, beam, extra, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    t, c = time.perf_counter(), os.times()
    subprocess.run([attn, "translate", "--model", str(model), "--input", str(corpus), "--output", str(out),
                    "--beam", str(beam), "--max-new-tokens", "128"] + extra,
                   env=env, check=False, stderr=subprocess.DEVNULL)
    secs = time.perf_counter() - t
    c2 = os.times()
    cpu = (c2.children_user - c.children_user) + (c2.children_system - c.children_system)
    return secs, cpu, Path(out).read_text(encoding="utf-8").split("\n")[:-1]


def run_ct2(translator, sp, sents, beam):
    t, c = time.perf_counter(), time.process_time()
    toks = (sp.encode(s, out_type=str) + ["</s>"] for s in sents)
    outs = []
    for r in translator.translate_iterable(toks, max_batch_size=4096, batch_type="tokens", beam_size=beam,
                                           max_decoding_length=128):
        outs.append(sp.decode(r.hypotheses[0]))
    return time.perf_counter() - t, time.process_time() - c, outs


def run_hf(pipe, sents, beam):
    """What transformers 4's translation pipeline did (transformers 5 removed it): padded
    batches of 16 in input order, `generate()`, `batch_decode(skip_special_tokens=True)`."""
    import torch
    tok, model = pipe
    t, c = time.perf_counter(), time.process_time()
    outs = []
    with torch.no_grad():
        for i in range(0, len(sents), 16):
            batch = tok(sents[i:i + 16], padding=True, truncation=True, return_tensors="pt")
            gen = model.generate(**batch, num_beams=beam, max_new_tokens=128)
            outs += tok.batch_decode(gen, skip_special_tokens=True)
    return time.perf_counter() - t, time.process_time() - c, outs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", default=str(ROOT / "target" / "release" / "attn"))
    ap.add_argument("--workdir", default="/work/bench_models/bulk")
    ap.add_argument("--lines", type=int, default=5000)
    ap.add_argument("--hf-lines", type=int, default=400)
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    wd = Path(args.workdir)
    wd.mkdir(parents=True, exist_ok=True)
    corpus = wd / f"corpus_{args.lines}.txt"
    if corpus.exists():
        sents = corpus.read_text(encoding="utf-8").split("\n")[:-1]
    else:
        sents = build_corpus(corpus, args.lines)
    if not (wd / "model" / "model.safetensors").exists():
        bias, mean = build_model(wd, sents)
        print(f"model built: EOS bias {bias:.3f} gives greedy outputs of {mean:.1f} tokens on average")
    import ctranslate2
    import sentencepiece as spm
    import torch
    torch.set_num_threads(args.threads)
    sp = spm.SentencePieceProcessor(model_file=str(wd / "source.spm"))
    lens = sorted(len(sp.encode(s)) + 1 for s in sents)
    q = lambda f: lens[min(len(lens) - 1, int(f * len(lens)))]
    print(f"corpus: {len(sents)} sentences of Debian licence and copyright prose; source tokens: "
          f"min {lens[0]}, median {q(0.5)}, p90 {q(0.9)}, p99 {q(0.99)}, max {lens[-1]}, total {sum(lens)}")
    translator = ctranslate2.Translator(str(ct2_convert(wd)), device="cpu", intra_threads=args.threads, inter_threads=1)
    pipe = None
    if not args.skip_hf:
        import torch
        from transformers import MarianMTModel, MarianTokenizer
        torch.set_num_threads(args.threads)
        pipe = (MarianTokenizer.from_pretrained(str(wd / "model")),
                MarianMTModel.from_pretrained(str(wd / "model")).eval())
    results = []
    for beam in [int(b) for b in args.beams.split(",")]:
        times = {k: [] for k in ("ours", "ours_input_order", "ct2")}
        cpu = {k: [] for k in times}
        outs = {}
        for _ in range(args.runs):
            for key, extra in (("ours", []), ("ours_input_order", ["--window", "16", "--max-batch-tokens", "1000000000"])):
                s, c, o = run_ours(args.attn, wd / "model", corpus, wd / f"out_{key}.txt", beam, extra, args.threads)
                times[key].append(s)
                cpu[key].append(c)
                outs[key] = o
            s, c, o = run_ct2(translator, sp, sents, beam)
            times["ct2"].append(s)
            cpu["ct2"].append(c)
            outs["ct2"] = o
        row = {"beam": beam, "lines": len(sents)}
        for k in times:
            row[f"{k}_s"] = round(statistics.median(times[k]), 2)
            row[f"{k}_cpu_s"] = round(statistics.median(cpu[k]), 2)
            row[f"{k}_lines_per_s"] = round(len(sents) / statistics.median(times[k]), 1)
        row["ratio_vs_ct2"] = round(row["ct2_s"] / row["ours_s"], 2)
        row["ratio_vs_input_order"] = round(row["ours_input_order_s"] / row["ours_s"], 2)
        row["agree_ours_ct2"] = round(sum(a == b for a, b in zip(outs["ours"], outs["ct2"])) / len(sents), 3)
        row["agree_bulk_input_order"] = round(sum(a == b for a, b in zip(outs["ours"], outs["ours_input_order"])) / len(sents), 3)
        if pipe is not None:
            sub = sents[: args.hf_lines]
            s, c, o = run_hf(pipe, sub, beam)
            row["hf_lines"] = len(sub)
            row["hf_lines_per_s"] = round(len(sub) / s, 1)
            row["hf_cpu_s_per_line"] = round(c / len(sub), 4)
            row["ratio_vs_hf"] = round(row["ours_lines_per_s"] / row["hf_lines_per_s"], 2)
            row["agree_ours_hf"] = round(sum(a == b for a, b in zip(outs["ours"], o)) / len(sub), 3)
        results.append(row)
        if args.json:
            print(json.dumps(row))
        else:
            print(f"beam {beam}: ours {row['ours_lines_per_s']} lines/s ({row['ours_s']} s, CPU {row['ours_cpu_s']} s), "
                  f"input-order batching {row['ours_input_order_lines_per_s']} lines/s, CTranslate2 "
                  f"{row['ct2_lines_per_s']} lines/s: {row['ratio_vs_ct2']}x CTranslate2, "
                  f"{row['ratio_vs_input_order']}x input order"
                  + (f", {row['ratio_vs_hf']}x transformers ({row['hf_lines_per_s']} lines/s)" if pipe else "")
                  + f"; outputs agree with CTranslate2 on {row['agree_ours_ct2']:.1%}")


if __name__ == "__main__":
    main()
