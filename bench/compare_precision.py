#!/usr/bin/env python3
"""Our precisions (f32, bf16, int8) against CTranslate2's (float32, int8) on the
opus-mt-en-de-sized random MarianMT model of `compare_marian.py`, side by side in alternating
rounds.

    /work/venv/bin/python bench/compare_precision.py --model-dir /work/bl/opus_rand [--rounds 5] \
        [--settings b1_greedy,b8_greedy,b8_beam4] [--isa avx2] [--int8-dir DIR] [--bf16-dir DIR]

Each round runs every system once per setting, in turn (so that a noisy neighbour hits all of
them alike); medians over the rounds are quoted, with CPU seconds:

* ours: the WHOLE `attn generate --model DIR ... --beams N --max-new-tokens 32
  --min-new-tokens 32` process (start-up and model loading included) with `--dtype f32`,
  `--dtype bf16` and `--quantize int8` (quantized as it loads), and, when given, the
  directories `attn convert` wrote (`--int8-dir`, `--bf16-dir`: loaded in place);
* CTranslate2 4.8.5: the model converted once (float32), loaded once per compute type
  (`float32`, `int8`) with `intra_threads=T, inter_threads=1`, then `translate_batch` on the
  same source ids with `beam_size=N, min_decoding_length=32, max_decoding_length=32`.

Exactly 32 new tokens per row everywhere (tokens/s = rows x 32 / seconds). Also printed: each
system's token agreement with our f32 output (the random model's near-ties make this a rough
figure; the committed fixtures measure accuracy properly) and our peak RSS (`/usr/bin/time`).
`--isa` limits every side to that level, as `compare_marian.py` does.
"""
import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from isa_limits import ISA_ENV, reexec_with_isa_limits  # noqa: E402

reexec_with_isa_limits()

import time  # noqa: E402

from compare_marian import (PAD, SETTINGS, build_model, convert_ct2, ct2_tokens,  # noqa: E402
                            make_inputs, ours_isa, run_ours_once)
from safetensors.torch import load_file, save_file  # noqa: E402


def ct2_once(translator, source, beams, new_tokens):
    kw = dict(beam_size=beams, min_decoding_length=new_tokens, max_decoding_length=new_tokens,
              num_hypotheses=1)
    t, c = time.perf_counter(), time.process_time()
    out = translator.translate_batch(source, **kw)
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    names = {"</s>": 0, "<unk>": 1, "<pad>": PAD}
    toks = [[names[t] if t in names else int(t[1:]) for t in r.hypotheses[0]] for r in out]
    return secs, cpu, toks


def agreement(a, b):
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default=str(Path(__file__).resolve().parent.parent / "target" / "release" / "attn"))
    p.add_argument("--model-dir", required=True, help="the random model (created if missing)")
    p.add_argument("--int8-dir", help="a directory `attn convert --quantize int8` wrote from --model-dir")
    p.add_argument("--bf16-dir", help="a directory `attn convert --quantize bf16` wrote from --model-dir")
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", default="", help="comma list to run only some (names as printed)")
    p.add_argument("--isa", choices=sorted(ISA_ENV), default=None,
                   help="limit every side to this instruction-set level")
    a = p.parse_args()
    import ctranslate2

    model_dir = Path(a.model_dir)
    if not (model_dir / "config.json").exists():
        build_model(model_dir, "safetensors", a.seed)
    ct2_dir = convert_ct2(model_dir, model_dir / "ctranslate2-float32")
    translators = {ct: ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=ct,
                                              intra_threads=a.threads, inter_threads=1)
                   for ct in ("float32", "int8")}
    ours = {"ours f32": (model_dir, ["--dtype", "f32"]),
            "ours bf16": (model_dir, ["--dtype", "bf16"]),
            "ours int8": (model_dir, ["--quantize", "int8"])}
    if a.int8_dir:
        ours["ours int8 dir"] = (Path(a.int8_dir), [])
    if a.bf16_dir:
        ours["ours bf16 dir"] = (Path(a.bf16_dir), ["--dtype", "bf16"])
    systems = list(ours) + ["ct2 float32", "ct2 int8"]
    if a.systems:
        keep = [s.strip() for s in a.systems.split(",")]
        systems = [s for s in systems if s in keep or s == "ours f32"]
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads))
    print(f"CTranslate2 {ctranslate2.__version__}; {a.threads} threads; source length {a.src_len}; "
          f"{a.new_tokens} new tokens; median of {a.rounds} alternating rounds; CPU seconds in brackets")
    limits = " ".join(f"{k}={os.environ[k]}" for k in ISA_ENV["avx2"] if k in os.environ)
    print(f"ISA: ours {ours_isa(a.attn)}{'; limits ' + limits if limits else ''}")
    with tempfile.TemporaryDirectory(prefix="compare_precision_") as tmp:
        for name in [s for s in a.settings.split(",") if s]:
            batch, beams = SETTINGS[name]
            ids, mask = make_inputs(batch, a.src_len, a.seed + 1)
            in_path = Path(tmp) / f"{name}.in.safetensors"
            save_file({"input_ids": ids, "attention_mask": mask}, str(in_path))
            source = ct2_tokens(ids)
            res = {s: {"wall": [], "cpu": [], "rss": [], "toks": None} for s in systems}
            for t in translators.values():  # warm-up
                t.translate_batch(source, beam_size=beams, max_decoding_length=2)
            for r in range(a.rounds + 1):  # round 0 warms the page cache and is not counted
                for s in systems:
                    if s in ours:
                        d, extra = ours[s]
                        out_path = Path(tmp) / "out.safetensors"
                        cmd = [a.attn, "generate", "--model", str(d), "--inputs", str(in_path),
                               "--output", str(out_path), "--beams", str(beams),
                               "--max-new-tokens", str(a.new_tokens), "--min-new-tokens", str(a.new_tokens),
                               *extra]
                        wall, cpu, rss = run_ours_once(cmd, env)
                        toks = load_file(str(out_path))["sequences"][:, 1:].tolist()
                    else:
                        wall, cpu, toks = ct2_once(translators[s.split()[1]], source, beams, a.new_tokens)
                        rss = None
                    if r > 0:
                        res[s]["wall"].append(wall)
                        res[s]["cpu"].append(cpu)
                        if rss is not None:
                            res[s]["rss"].append(rss)
                    res[s]["toks"] = toks
            tokens = batch * a.new_tokens
            med = {s: statistics.median(v["wall"]) for s, v in res.items()}
            print(f"\n{name} (batch {batch}, beams {beams})")
            print(f"{'system':14s} {'tok/s':>8s} {'wall s':>8s} {'CPU s':>8s} {'peak RSS':>9s} {'agree f32':>9s}")
            for s, v in res.items():
                rss = f"{max(v['rss']):6.0f} MiB" if v["rss"] else f"{'-':>9s}"
                print(f"{s:14s} {tokens / med[s]:8.1f} {med[s]:8.3f} {statistics.median(v['cpu']):8.3f} "
                      f"{rss} {agreement(v['toks'], res['ours f32']['toks']):9.3f}")
            pairs = [("ours int8", "ct2 int8"), ("ours int8 dir", "ct2 int8"), ("ours f32", "ct2 float32"),
                     ("ours bf16", "ours f32"), ("ours bf16 dir", "ours f32"), ("ours int8", "ours f32")]
            print("ratios (tok/s): " + ", ".join(f"{x} / {y} = {med[y] / med[x]:.2f}"
                                                 for x, y in pairs if x in med and y in med))
            rss = {s: max(v["rss"]) for s, v in res.items() if v["rss"]}
            for s in ("ours int8", "ours int8 dir", "ours bf16", "ours bf16 dir"):
                if s in rss:
                    print(f"peak RSS {s} / ours f32 = {rss[s] / rss['ours f32']:.2f}")


if __name__ == "__main__":
    main()
