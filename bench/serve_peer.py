#!/usr/bin/env python3
"""LibreTranslate's side of the serving benchmark: an argos package built from a Hugging Face
Marian directory, installed offline into an ARGOS_PACKAGES_DIR, and a check that LibreTranslate
(started by bench/libretranslate_offline.py) answers POST /translate with it.

    # once: the model and corpus of bench/compare_bulk.py (built here when missing), the package
    /work/venv/bin/python bench/serve_peer.py build [--hf-dir /work/bench_models/bulk/model] \
        [--workdir /work/bench_models/serve] [--from en --to de]
    # start LibreTranslate on it and send one request (then stop it)
    /work/venv/bin/python bench/serve_peer.py check [--lt-python /work/venv-lt/bin/python] \
        [--precision f32|int8] [--port 5077]

`build` needs transformers + CTranslate2 (the converter): /work/venv (docs/performance.md, "How
to reproduce"). LibreTranslate itself runs in its own venv (/work/venv-lt:
`python3 -m venv /work/venv-lt && /work/venv-lt/bin/pip install libretranslate==1.9.6
ctranslate2==4.8.5`; it pulls no torch, ~590 MB), because it pins numpy 1.26 and friends.

The package (what argostranslate.package.Package reads; argos packages are a directory with):
  model/               CTranslate2 conversion of the HF directory (TransformersConverter, float32;
                       ARGOS_COMPUTE_TYPE=int8 quantizes it as it loads, as compare_bulk.py's
                       CTranslate2 int8 rows do)
  sentencepiece.model  the HF directory's source.spm (argos encodes with it and decodes with the
                       same file: compare_bulk.py's model uses one .spm for both sides)
  metadata.json        from/to codes and names, package_version, argos_version
No MiniSBD model is packaged: the launcher replaces the sentence splitter (see there).

Differences from `attn translate` that the benchmark reports rather than hides: argos encodes a
sentence without the trailing `</s>` Marian was trained with (the source is one token shorter),
calls translate_batch with CTranslate2's defaults (max_decoding_length 256, min_decoding_length
1) and length_penalty 0.2, beam max(4, alternatives + 1), batches of 32 tokens
(ARGOS_BATCH_SIZE), and decodes with `_` replaced by a space.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_BULK = Path("/work/bench_models/bulk")
DEFAULT_WORK = Path("/work/bench_models/serve")
NAMES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish"}
PACKAGE_VERSION = "1.0"


def ensure_bulk(workdir: Path = DEFAULT_BULK, lines: int = 5000):
    """The corpus and model of bench/compare_bulk.py, built as its main() builds them (reused
    when present and of the current length circuit)."""
    sys.path.insert(0, str(HERE))
    import compare_bulk as cb
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / f"corpus_{lines}.txt"
    if corpus.exists():
        sents = corpus.read_text(encoding="utf-8").split("\n")[:-1]
    else:
        sents = cb.build_corpus(corpus, lines)
    length_file = workdir / "model" / "length.json"
    if not length_file.exists() or json.loads(length_file.read_text()) != cb.LENGTH_CIRCUIT:
        shutil.rmtree(workdir / "ct2_float32", ignore_errors=True)
        src, out = cb.build_model(workdir, sents[:5000])
        print(f"model built: greedy outputs of {out:.1f} tokens on average for sources of {src:.1f}")
    return workdir / "model", corpus


def package_dir(workdir: Path, src: str, tgt: str) -> Path:
    return workdir / "argos_packages" / f"translate-{src}_{tgt}-{PACKAGE_VERSION.replace('.', '_')}"


def build_package(hf_dir: Path, workdir: Path, src: str, tgt: str, force: bool = False) -> Path:
    pkg = package_dir(workdir, src, tgt)
    stamp = pkg / "source_model.json"
    want = {"hf_dir": str(hf_dir), "mtime": os.path.getmtime(hf_dir / "config.json")}
    for f in ("model.safetensors", "pytorch_model.bin"):
        if (hf_dir / f).exists():
            want[f] = os.path.getmtime(hf_dir / f)
    if not force and stamp.exists() and json.loads(stamp.read_text()) == want:
        print(f"package up to date: {pkg}")
        return pkg
    import ctranslate2
    shutil.rmtree(pkg, ignore_errors=True)
    pkg.mkdir(parents=True)
    ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(pkg / "model"), quantization="float32")
    shutil.copyfile(hf_dir / "source.spm", pkg / "sentencepiece.model")
    meta = {"package_version": PACKAGE_VERSION, "argos_version": "1.9.0", "type": "translate",
            "from_code": src, "from_name": NAMES.get(src, src), "to_code": tgt, "to_name": NAMES.get(tgt, tgt),
            "links": [], "code": f"translate-{src}_{tgt}"}
    (pkg / "metadata.json").write_text(json.dumps(meta, indent=2))
    (pkg / "README.md").write_text(f"Built by bench/serve_peer.py from {hf_dir} (CTranslate2 "
                                   f"{ctranslate2.__version__} TransformersConverter, float32).\n")
    stamp.write_text(json.dumps(want))
    print(f"package built: {pkg}")
    return pkg


def lt_env(workdir: Path, precision: str, threads: int = 2) -> dict:
    """The environment LibreTranslate runs with: the package dir, 2 intra threads, the compute
    type, and every argos/XDG directory under the work dir (nothing in ~)."""
    env = dict(os.environ)
    env.update({
        "ARGOS_PACKAGES_DIR": str(workdir / "argos_packages"),
        "ARGOS_INTRA_THREADS": str(threads),
        "ARGOS_INTER_THREADS": "1",
        "ARGOS_COMPUTE_TYPE": "int8" if precision == "int8" else "float32",
        "ARGOS_DEVICE_TYPE": "cpu",
        "XDG_DATA_HOME": str(workdir / "xdg" / "data"),
        "XDG_CACHE_HOME": str(workdir / "xdg" / "cache"),
        "XDG_CONFIG_HOME": str(workdir / "xdg" / "config"),
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    })
    env.pop("ARGOS_DEBUG", None)
    return env


def start_lt(lt_python: str, workdir: Path, port: int, precision: str, threads: int = 2,
             log=None, src="en", tgt="de", extra=(), env_extra=None):
    """Starts LibreTranslate through the offline launcher; returns the Popen (the server's own
    process: the launcher execs nothing, it *is* the server)."""
    cmd = [lt_python, str(HERE / "libretranslate_offline.py"), "--host", "127.0.0.1", "--port", str(port),
           "--load-only", f"{src},{tgt}", *extra]
    env = lt_env(workdir, precision, threads)
    env.update(env_extra or {})
    proc = subprocess.Popen(cmd, env=env, stdout=log or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        import serve_common
        serve_common.track(proc)
    except ImportError:
        pass
    return proc


def wait_http(url: str, proc=None, timeout: float = 180) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return time.time() - t0
        except Exception:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def post_json(url: str, body: dict, timeout: float = 120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def stop(proc, timeout: float = 15):
    import signal
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["build", "check"])
    ap.add_argument("--hf-dir", type=Path, default=None, help="default: <bulk workdir>/model, built when missing")
    ap.add_argument("--bulk-workdir", type=Path, default=DEFAULT_BULK)
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORK)
    ap.add_argument("--from", dest="src", default="en")
    ap.add_argument("--to", dest="tgt", default="de")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--lt-python", default="/work/venv-lt/bin/python")
    ap.add_argument("--precision", choices=["f32", "int8"], default="f32")
    ap.add_argument("--port", type=int, default=5077)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.cmd == "build":
        hf = args.hf_dir
        if hf is None:
            hf, _ = ensure_bulk(args.bulk_workdir)
        build_package(hf, args.workdir, args.src, args.tgt, args.force)
        return
    corpus = args.bulk_workdir / "corpus_5000.txt"
    sents = corpus.read_text(encoding="utf-8").split("\n")[:3] if corpus.exists() else ["Hello world."]
    log = open(args.workdir / f"libretranslate_{args.port}.log", "w")
    proc = start_lt(args.lt_python, args.workdir, args.port, args.precision, log=log, src=args.src, tgt=args.tgt)
    try:
        base = f"http://127.0.0.1:{args.port}"
        secs = wait_http(base + "/languages", proc)
        print(f"LibreTranslate up in {secs:.1f} s (pid {proc.pid}); /languages: "
              f"{json.loads(urllib.request.urlopen(base + '/languages').read())}")
        for body in ({"q": sents[0], "source": args.src, "target": args.tgt, "format": "text"},
                     {"q": " ".join(sents[:3]), "source": args.src, "target": args.tgt},
                     {"q": sents[:2], "source": "auto", "target": args.tgt, "alternatives": 2}):
            t = time.perf_counter()
            st, js = post_json(base + "/translate", body)
            print(f"POST /translate {json.dumps(body)[:120]}... -> {st} in {time.perf_counter() - t:.2f} s: "
                  f"{json.dumps(js, ensure_ascii=False)[:300]}")
            if st != 200 or "translatedText" not in js:
                sys.exit("FAIL: LibreTranslate did not translate")
        print("PASS: LibreTranslate answers POST /translate on the model")
    finally:
        stop(proc)
        log.close()


if __name__ == "__main__":
    main()
