#!/usr/bin/env python3
"""A stand-in for the `attn` binary that lets bench/compare_serve.py and bench/serve_reliability.py
be tested before `attn serve` exists (or on a machine without a Rust build). It "translates" by
upper-casing each sentence (after a small delay per sentence), with LibreTranslate's routes and
error answers, so the scripts' plumbing -- references, html reassembly, swap detection, faults,
SIGTERM -- runs end to end in seconds:

    bench/fake_attn.py translate --model DIR --input IN --output OUT [--beam 4] [--max-new-tokens N]
    bench/fake_attn.py serve --model en:de=DIR --host 127.0.0.1 --port P [--beam 4] [--max-new-tokens N]
    bench/fake_attn.py --version

    FAKE_ATTN_DELAY=0.1 /work/venv-lt/bin/python bench/serve_reliability.py --attn bench/fake_attn.py \
        --soak-seconds 20 --stall-seconds 3      (the delay: requests still in flight at SIGTERM)
    /work/venv-lt/bin/python bench/compare_serve.py --attn bench/fake_attn.py --engines ours --quick

FAKE_ATTN_BUG=swap (2 % of answers are another request's) or drop (2 % closed unanswered) checks
that the reliability checks catch such bugs. It is a test double only: no figure it produces means
anything.
"""
import html
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
DELAY = float(os.environ.get("FAKE_ATTN_DELAY", "0.002"))  # seconds per sentence
MAX_BODY = 1 << 20
MAX_LIST = 1000
STOPPING = threading.Event()
ACTIVE, LAST, ACTIVE_LOCK = [0], [0.0], threading.Lock()
BUG = os.environ.get("FAKE_ATTN_BUG", "")  # "swap": 2 % of answers are another request's; "drop": 2 % dropped
_last = {}
_rng = __import__("random").Random(0)


def tr(sentence):
    time.sleep(DELAY)
    return sentence.upper()


def translate_text(text):
    return " ".join(tr(s) for s in SPLIT.split(text)) if text.strip() else ""


def translate_html(q):
    return re.sub(r">([^<]+)<", lambda m: ">" + html.escape(translate_text(html.unescape(m.group(1))), quote=False) + "<",
                  q)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-attn"

    def log_message(self, *a):
        pass

    def reply(self, status, obj):
        b = json.dumps(obj).encode()
        self.send_response(status)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {"status": "ok"})
        if self.path == "/languages":
            return self.reply(200, [{"code": "en", "name": "English", "targets": ["de"]},
                                    {"code": "de", "name": "German", "targets": []}])
        return self.reply(404, {"error": "Not Found"})

    def do_POST(self):
        with ACTIVE_LOCK:
            ACTIVE[0] += 1
        try:
            self._post()
        finally:
            with ACTIVE_LOCK:
                ACTIVE[0] -= 1
                LAST[0] = time.time()

    def _post(self):
        if self.path != "/translate":
            return self.reply(405 if self.path in ("/health", "/languages") else 404, {"error": "Method Not Allowed"})
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            self.close_connection = True
            return self.reply(413, {"error": "Payload Too Large"})
        self.connection.settimeout(10)
        try:
            raw = self.rfile.read(n)
        except OSError:
            self.close_connection = True
            return
        try:
            if "json" in (self.headers.get("Content-Type") or ""):
                body = json.loads(raw.decode("utf-8"))
            else:
                body = {k: v[0] for k, v in urllib.parse.parse_qs(raw.decode("utf-8", "strict"), errors="strict").items()}
        except (ValueError, UnicodeDecodeError):
            return self.reply(400, {"error": "Invalid request: malformed body"})
        q = body.get("q")
        if q is None:
            return self.reply(400, {"error": "Invalid request: missing q parameter"})
        src, tgt = body.get("source"), body.get("target")
        if src not in ("en", "auto"):
            return self.reply(400, {"error": f"{src} is not supported"})
        if tgt != "de":
            return self.reply(400, {"error": f"{tgt} is not supported"})
        try:
            alt = int(body.get("alternatives", 0))
        except (TypeError, ValueError):
            return self.reply(400, {"error": "Invalid request: alternatives parameter is not a number"})
        if alt > 3:
            return self.reply(400, {"error": "Invalid request: alternatives parameter must be <= 3"})
        fmt = body.get("format") or "text"
        one = translate_html if fmt == "html" else translate_text
        if isinstance(q, list):
            if len(q) > MAX_LIST:
                return self.reply(400, {"error": f"Invalid request: request ({len(q)}) exceeds text limit ({MAX_LIST})"})
            out = {"translatedText": [one(x) for x in q]}
        else:
            out = {"translatedText": one(q)}
        if src == "auto":
            out["detectedLanguage"] = {"confidence": 90.0, "language": "en"}
        if STOPPING.is_set():
            self.close_connection = True
        if BUG and _rng.random() < 0.02:
            if BUG == "drop":
                self.close_connection = True
                return
            if BUG == "swap" and type(out["translatedText"]) in _last:
                out, _last[type(out["translatedText"])] = _last[type(out["translatedText"])], out
        _last[type(out["translatedText"])] = out
        self.reply(200, out)


def arg(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


def main():
    argv = sys.argv[1:]
    if not argv or argv[0] in ("--version", "-V"):
        print("fake_attn 0 (a test double of attn: upper-cases)")
        return
    if argv[0] == "translate":
        lines = open(arg(argv, "--input"), encoding="utf-8").read().split("\n")[:-1]
        with open(arg(argv, "--output"), "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line.upper() + "\n")
        return
    if argv[0] == "serve":
        class Server(ThreadingHTTPServer):
            request_queue_size = 1024  # (5 by default: a burst of clients then waits in SYN retries)

        srv = Server((arg(argv, "--host", "127.0.0.1"), int(arg(argv, "--port", "5000"))), Handler)
        srv.daemon_threads = False  # server_close() waits for the requests in flight

        def drain_then_stop():
            # graceful: a grace period of 2 s, then until no request has been in flight for 0.5 s
            time.sleep(2.0)
            while True:
                with ACTIVE_LOCK:
                    idle = ACTIVE[0] == 0 and time.time() - LAST[0] > 0.5
                if idle:
                    break
                time.sleep(0.05)
            srv.shutdown()

        def term(*_):
            STOPPING.set()
            threading.Thread(target=drain_then_stop, daemon=True).start()

        signal.signal(signal.SIGTERM, term)
        srv.serve_forever()
        srv.server_close()
        return
    sys.exit(f"fake_attn: unknown command {argv[0]}")


if __name__ == "__main__":
    main()
