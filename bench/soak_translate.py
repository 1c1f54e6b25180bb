#!/usr/bin/env python3
"""Long-stream soak of `attn translate --model DIR`: N mixed lines on stdin (normal sentences,
empty and whitespace-only lines, lines too long for the model, invalid UTF-8, characters the
tokenizer does not know), checking that every line gets exactly one output line, in order,
that each normal line's output is what that text gives alone, that failing lines are reported
on stderr with their line number, and the exit code (1 when any line failed). Reports the
wall time and the peak RSS (`/usr/bin/time -f %M`) for each stream length, to show how memory
grows with the stream (it should not: the bulk path reads a bounded window).

    python3 bench/soak_translate.py [--attn target/release/attn] [--model tests/fixtures/marian_e2e] \
        [--lines 10000,100000] [--json]

Plain Python (no packages).
"""
import argparse
import json
import os
import random
import re
import subprocess
import tempfile
import time

NORMAL = [
    "Is it forty-two?",
    "Street seven, please.",
    "I see three hundred twelve birds.",
    "Café number ninety-nine = 133.",
    "nine hundred ninety-nine",
    "It is five.",
    "Is it 42?",
]


def stream(n, seed=0):
    """Returns (bytes, kinds): the stream and the kind of each line."""
    rng = random.Random(seed)
    out, kinds = bytearray(), []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            line, kind = rng.choice(NORMAL).encode(), "normal"
        elif r < 0.65:
            line, kind = b"", "empty"
        elif r < 0.72:
            line, kind = b" \t  ", "blank"
        elif r < 0.80:
            line, kind = (" ".join(rng.choice(NORMAL) for _ in range(250))).encode(), "too_long"
        elif r < 0.87:
            line, kind = b"abc \xff\xfe def", "invalid_utf8"
        else:
            line, kind = ("Is it " + rng.choice(["\u2603", "\U0001F600", "\u0f00", "\u16a0"]) + "?").encode(), "unknown_chars"
        out += line + b"\n"
        kinds.append(kind)
    return bytes(out), kinds


def run(attn, model, data):
    timer = ["/usr/bin/time", "-f", "%M"] if os.path.exists("/usr/bin/time") else []
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.run(timer + [attn, "translate", "--model", model, "--beam", "1"],
                           input=data, stdout=subprocess.PIPE, stderr=err)
        secs = time.perf_counter() - t
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    lines = stderr.strip().split("\n")
    rss = int(lines[-1]) / 1024 if timer and lines[-1].isdigit() else float("nan")
    return p.returncode, p.stdout, stderr, secs, rss


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--attn", default=os.path.join(root, "target", "release", "attn"))
    ap.add_argument("--model", default=os.path.join(root, "tests", "fixtures", "marian_e2e"))
    ap.add_argument("--lines", default="10000,100000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    # What each distinct text gives alone.
    alone = {}
    for text in NORMAL + ["Is it \u2603?", "Is it \U0001F600?", "Is it \u0f00?", "Is it \u16a0?", "", " \t  "]:
        code, out, err, _, _ = run(args.attn, args.model, (text + "\n").encode())
        alone[text] = out.decode().rstrip("\n")
    results = []
    for n in [int(x) for x in args.lines.split(",")]:
        data, kinds = stream(n)
        code, out, stderr, secs, rss = run(args.attn, args.model, data)
        got = out.decode().split("\n")
        assert got[-1] == "" and len(got) == n + 1, f"{len(got) - 1} output lines for {n} input lines"
        got = got[:-1]
        texts = data.split(b"\n")[:-1]
        failed_lines = {int(m.group(1)) for m in re.finditer(r"^error: line (\d+):", stderr, re.M)}
        for i, (kind, text, line) in enumerate(zip(kinds, texts, got)):
            if kind in ("too_long", "invalid_utf8"):
                assert line == "" and (i + 1) in failed_lines, f"line {i + 1} ({kind})"
            else:
                want = alone[text.decode()]
                assert line == want, f"line {i + 1} ({kind}): {line!r} vs {want!r}"
                assert (i + 1) not in failed_lines, f"line {i + 1} ({kind}) reported as failed"
        assert code == 1, f"exit code {code} with failing lines"
        r = {"lines": n, "seconds": round(secs, 2), "lines_per_second": round(n / secs), "peak_rss_mib": round(rss, 1),
             "failed": len(failed_lines), "exit_code": code}
        results.append(r)
        print(json.dumps(r) if args.json else
              f"{n} lines: {secs:.1f} s ({n / secs:.0f} lines/s), peak RSS {rss:.1f} MiB, "
              f"{len(failed_lines)} failed lines reported, exit code {code}: every line one output line, in order")


if __name__ == "__main__":
    main()
