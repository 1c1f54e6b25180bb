#!/usr/bin/env python3
"""LibreTranslate 1.9.6, offline: its own `libretranslate.main.main()` (waitress, its defaults:
4 threads, beam 4 through ARGOS_BEAM_SIZE's default), with two patches and nothing else:

1. Sentence splitting. argostranslate 1.12's default splitter, MiniSBD, runs an ONNX model it
   downloads on first use; offline it cannot. `argostranslate.sbd.MiniSBDSentencizer` (and the
   name `argostranslate.translate` imported) is replaced by `RuleSentencizer`: a split after
   `.`, `!` or `?` followed by whitespace and an upper-case letter, an opening parenthesis or a
   quote -- the very rule bench/compare_bulk.py cut its corpus with, so a request of 1-3 corpus
   sentences splits back into exactly those sentences. (It is cheaper than MiniSBD's model: if
   anything, LibreTranslate is measured slightly fast.)
2. Model management. `libretranslate.init.boot` downloads the package index when fewer than two
   packages are installed and then MiniSBD's models; it is replaced by a no-op. The package comes
   from ARGOS_PACKAGES_DIR (bench/serve_peer.py builds it). --update-models stays off (its default).

Run it with the LibreTranslate venv's python and LibreTranslate's own flags, e.g.

    ARGOS_PACKAGES_DIR=/work/bench_models/serve/argos_packages ARGOS_INTRA_THREADS=2 \
    ARGOS_COMPUTE_TYPE=float32 /work/venv-lt/bin/python bench/libretranslate_offline.py \
        --host 127.0.0.1 --port 5077 --load-only en,de

(bench/serve_peer.py's start_lt() sets that environment.) The process is the server itself,
so its pid is the one to sample for RSS and CPU time.
"""
import os
import re
import sys

os.environ.setdefault("ARGOS_INTRA_THREADS", "2")
os.environ.setdefault("ARGOS_COMPUTE_TYPE", "float32")
if "ARGOS_PACKAGES_DIR" not in os.environ:
    sys.exit("set ARGOS_PACKAGES_DIR to the directory bench/serve_peer.py build installed the package in")

import argostranslate.sbd as sbd  # noqa: E402
import argostranslate.translate as argos_translate  # noqa: E402

SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


class RuleSentencizer(sbd.ISentenceBoundaryDetectionModel):
    """Rule-based stand-in for MiniSBD (which needs a downloaded ONNX model)."""

    def __init__(self, pkg):
        self.pkg = pkg

    def split_sentences(self, text):
        parts = [p for p in SPLIT.split(text) if p.strip()]
        return parts or [text]

    def __str__(self):
        return "RuleSentencizer (bench/libretranslate_offline.py)"


sbd.MiniSBDSentencizer = RuleSentencizer
argos_translate.MiniSBDSentencizer = RuleSentencizer

import libretranslate.init as lt_init  # noqa: E402


def _offline_boot(load_only=None, update_models=False, install_models=False):
    print("offline launcher: model download/update skipped; packages from "
          f"{os.environ['ARGOS_PACKAGES_DIR']}, sentence splitter: {RuleSentencizer.__name__}", flush=True)


lt_init.boot = _offline_boot

import importlib  # noqa: E402

lt_main = importlib.import_module("libretranslate.main")  # the package's __init__ exports the function `main`

if __name__ == "__main__":
    sys.argv[0] = "libretranslate"
    lt_main.main()
