#!/usr/bin/env python3
"""Runs examples/distributed/spark_translate.py end to end in Spark's local mode, with 1 and
then 2 workers, on a generated JSONL corpus; checks that every input id came back exactly once
with the translation `attn translate` gives that text on its own (or the same error), and
reports the throughput of each run.

    /work/venv/bin/python examples/distributed/run_local.py [--attn target/release/attn] \
        [--model tests/fixtures/marian_e2e] [--lines 5000] [--workers 1,2]

Needs pyspark (pip install pyspark; 4.3 was used) and Java 17+. Takes about a minute per run
on 2 cores with the tiny committed model (most of it Spark's start-up).
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TEXTS = [
    "Is it forty-two?", "Street seven, please.", "I see three hundred twelve birds.",
    "Café number ninety-nine = 133.", "nine hundred ninety-nine", "It is five.", "Is it 42?",
    "The house is green.", "",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", default=os.path.join(ROOT, "target", "release", "attn"))
    ap.add_argument("--model", default=os.path.join(ROOT, "tests", "fixtures", "marian_e2e"))
    ap.add_argument("--lines", type=int, default=5000)
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    rng = random.Random(0)
    tmp = tempfile.mkdtemp(prefix="attn-spark-")
    corpus = os.path.join(tmp, "corpus.jsonl")
    with open(corpus, "w") as f:
        for i in range(args.lines):
            text = rng.choice(TEXTS) if rng.random() > 0.02 else "x" * 5000  # 2% too long
            f.write(json.dumps({"id": i, "text": text, "source": "generated"}) + "\n")
    # The reference: every distinct text through attn on its own.
    distinct = sorted({json.loads(l)["text"] for l in open(corpus)})
    ref_in = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(distinct))
    ref = subprocess.run([args.attn, "translate", "--model", args.model, "--format", "jsonl", "--beam", "1"],
                         input=ref_in.encode(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    want = {}
    for t, line in zip(distinct, ref.stdout.decode().splitlines()):
        obj = json.loads(line)
        want[t] = obj.get("translation", "ERROR" if "error" in obj else None)
    texts = {json.loads(l)["id"]: json.loads(l)["text"] for l in open(corpus)}
    # The same corpus through one attn process (2 threads), without Spark: the baseline.
    t = time.perf_counter()
    with open(corpus, "rb") as f:
        subprocess.run([args.attn, "translate", "--model", args.model, "--format", "jsonl", "--beam", "1"],
                       stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    secs = time.perf_counter() - t
    print(f"attn alone (1 process, 2 threads): {args.lines} lines in {secs:.1f} s ({args.lines / secs:.0f} lines/s)")
    for workers in [int(w) for w in args.workers.split(",")]:
        out_dir = os.path.join(tmp, f"out_{workers}")
        t = time.perf_counter()
        cmd = [sys.executable, os.path.join(HERE, "spark_translate.py"), "--master", f"local[{workers}]",
               "--attn", args.attn, "--model", args.model, "--input", corpus, "--output", out_dir,
               "--partitions", str(2 * workers), "--threads-per-task", str(max(1, 2 // workers))]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        secs = time.perf_counter() - t
        seen = {}
        for part in sorted(glob.glob(os.path.join(out_dir, "part-*"))):
            for line in open(part):
                obj = json.loads(line)
                assert obj["id"] not in seen, f"id {obj['id']} came back twice"
                seen[obj["id"]] = obj
        assert len(seen) == args.lines, f"{len(seen)} of {args.lines} ids came back"
        failed = 0
        for i, obj in seen.items():
            assert obj["source"] == "generated", "extra fields are passed through"
            if "error" in obj:
                failed += 1
                assert want[texts[i]] == "ERROR", f"id {i}: {obj['error']}"
            else:
                assert obj["translation"] == want[texts[i]], f"id {i}: {obj['translation']!r}"
        print(f"{workers} worker(s): {args.lines} lines in {secs:.1f} s ({args.lines / secs:.0f} lines/s, "
              f"Spark start-up included); every id once, each its own translation; {failed} lines "
              f"failed alone and in Spark alike")


if __name__ == "__main__":
    main()
