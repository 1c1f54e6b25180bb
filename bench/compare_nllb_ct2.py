#!/usr/bin/env python3
"""Our `attn generate` (the whole process) against CTranslate2 (its model loaded) on NLLB-200-sized
models with random weights, f32 and int8, in alternating rounds.

    /work/venv/bin/python bench/compare_nllb_ct2.py --size 600m --workdir /work/bl
    /work/venv/bin/python bench/compare_nllb_ct2.py --size 1.3b --workdir /work/bl --precisions int8
    /work/venv/bin/python bench/compare_nllb_ct2.py --size 3.3b --workdir /work/bl --precisions int8 \\
        --settings b1_greedy,b8_greedy --rounds 2

Sizes (`config.json` of the hub models; vocabulary 256,206, one table shared by both embeddings and
the tied output projection, pre-norm, relu, 16 heads):

| size | d_model | layers | ffn | parameters | f32 file | int8 (`attn convert`) |
|---|---|---|---|---|---|---|
| 600m (nllb-200-distilled-600M) | 1024 | 12 + 12 | 4096 | 615 M | 2.46 GB | 0.65 GB |
| 1.3b (nllb-200-1.3B, dense) | 1024 | 24 + 24 | 8192 | 1.37 B | 5.48 GB | 1.4 GB |
| 3.3b (nllb-200-3.3B, dense) | 2048 | 24 + 24 | 8192 | 3.34 B | 13.4 GB | 3.4 GB |

What it builds, once, in WORKDIR/nllb-SIZE (kept and reused; CI never runs this):
* `model/`: the random model (`compare_multilingual.build_model`, its initialisation);
* `ct2/`: CTranslate2's conversion of it (float32, `compute_type="int8"` quantizing it as it
  loads; the 3.3b converted to int8 directly), with a stand-in vocabulary (`t<id>` tokens: the
  converter only reads the tokens);
* `int8/`: `attn convert --quantize int8` of the model.
Disk: the f32 file, CTranslate2's copy and ours in int8: 600m 5.5 GB, 1.3b 12.4 GB, 3.3b 20.1 GB
(its CTranslate2 copy in int8). Building took 31 s / 67 s / 2 min on a 2-core Zen 4, the 3.3b
with 17.7 GB of memory in use at its peak (torch's initialisation): it fits a 24 GB machine.
While timing, one CTranslate2 model is loaded at a time; CTranslate2 float32 holds the whole
model in its own memory on top of the page cache our mapped file occupies, so the 3.3b runs in
int8 only here (the default for it; our f32 alone: `attn generate` on `model/`).

Systems per precision: f32: ours on `model/` (read in place), CTranslate2 `float32`; int8: ours on
`int8/` (read in place), ours with `--quantize int8` on `model/` (quantized at load; `--no-at-load`
leaves it out), CTranslate2 `int8`. Each round runs every system once per setting, in turn;
medians of `--rounds` are quoted (CPU seconds in brackets), with the ratio ours / CTranslate2.

Inputs: B rows of `--src-len` tokens (`[eng_Latn] random ids </s>`), the target language forced
(`--forced-bos-token-id` for ours, `target_prefix` for CTranslate2), exactly `--new-tokens`
tokens a row counting the forced one (min = max on both sides). Also measured per setting:
* time to the first token: ours, the whole process generating 2 tokens (the forced language and
  one chosen); CTranslate2, `translate_batch` with a maximum length of 2 (its prefix and one);
* our peak RSS (`/usr/bin/time -f %M`), against the size of the weight file it reads;
* token agreement of each system with ours at the same precision (random weights have near ties:
  a rough check that both decode the same model);
* at batch 1 greedy, how far each of our runs is from the memory bound: the read bandwidth
  (`examples/mem_bandwidth`, T threads, 1024 MiB, measured in every round), the bytes a step
  reads (the decoder's matrices but the cross-attention keys and values, and the tied output
  table, from the file's header), our step time ((32-token run - 2-token run) / 30) as a share of
  that bound, and the *ceiling*: CTranslate2's time over ours if every one of our 30 later steps
  ran at the bound (no engine that reads the weights once a step can beat it by more).

`attn translate` on these directories needs a tokenizer, which random models lack: the files of
`tests/fixtures/multilingual_e2e/nllb` (`sentencepiece.bpe.model`, `special_tokens_map.json`,
`tokenizer_config.json`: a small SentencePiece model with NLLB's special and language tokens)
copied in make them translate text (random words), e.g. 2 lines at 32 new tokens, 2026-12-05:
1.3b int8 3.1 s and 1.40 GB peak RSS (1.02x the file), 3.3b int8 5.9 s and 3.36 GB (1.00x),
1.3b f32 13.3 s and 5.40 GB (0.99x).

Threads: `RAYON_NUM_THREADS=T` for ours, `intra_threads=T, inter_threads=1` for CTranslate2.
`--isa` limits both sides to a level (`bench/isa_limits.py`).
"""
import argparse
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

from safetensors.torch import load_file, save_file  # noqa: E402

import compare_multilingual as ml  # noqa: E402
from compare_marian import ours_isa, run_ours_once  # noqa: E402
from compare_precision import agreement  # noqa: E402

SETTINGS = ml.SETTINGS
NAMES = {ml.BOS: "<s>", ml.PAD: "<pad>", ml.EOS: "</s>", 3: "<unk>"}


def token(i):
    return NAMES.get(int(i), f"t{int(i)}")


def convert_ct2(model_dir, out_dir, vocab_size, quantization=None):
    """CTranslate2's conversion of the model (once; float32 unless `quantization` says), with a
    stand-in tokenizer."""
    import ctranslate2

    if (Path(out_dir) / "model.bin").exists():
        return out_dir

    class Vocab:
        bos_token, eos_token, unk_token, pad_token = "<s>", "</s>", "<unk>", "<pad>"
        unk_token_id = 3
        special_tokens_map = {}
        num_madeup_words = 0

        def get_vocab(self):
            return {token(i): i for i in range(vocab_size)}

        def convert_ids_to_tokens(self, i):
            return token(i)

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return Vocab()

    Converter(str(model_dir), low_cpu_mem_usage=True).convert(str(out_dir), quantization=quantization,
                                                               force=True)
    return out_dir


def build(workdir, size, attn, seed):
    root = Path(workdir) / f"nllb-{size}"
    model, ct2, int8 = root / "model", root / "ct2", root / "int8"
    if not (model / "config.json").exists():
        t = time.perf_counter()
        ml.build_model(model, size, seed)
        print(f"created {model} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    if not (ct2 / "model.bin").exists():
        t = time.perf_counter()
        # The 3.3b is converted to int8 directly: a float32 model.bin would be another 13.4 GB
        # and its conversion holds two copies in memory.
        convert_ct2(model, ct2, ml.SIZES[size]["vocab_size"], "int8" if size == "3.3b" else None)
        print(f"converted {ct2} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    if not (int8 / "model.safetensors").exists():
        subprocess.run([attn, "convert", "--model", str(model), "--output", str(int8),
                        "--quantize", "int8", "--force"], check=True, stdout=subprocess.DEVNULL)
    return model, ct2, int8


def ct2_run(translator, source, prefix, beams, length):
    kw = dict(beam_size=beams, min_decoding_length=length, max_decoding_length=length,
              num_hypotheses=1, target_prefix=prefix)
    t, c = time.perf_counter(), time.process_time()
    out = translator.translate_batch(source, **kw)
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    rev = {v: k for k, v in NAMES.items()}
    toks = [[rev[t] if t in rev else int(t[1:]) for t in r.hypotheses[0]] for r in out]
    return secs, cpu, toks


def ours_run(attn, model_dir, in_path, out_path, beams, length, forced, extra, env):
    cmd = [attn, "generate", "--model", str(model_dir), "--inputs", str(in_path), "--output",
           str(out_path), "--beams", str(beams), "--max-new-tokens", str(length),
           "--min-new-tokens", str(length), "--forced-bos-token-id", str(forced), *extra]
    wall, cpu, rss = run_ours_once(cmd, env)
    toks = load_file(str(out_path))["sequences"][:, 1:].tolist()
    return wall, cpu, rss, toks


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default=str(Path(__file__).resolve().parent.parent / "target" / "release" / "attn"))
    p.add_argument("--size", choices=["600m", "1.3b", "3.3b"], default="600m")
    p.add_argument("--workdir", required=True, help="where the models are built once and kept")
    p.add_argument("--precisions", default=None, help="f32,int8 (default: both; int8 for 3.3b)")
    p.add_argument("--settings", default="b1_greedy,b8_greedy")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-at-load", action="store_true", help="leave out ours with --quantize int8")
    p.add_argument("--isa", choices=sorted(ISA_ENV), default=None)
    a = p.parse_args()
    import ctranslate2

    bandwidth_tool = str(Path(a.attn).resolve().parent / "examples" / "mem_bandwidth")
    precisions = (a.precisions or ("int8" if a.size == "3.3b" else "f32,int8")).split(",")
    model, ct2_dir, int8_dir = build(a.workdir, a.size, a.attn, a.seed)
    file_bytes = {"f32": (model / "model.safetensors").stat().st_size,
                  "int8": (int8_dir / "model.safetensors").stat().st_size}
    _, forced, _ = ml.LANGS[a.size]
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    print(f"NLLB-200 {a.size} (random weights): f32 file {file_bytes['f32'] / 1e9:.2f} GB, int8 file "
          f"{file_bytes['int8'] / 1e9:.2f} GB; CTranslate2 {ctranslate2.__version__}; {a.threads} threads; "
          f"source {a.src_len} tokens, {a.new_tokens} tokens a row (the forced language first); "
          f"medians of {a.rounds} alternating rounds, CPU seconds in brackets")
    print(f"ISA: ours {ours_isa(a.attn)}")
    with tempfile.TemporaryDirectory(prefix="compare_nllb_ct2_") as tmp:
        for precision in precisions:
            compute = {"f32": "float32", "int8": "int8"}[precision]
            t = time.perf_counter()
            translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute,
                                                intra_threads=a.threads, inter_threads=1)
            ct2_load = time.perf_counter() - t
            ours = ({"ours f32": (model, [])} if precision == "f32" else
                    {"ours int8": (int8_dir, []), **({} if a.no_at_load else
                                                     {"ours int8 at load": (model, ["--quantize", "int8"])})})
            systems = list(ours) + [f"ct2 {compute}"]
            print(f"\n== {precision} (CTranslate2 loaded in {ct2_load:.1f} s, not counted)")
            for name in [s for s in a.settings.split(",") if s]:
                batch, beams = SETTINGS[name]
                ids, mask = ml.make_inputs(batch, a.src_len, a.size, a.seed + 1)
                in_path = Path(tmp) / f"{name}.in.safetensors"
                out_path = Path(tmp) / "out.safetensors"
                save_file({"input_ids": ids, "attention_mask": mask}, str(in_path))
                source = [[token(i) for i in row] for row in ids.tolist()]
                prefix = [[token(forced)] for _ in range(batch)]
                res = {s: {"wall": [], "cpu": [], "rss": [], "first": [], "toks": None} for s in systems}
                translator.translate_batch(source, beam_size=beams, max_decoding_length=2, target_prefix=prefix)
                bound_case = name == "b1_greedy" and a.new_tokens > 2 and os.access(bandwidth_tool, os.X_OK)
                bandwidths = []
                for r in range(a.rounds + 1):  # round 0 warms the page cache, not counted
                    if bound_case and r > 0:
                        bandwidths.append(ml.measure_bandwidth(bandwidth_tool, a.threads))
                    for s in systems:
                        if s in ours:
                            d, extra = ours[s]
                            wall, cpu, rss, toks = ours_run(a.attn, d, in_path, out_path, beams,
                                                            a.new_tokens, forced, extra, env)
                            first, _, _, _ = ours_run(a.attn, d, in_path, out_path, beams, 2, forced,
                                                      extra, env)
                        else:
                            wall, cpu, toks = ct2_run(translator, source, prefix, beams, a.new_tokens)
                            first, _, _ = ct2_run(translator, source, prefix, beams, 2)
                            rss = None
                        if r > 0:
                            res[s]["wall"].append(wall)
                            res[s]["cpu"].append(cpu)
                            res[s]["first"].append(first)
                            if rss is not None:
                                res[s]["rss"].append(rss)
                        res[s]["toks"] = toks
                tokens = batch * a.new_tokens
                med = {s: statistics.median(v["wall"]) for s, v in res.items()}
                ref = res[systems[0]]["toks"]
                print(f"\n{name} (batch {batch}, beams {beams})")
                print(f"{'system':18s} {'tok/s':>8s} {'wall s':>16s} {'first token s':>13s} "
                      f"{'peak RSS':>9s} {'/ file':>6s} {'agree':>6s} {'len':>4s}")
                for s, v in res.items():
                    rss = max(v["rss"]) if v["rss"] else None
                    rss_txt = f"{rss:6.0f} MiB" if rss else f"{'-':>9s}"
                    over = (f"{rss * 2**20 / file_bytes['f32' if s in ('ours f32', 'ours int8 at load') else 'int8']:6.2f}"
                            if rss else f"{'-':>6s}")
                    lens = sorted({len(t) for t in v["toks"]})
                    print(f"{s:18s} {tokens / med[s]:8.1f} {med[s]:7.3f} ({statistics.median(v['cpu']):6.2f}) "
                          f"{statistics.median(v['first']):13.3f} {rss_txt} {over} "
                          f"{agreement(v['toks'], ref):6.3f} {'/'.join(map(str, lens)):>4s}")
                peer = f"ct2 {compute}"
                print("ratios (tok/s, ours / CTranslate2): " + ", ".join(
                    f"{s} {med[peer] / med[s]:.2f}" for s in ours))
                if bandwidths:
                    bw = statistics.median(bandwidths)
                    for s, (d, extra) in ours.items():
                        weights = (d / "model.safetensors") if not extra else (int8_dir / "model.safetensors")
                        step_b = ml.step_bytes(weights)[0]
                        bound = step_b / (bw * 1e9)
                        first = statistics.median(res[s]["first"])
                        step = (med[s] - first) / (a.new_tokens - 2)
                        ceiling = med[peer] / (first + (a.new_tokens - 2) * bound)
                        print(f"{s}: read bandwidth {bw:.1f} GB/s (median of the rounds), a step reads "
                              f"{step_b / 1e9:.2f} GB: bound {bound * 1e3:.1f} ms, ours "
                              f"{step * 1e3:.1f} ms ({bound / step:.0%} of the bandwidth); ceiling against "
                              f"{peer}: {ceiling:.2f}x")
            del translator


if __name__ == "__main__":
    main()
