#!/usr/bin/env python3
"""LibreTranslate 1.9.6's own API tests (libretranslate/tests/test_api/, 14 tests in the pip
package) run over HTTP against any server: `attn serve` or LibreTranslate itself.

    /work/venv-lt/bin/python bench/libretranslate_api_suite.py --url http://127.0.0.1:5000 \
        [--source en --target de] [--tests-from DIR] [-- PYTEST_ARGS...]

What it does: copies the test files from the installed package (or --tests-from) into a
temporary directory, replaces their conftest.py (which builds the Flask app in process with
`--load-only en,es`) by one whose `client` fixture is a `requests` session on --url with the
same interface the tests use (`.get/.post(path, data=..., json=...)` returning an object with
`.status_code`, `.data` (bytes) and `.json`), swaps the tests' language pair en->es for
--source/--target (the benchmark model serves en->de), and runs them with pytest. Nothing else in
the tests changes. Exit status: pytest's.

Needs `requests` and `pytest` (the LibreTranslate venv has requests; `pip install pytest==8.3.5`
there: pytest 9 wants packaging>=24, LibreTranslate pins 23.1).
"""
import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONFTEST = '''
import json as _json
import os

import pytest
import requests

URL = os.environ["LT_SUITE_URL"].rstrip("/")


class Response:
    """The part of Flask's test response the LibreTranslate tests read."""

    def __init__(self, r):
        self.status_code = r.status_code
        self.data = r.content
        self.headers = r.headers

    @property
    def json(self):
        return _json.loads(self.data)


class Client:
    """Flask's test client, over HTTP: data= is a form body, json= a JSON body."""

    def __init__(self):
        self.s = requests.Session()

    def _do(self, method, path, **kw):
        return Response(self.s.request(method, URL + path, timeout=120, **kw))

    def get(self, path, **kw):
        return self._do("GET", path, **kw)

    def post(self, path, **kw):
        return self._do("POST", path, **kw)


@pytest.fixture()
def client():
    c = Client()
    yield c
    c.s.close()
'''


def find_tests(src):
    if src:
        return Path(src)
    spec = importlib.util.find_spec("libretranslate")
    if spec is None:
        sys.exit("libretranslate is not installed in this python: run it with /work/venv-lt/bin/python "
                 "or pass --tests-from DIR (a copy of libretranslate/tests/test_api)")
    return Path(spec.origin).parent / "tests" / "test_api"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="e.g. http://127.0.0.1:5000 (loopback only)")
    ap.add_argument("--source", default="en")
    ap.add_argument("--target", default="de")
    ap.add_argument("--tests-from", default=None, help="default: the installed package's tests/test_api")
    ap.add_argument("--keep", action="store_true", help="keep (and print) the temporary test directory")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    src = find_tests(args.tests_from)
    tmp = Path(tempfile.mkdtemp(prefix="lt_api_suite_"))
    dst = tmp / "test_api"
    dst.mkdir()
    n = 0
    for f in sorted(src.glob("test_*.py")):
        text = f.read_text()
        # the tests' pair is en -> es; serve's model may have another one
        text = re.sub(r'"source": "en"', f'"source": "{args.source}"', text)
        text = re.sub(r'"target": "es"', f'"target": "{args.target}"', text)
        (dst / f.name).write_text(text)
        n += len(re.findall(r"^def test_", text, re.M))
    (dst / "conftest.py").write_text(CONFTEST)
    print(f"{n} tests from {src} -> {dst}, against {args.url} ({args.source} -> {args.target})", flush=True)
    env = dict(__import__("os").environ, LT_SUITE_URL=args.url)
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp),
                          str(dst), *args.pytest_args], env=env, cwd=tmp)
    if args.keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
