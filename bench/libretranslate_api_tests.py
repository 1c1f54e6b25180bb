#!/usr/bin/env python3
"""Run LibreTranslate's own API tests (libretranslate/tests/test_api/*.py, from the installed
`libretranslate` package) against a running `attn serve`.

Its tests use Flask's test client (`client.post(path, data=..., json=...)`, `response.data`,
`response.status_code`, `response.json`); this script swaps in a client that sends the same
requests over HTTP to --url, then runs pytest on unmodified copies of the test files. The tests
translate en -> es, so the server must serve that pair (or pass --pair to rewrite the codes).

    python -m venv /work/venv-lt && /work/venv-lt/bin/pip install libretranslate==1.9.6
    attn serve --model en:es=Helsinki-NLP/opus-mt-en-es --port 5000 &
    /work/venv-lt/bin/python bench/libretranslate_api_tests.py --url http://127.0.0.1:5000

Exit status: pytest's.
"""

import argparse
import os
import pathlib
import shutil
import sys
import tempfile

CONFTEST = '''
import json as _json
import os

import pytest
import requests

URL = os.environ["ATTN_LT_URL"].rstrip("/")


class Response:
    def __init__(self, r):
        self.status_code = r.status_code
        self.data = r.content
        self.headers = r.headers

    @property
    def json(self):
        try:
            return _json.loads(self.data)
        except ValueError:
            return None


class Client:
    def __init__(self):
        self.s = requests.Session()
        self.s.trust_env = False

    def open(self, method, path, data=None, json=None, **kw):
        return Response(self.s.request(method, URL + path, data=data, json=json, timeout=120, **kw))

    def get(self, path, **kw):
        return self.open("GET", path, **kw)

    def post(self, path, **kw):
        return self.open("POST", path, **kw)


@pytest.fixture()
def client():
    return Client()
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:5000")
    ap.add_argument(
        "--pair",
        default="en:es",
        help="SRC:TGT to use instead of the tests' en:es (default en:es: unchanged)",
    )
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args()

    import libretranslate  # noqa: F401  (the installed package holds the tests)

    tests = pathlib.Path(libretranslate.__file__).parent / "tests" / "test_api"
    if not tests.is_dir():
        sys.exit(f"no {tests}: install libretranslate (pip install libretranslate==1.9.6)")
    src, tgt = args.pair.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "test_api"
        out.mkdir()
        for f in sorted(tests.glob("test_*.py")):
            text = f.read_text()
            if (src, tgt) != ("en", "es"):
                text = text.replace('"source": "en"', f'"source": "{src}"').replace(
                    '"target": "es"', f'"target": "{tgt}"'
                )
            (out / f.name).write_text(text)
        (out / "conftest.py").write_text(CONFTEST)
        env = dict(os.environ, ATTN_LT_URL=args.url)
        os.environ.update(env)
        import pytest

        return pytest.main([str(out), "-q", "-p", "no:cacheprovider", *args.pytest_args])


if __name__ == "__main__":
    sys.exit(main())
