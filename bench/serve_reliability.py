#!/usr/bin/env python3
"""Reliability of `attn serve` (issue 42): concurrency, faults, soak, SIGTERM under load. Starts
the server itself on 127.0.0.1 (the model and corpus of bench/compare_bulk.py), prints PASS/FAIL
per check and exits 1 on any failure.

    /work/venv-lt/bin/python bench/serve_reliability.py [--attn target/release/attn] \
        [--checks concurrency,faults,sigterm] [--soak-seconds 600] [--requests 2000 --clients 64] \
        [--json FILE]
    # the script itself against LibreTranslate (statuses and counts only, no reference answers):
    /work/venv-lt/bin/python bench/serve_reliability.py --engine libretranslate --no-reference \
        --requests 60 --clients 8 --checks concurrency,faults

References: `attn translate --model DIR --beam 4 --max-new-tokens 256` on every sentence the
requests use, one a line (the server runs with the same --beam and --max-new-tokens). A
request's expected answer is built from them:
* text: one corpus sentence -> its line; multi: 2-3 sentences in one string -> the lines joined by
  a space, or (also accepted, reported apart) the whole string translated as one line;
* list: q = 2-4 sentences -> the list of their lines;
* html: `<p>S1</p><ul><li><b>S2</b></li></ul>` -> the same tags, text nodes = the lines of S1, S2
  (compared after parsing: the reassembled text, not the bytes);
* auto: source "auto", one sentence of >= 60 characters -> detectedLanguage en and its line, or
  (reported apart, as "identity") detectedLanguage the target and the text unchanged, which is
  what LibreTranslate answers for a text it detects as the target language.
Every request uses sentences no other request uses, so an answer swapped between requests shows
up as a mismatch (and is counted as "swapped" when it equals another request's expectation).

Checks:
* concurrency: --clients (64) closed-loop clients, --requests (2,000) requests of the mix above
  (40 % text, 15 % multi, 20 % list, 15 % html, 10 % auto); none lost (all 200), none wrong.
* faults: while 4 "good" clients keep sending checked requests: clients that disconnect mid-body
  and right after sending, that time out (give up after 50 ms), a body that stalls, malformed
  JSON, invalid UTF-8 (JSON and form bodies), a 50 MB body, alternatives=100000, 10,000 texts in
  one list, unknown source and target languages, 200 idle (half-open) connections held open and
  a request half-closed after sending (shutdown(SHUT_WR)). Each fault must get its expected class
  of answer (4xx where the request is bad; a huge list: 4xx or a 200 with every text), the server
  must stay up, and every good request must be answered 200 and right throughout.
* soak (--soak-seconds > 0; the issue's is 600): --soak-clients (16) clients at capacity, 5 % bad
  requests; no error on a good one, RSS flat (mean of the last minute <= 1.05 x the mean of the
  first minute after a 30 s warm-up, + 10 MB).
* sigterm: 32 clients under load, SIGTERM to the server: every request sent >= 0.1 s before the
  signal is answered 200 and right, the server exits 0 within 60 s.
"""
import argparse
import asyncio
import html
import html.parser
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import serve_common as sc  # noqa: E402

RESULTS = []


def report(name, ok, detail=""):
    RESULTS.append({"check": name, "pass": bool(ok), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'}: {name}" + (f" -- {detail}" if detail else ""), flush=True)


# ---------------------------------------------------------------- requests and expectations
INNER_BOUNDARY = re.compile(r"[.!?\u2026][^\w\s]*\s+\S")


MULTI_OK = re.compile(r"[a-z]{4,}[.!?]$")
MULTI_START = re.compile(r"[A-Z][a-z]+\b")


class Texts:
    """Hands out corpus sentences no request used before."""

    def __init__(self, sents, seed=0, min_len=1):
        # Only sentences that are one sentence for any segmenter: no sentence-ending mark
        # followed by a space inside (the corpus has lines such as "... party. . 2.2.", which
        # the server rightly splits into two sentences, so that its answer is two lines'
        # translations, not the whole line's).
        self.sents = [s for s in sents if "\n" not in s and not INNER_BOUNDARY.search(s)]
        random.Random(seed).shuffle(self.sents)
        self.i = 0

    def take(self, n=1, pred=None):
        out = []
        while len(out) < n:
            if self.i >= len(self.sents):
                self.i = 0  # wrapped: swaps can no longer be told apart for reused sentences
            s = self.sents[self.i]
            self.i += 1
            if pred is None or pred(s):
                out.append(s)
        return out


def make_request(kind, texts, src, tgt):
    """(body, sentences used)."""
    if kind == "text":
        s = texts.take(1)
        return {"q": s[0], "source": src, "target": tgt, "format": "text"}, s
    if kind == "multi":
        # Sentences a segmenter must split between: each ends a word of 4+ lowercase letters
        # and a mark (no abbreviation), and starts with a capitalised word.
        s = texts.take(random.randint(2, 3), pred=lambda x: MULTI_OK.search(x) and MULTI_START.match(x))
        return {"q": " ".join(s), "source": src, "target": tgt, "format": "text"}, s
    if kind == "list":
        s = texts.take(random.randint(2, 4))
        return {"q": s, "source": src, "target": tgt, "format": "text"}, s
    if kind == "html":
        s = texts.take(2, pred=lambda x: not any(c in x for c in "<>&"))
        q = f"<p>{html.escape(s[0], quote=False)}</p><ul><li><b>{html.escape(s[1], quote=False)}</b></li></ul>"
        return {"q": q, "source": src, "target": tgt, "format": "html"}, s
    if kind == "auto":
        s = texts.take(1, pred=lambda x: len(x) >= 60)
        return {"q": s[0], "source": "auto", "target": tgt, "format": "text"}, s
    raise ValueError(kind)


class TagText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.texts = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        self.tags.append("/" + tag)

    def handle_data(self, data):
        if data.strip():
            self.texts.append(data.strip())


def check_answer(kind, body, sents, status, payload, ref, whole_ref=None):
    """(ok, why, matched-how). ref: sentence -> reference translation, or None (no references)."""
    if status != 200:
        return False, f"status {status}", None
    try:
        js = json.loads(payload)
    except ValueError:
        return False, "answer is not JSON", None
    got = js.get("translatedText")
    if ref is None:
        ok = (isinstance(got, list) and len(got) == len(sents)) if kind == "list" else isinstance(got, str)
        return ok, "" if ok else f"bad shape {str(got)[:80]}", "shape"
    if kind in ("text", "auto"):
        if kind == "auto":
            det = (js.get("detectedLanguage") or {}).get("language")
            if det == body["target"] and got == body["q"]:
                # Detected as the target language (lists of names, addresses): LibreTranslate
                # answers with the text unchanged (argos' identity translation), and so do we.
                return True, "", "identity"
            if det != "en":
                return False, f"detectedLanguage {det}", None
        return (got == ref[sents[0]]), f"got {got!r:.80} want {ref[sents[0]]!r:.80}", "line"
    if kind == "multi":
        joined = " ".join(ref[s] for s in sents)
        if got == joined:
            return True, "", "sentences"
        if whole_ref is not None and got == whole_ref.get(body["q"]):
            return True, "", "whole line"
        return False, f"got {got!r:.80} want {joined!r:.80}", None
    if kind == "list":
        want = [ref[s] for s in sents]
        return got == want, f"got {str(got)[:80]} want {str(want)[:80]}", "list"
    if kind == "html":
        p = TagText()
        p.feed(got or "")
        want = [ref[s].strip() for s in sents]
        tags_ok = p.tags == ["p", "/p", "ul", "li", "b", "/b", "/li", "/ul"]
        ok = p.texts == want and tags_ok
        return ok, f"tags {p.tags} texts {str(p.texts)[:80]} want {str(want)[:80]}", "html"
    return False, "unknown kind", None


def build_references(args, sentences, whole_lines=()):
    if args.no_reference:
        return None, None
    sentences = sorted(set(sentences))
    args.workdir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    _, _, outs = sc.attn_translate(args.attn, args.model, sentences, args.workdir / "reliability_refs.txt",
                                   beam=args.beam, max_new_tokens=args.max_new_tokens, threads=args.threads)
    ref = dict(zip(sentences, outs))
    whole = None
    if whole_lines:
        whole_lines = sorted(set(whole_lines))
        _, _, outs2 = sc.attn_translate(args.attn, args.model, whole_lines, args.workdir / "reliability_whole.txt",
                                        beam=args.beam, max_new_tokens=args.max_new_tokens, threads=args.threads)
        whole = dict(zip(whole_lines, outs2))
    print(f"references: {len(ref)} sentences (+{len(whole_lines)} whole lines) by attn translate in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    return ref, whole


def plan(n, texts, src, tgt, mix):
    kinds = [k for k, w in mix for _ in range(w)]
    reqs = []
    for _ in range(n):
        kind = random.choice(kinds)
        body, sents = make_request(kind, texts, src, tgt)
        reqs.append((kind, body, sents))
    return reqs


MIX = [("text", 8), ("multi", 3), ("list", 4), ("html", 3), ("auto", 2)]


# ---------------------------------------------------------------- server
class Server:
    def __init__(self, args):
        self.args = args
        self.proc = None

    def start(self):
        a = self.args
        self.port = sc.free_port(a.port)
        self.log = open(a.workdir / f"reliability_{a.engine}_{self.port}.log", "w")
        if a.engine == "ours":
            cmd = sc.attn_serve_cmd(a.attn, a.model, self.port, beam=a.beam, max_new_tokens=a.max_new_tokens,
                                    src=a.source, tgt=a.target, extra=a.serve_extra.split())
            self.proc = sc.start_attn_serve(cmd, threads=a.threads, log=self.log)
            ready = "/health"
        else:
            import serve_peer
            self.proc = serve_peer.start_lt(a.lt_python, a.workdir, self.port, "f32", threads=a.threads, log=self.log,
                                            src=a.source, tgt=a.target)
            ready = "/languages"
        self.guard = sc.MemoryGuard(self.proc, a.rss_cap_mb)
        sc.wait_http(f"http://{sc.LOOPBACK}:{self.port}{ready}", self.proc, timeout=300)
        return self

    def alive(self):
        return self.proc.poll() is None

    def rss(self):
        return sc.proc_mem_mb(self.proc.pid)[0]

    def stop(self):
        if self.proc is not None:
            rc = sc.stop_server(self.proc)
            self.log.close()
            return rc


async def send_checked(port, conn, item, ref, whole, timeout):
    kind, body, sents = item
    t = time.perf_counter()
    try:
        st, _, payload = await asyncio.wait_for(conn.request("POST", "/translate", body), timeout)
    except asyncio.TimeoutError:
        conn.close()
        return {"kind": kind, "ok": False, "why": "timeout", "secs": time.perf_counter() - t, "status": "timeout"}
    except (OSError, sc.HttpError, asyncio.IncompleteReadError, ValueError) as e:
        conn.close()
        return {"kind": kind, "ok": False, "why": f"connection: {e!r}", "secs": time.perf_counter() - t,
                "status": "conn_error"}
    ok, why, how = check_answer(kind, body, sents, st, payload, ref, whole)
    return {"kind": kind, "ok": ok, "why": why, "how": how, "status": st, "secs": time.perf_counter() - t,
            "payload": payload if not ok else None, "sents": sents}


async def run_clients(port, items, clients, ref, whole, timeout, stop_event=None, cycle=False, results=None):
    """Closed-loop clients working through items (consumed in order; with cycle, over and over until
    stop_event); results in order of completion (appended to `results` as they come)."""
    import itertools
    results = [] if results is None else results
    it = iter(enumerate(itertools.cycle(items) if cycle else items))

    async def client():
        conn = sc.Conn(port, retry_stale=False)  # strict: a request the server drops is a failure
        for i, item in it:
            if stop_event is not None and stop_event.is_set():
                break
            ts = time.perf_counter()
            r = await send_checked(port, conn, item, ref, whole, timeout)
            r["i"], r["start"], r["end"] = i, ts, time.perf_counter()
            results.append(r)
        conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return results


def swapped(results, items, ref):
    """Wrong answers that equal another request's expected answer."""
    if ref is None:
        return 0
    expect = {}
    for kind, body, sents in items:
        if kind in ("text", "auto"):
            expect[ref[sents[0]]] = expect.get(ref[sents[0]], 0) + 1
    n = 0
    for r in results:
        if not r["ok"] and r.get("payload"):
            try:
                got = json.loads(r["payload"]).get("translatedText")
            except ValueError:
                continue
            if isinstance(got, str) and got in expect:
                n += 1
    return n


def summarize(results, items, ref, name):
    lost = len(items) - len(results)
    bad = [r for r in results if not r["ok"]]
    by_kind = {}
    for r in results:
        k = by_kind.setdefault(r["kind"], [0, 0])
        k[0] += 1
        k[1] += r["ok"]
    hows = {}
    for r in results:
        if r["ok"] and r.get("how"):
            hows[r["how"]] = hows.get(r["how"], 0) + 1
    lat = [r["secs"] for r in results]
    n200 = sum(1 for r in results if r["status"] == 200)
    detail = (f"{len(items)} sent, {n200} answered 200, {len(bad)} wrong or failed, {swapped(results, items, ref)} "
              f"swapped, by kind (answered, right) {by_kind}, matched as {hows}, p50/p99 "
              f"{sc.percentile(lat, 0.5):.2f}/{sc.percentile(lat, 0.99):.2f} s")
    if bad:
        detail += f"; first failure: {bad[0]['kind']} {bad[0]['status']} {bad[0]['why'][:200]}"
        # Every failure in full, for diagnosis: what was sent, what came back, what was wanted.
        dump = Path(f"/tmp/serve_reliability_failures_{os.getpid()}.jsonl")
        with dump.open("a", encoding="utf-8") as f:
            for r in bad:
                want = [ref.get(x) for x in r.get("sents") or []] if ref else None
                f.write(json.dumps({"check": name, "kind": r["kind"], "status": r["status"], "why": r["why"],
                                    "sents": r.get("sents"), "payload": r.get("payload"), "want": want},
                                   ensure_ascii=False, default=str) + "\n")
        detail += f" (all failures: {dump})"
    report(name, lost == 0 and not bad, detail)
    return bad


# ---------------------------------------------------------------- checks
def check_concurrency(srv, args, items, ref, whole):
    t = time.perf_counter()
    results = asyncio.run(run_clients(srv.port, items, args.clients, ref, whole, args.timeout))
    summarize(results, items, ref, f"concurrency: {args.clients} clients, {len(items)} requests "
                                   f"({time.perf_counter() - t:.1f} s)")
    report("concurrency: server still up", srv.alive())


async def raw_exchange(port, data: bytes, read=True, timeout=30.0, then=None):
    """Sends raw bytes on a new connection; returns the status (int), 'closed' or 'timeout'."""
    c = sc.Conn(port)
    try:
        await c.open()
        c.writer.write(data)
        await c.writer.drain()
        if then == "shutdown_wr":
            c.writer.transport.write_eof()
        if not read:
            return None
        st, h, b = await asyncio.wait_for(c.read_response(), timeout)
        return st, b
    except asyncio.TimeoutError:
        return "timeout", b""
    except (OSError, sc.HttpError, asyncio.IncompleteReadError) as e:
        return "closed", repr(e).encode()
    finally:
        c.close()


def post_bytes(port, body: bytes, ctype="application/json", extra_headers=""):
    return (f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra_headers}\r\n").encode() + body


async def fault_list(port, args, texts, good_results, alive):
    src, tgt = args.source, args.target
    out = []

    t_last = [time.perf_counter()]

    def expect(name, got, ok_statuses, allow_closed=False):
        st = got[0] if isinstance(got, tuple) else got
        ok = st in ok_statuses or (allow_closed and st == "closed")
        body = got[1][:160] if isinstance(got, tuple) else b""
        now = time.perf_counter()
        up = alive()
        out.append((name, ok and up, f"answered {st} {body!r} ({now - t_last[0]:.2f} s)" + ("" if up else "; SERVER DIED")))
        t_last[0] = now

    four = set(range(400, 500))
    # disconnect mid-body, and right after sending a whole request; give up after 50 ms
    body = json.dumps({"q": texts.take(1)[0], "source": src, "target": tgt}).encode()
    full = post_bytes(port, body)
    for _ in range(10):
        await raw_exchange(port, full[: len(full) - len(body) // 2], read=False)
        await raw_exchange(port, full, read=False)
        r = await raw_exchange(port, full, timeout=0.05)
    out.append(("clients disconnecting mid-body / after sending / timing out after 50 ms (10 each)", alive(),
                "sent" + ("" if alive() else "; SERVER DIED")))
    # a body that stalls: Content-Length 1000, 10 bytes, then silence (the server may time it out)
    stall = asyncio.create_task(raw_exchange(
        port, post_bytes(port, b"x" * 1000)[: -990], timeout=args.stall_seconds))
    # malformed JSON
    expect("malformed JSON -> 400", await raw_exchange(port, post_bytes(port, b'{"q": "Hello", "source": ')), {400})
    # invalid UTF-8, in JSON and in a form body
    expect("invalid UTF-8 in JSON -> 4xx",
           await raw_exchange(port, post_bytes(port, b'{"q": "caf\xe9 \xff\xfe", "source": "en", "target": "de"}')), four)
    expect("invalid UTF-8 in a form body -> 4xx or 200",
           await raw_exchange(port, post_bytes(port, b"q=caf%E9%FF&source=en&target=de",
                                               "application/x-www-form-urlencoded")), four | {200})
    # a 50 MB body
    if args.big_body_mb > 0:
        big = json.dumps({"q": "a" * int(args.big_body_mb * 1024 * 1024), "source": src, "target": tgt}).encode()
        t = time.perf_counter()
        got = await raw_exchange(port, post_bytes(port, big), timeout=120)
        expect(f"{args.big_body_mb:g} MB body -> 413/400 (or closed) ({time.perf_counter() - t:.1f} s)", got,
               {413, 400}, allow_closed=True)
    # alternatives=100000 (LibreTranslate 1.9.6 with its defaults takes it: CTranslate2 is asked for a beam of
    # 100001 and the process grows until the kernel kills it -- 24 GB here, 2026-12-05; never send it there)
    if "alternatives" not in args.skip_faults:
        expect("alternatives=100000 -> 400", await raw_exchange(port, post_bytes(port, json.dumps(
            {"q": "Hello world.", "source": src, "target": tgt, "alternatives": 100000}).encode())), {400})
    # unknown languages
    expect("unknown target zz -> 400", await raw_exchange(port, post_bytes(port, json.dumps(
        {"q": "Hello", "source": src, "target": "zz"}).encode())), {400})
    expect("unknown source xx -> 400", await raw_exchange(port, post_bytes(port, json.dumps(
        {"q": "Hello", "source": "xx", "target": tgt}).encode())), {400})
    # idle (half-open) connections held open while the rest goes on, and a half-closed request
    async def idle_conn(i):
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(sc.LOOPBACK, port), 10)
        except (OSError, asyncio.TimeoutError):
            return None
        if i % 2:
            w.write(b"POST /translate HTTP/1.1\r\nHost: x\r\n")  # a header block never finished
        return w

    idle = [w for w in await asyncio.gather(*(idle_conn(i) for i in range(args.idle_connections))) if w]
    n0 = len(good_results)
    await asyncio.sleep(args.idle_hold)
    n1 = len(good_results)
    out.append((f"{len(idle)} idle connections (half of them mid-headers) held open: others still answered", n1 > n0,
                f"{n1 - n0} good answers in the {args.idle_hold:g} s they were held"))
    got = await raw_exchange(port, post_bytes(port, json.dumps({"q": texts.take(1)[0], "source": src,
                                                                "target": tgt}).encode()), then="shutdown_wr", timeout=120)
    expect("request half-closed after sending (SHUT_WR) -> 200 or closed", got, {200}, allow_closed=True)
    # 10,000 texts in one list
    if args.huge_list > 0:
        n = args.huge_list
        many = [f"Item number {i}." for i in range(n)]
        t = time.perf_counter()
        got = await raw_exchange(port, post_bytes(port, json.dumps({"q": many, "source": src, "target": tgt}).encode()),
                                 timeout=args.big_timeout)
        st = got[0]
        ok = st in four
        if st == 200:
            try:
                ok = len(json.loads(got[1])["translatedText"]) == n
            except (ValueError, KeyError, TypeError):
                ok = False
        out.append((f"{n:,} texts in one list -> 4xx or 200 with {n:,} ({time.perf_counter() - t:.1f} s)", ok,
                    f"answered {st}"))
    for w in idle:
        w.transport.abort()
    got = await stall
    out.append((f"stalled body ({args.stall_seconds:.0f} s)", True, f"ended with {got[0]}"))
    return out


def check_faults(srv, args, good_items, ref, whole, texts):
    stop = None

    async def both():
        nonlocal stop
        stop = asyncio.Event()
        results = []
        good = asyncio.create_task(run_clients(srv.port, good_items, 4, ref, whole, args.timeout, stop_event=stop,
                                               cycle=True, results=results))
        rss0 = srv.rss()
        faults = await fault_list(srv.port, args, texts, results, srv.alive)
        rss1 = srv.rss()
        stop.set()
        return faults, await good, rss0, rss1

    t = time.perf_counter()
    faults, good, rss0, rss1 = asyncio.run(both())
    for name, ok, detail in faults:
        report(f"fault: {name}", ok, detail)
    done = [good_items[r["i"] % len(good_items)] for r in good]
    summarize(good, done, ref, f"faults: good requests answered right throughout ({time.perf_counter() - t:.1f} s)")
    report("faults: server still up", srv.alive(), f"RSS {rss0:.0f} -> {rss1:.0f} MB")


BAD_BODIES = [
    lambda p: post_bytes(p, b'{"q": "Hello", "source": '),
    lambda p: post_bytes(p, b'{"q": "\xff\xfe", "source": "en", "target": "de"}'),
    lambda p: post_bytes(p, json.dumps({"q": "Hello", "source": "en", "target": "zz"}).encode()),
    lambda p: post_bytes(p, json.dumps({"q": "Hello", "source": "en", "target": "de", "alternatives": 100000}).encode()),
]


def check_soak(srv, args, texts, ref, whole):
    rng = random.Random(1)
    deadline = time.perf_counter() + args.soak_seconds
    good, bad_sent, bad_status = [], 0, {}
    items_all = []

    async def client(cid):
        nonlocal bad_sent
        conn = sc.Conn(srv.port, retry_stale=False)
        while time.perf_counter() < deadline:
            if rng.random() < 0.05:
                bad_sent += 1
                k = rng.randrange(len(BAD_BODIES) + 1)
                if k == len(BAD_BODIES):  # a disconnect mid-request
                    await raw_exchange(srv.port, BAD_BODIES[0](srv.port)[:40], read=False)
                    continue
                got = await raw_exchange(srv.port, BAD_BODIES[k](srv.port))
                bad_status[str(got[0])] = bad_status.get(str(got[0]), 0) + 1
                continue
            kind = rng.choice([k for k, w in MIX for _ in range(w)])
            body, sents = make_request(kind, texts, args.source, args.target)
            item = (kind, body, sents)
            items_all.append(item)
            r = await send_checked(srv.port, conn, item, ref, whole, args.timeout)
            r["t"] = time.perf_counter()
            good.append(r)
        conn.close()

    async def run():
        await asyncio.gather(*(client(c) for c in range(args.soak_clients)))

    with sc.Sampler(srv.proc.pid, every=1.0) as smp:
        asyncio.run(run())
    bad = [r for r in good if not r["ok"]]
    report(f"soak {args.soak_seconds:.0f} s: no error on good requests", not bad,
           f"{len(good)} good ({len(good) / args.soak_seconds:.1f}/s), {len(bad)} failed"
           + (f" (first: {bad[0]['kind']} {bad[0]['status']} {bad[0]['why'][:150]})" if bad else "")
           + f"; {bad_sent} bad sent, answered {bad_status}")
    warm = min(30.0, args.soak_seconds / 4)
    span = min(60.0, (args.soak_seconds - warm) / 3)
    first = smp.rss_window(warm, warm + span)
    last = smp.rss_window(args.soak_seconds - span, args.soak_seconds + 1)
    flat = first is not None and last is not None and last <= 1.05 * first + 10
    report("soak: RSS flat", flat, f"{first and round(first)} MB after warm-up -> {last and round(last)} MB at the end, "
                                   f"peak {smp.rss_max:.0f} MB; server CPU {smp.cpu_s:.0f} s")
    report("soak: server still up", srv.alive())


def check_sigterm(srv, args, items, ref, whole):
    sent_at_signal = []

    async def run():
        stop = asyncio.Event()
        task = asyncio.create_task(run_clients(srv.port, items, 32, ref, whole, args.timeout, stop_event=stop,
                                               cycle=True))
        await asyncio.sleep(args.sigterm_after)
        t_sig = time.perf_counter()
        os.kill(srv.proc.pid, signal.SIGTERM)
        stop.set()
        res = await task
        sent_at_signal.append(t_sig)
        return res, t_sig

    res, t_sig = asyncio.run(run())
    before = [r for r in res if r["start"] <= t_sig - 0.1]
    in_flight = [r for r in before if r["end"] > t_sig]
    bad = [r for r in before if not r["ok"]]
    t = time.perf_counter()
    try:
        rc = srv.proc.wait(60)
    except Exception:
        rc = None
    report("sigterm: requests in flight at the signal answered 200 and right", in_flight and not bad,
           f"{len(before)} sent >= 0.1 s before it, {len(in_flight)} of them still in flight at it, {len(bad)} failed"
           + (f" (first: {bad[0]['status']} {bad[0]['why'][:150]})" if bad else "")
           + f"; {len(res) - len(before)} sent around/after it")
    report("sigterm: exit 0", rc == 0, f"exit code {rc}, {time.perf_counter() - t:.1f} s after the last answer")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn", default=str(ROOT / "target" / "release" / "attn"))
    ap.add_argument("--engine", choices=["ours", "libretranslate"], default="ours")
    ap.add_argument("--lt-python", default="/work/venv-lt/bin/python")
    ap.add_argument("--bulk-workdir", type=Path, default=Path("/work/bench_models/bulk"))
    ap.add_argument("--workdir", type=Path, default=Path("/work/bench_models/serve"))
    ap.add_argument("--model", type=Path, default=None, help="default: <bulk workdir>/model")
    ap.add_argument("--checks", default="concurrency,faults,soak,sigterm")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=300, help="per good request")
    ap.add_argument("--big-timeout", type=float, default=600, help="the 10,000-text list")
    ap.add_argument("--stall-seconds", type=float, default=20)
    ap.add_argument("--big-body-mb", type=float, default=50, help="0: skip")
    ap.add_argument("--huge-list", type=int, default=10000, help="texts in the one huge list; 0: skip")
    ap.add_argument("--idle-connections", type=int, default=200)
    ap.add_argument("--idle-hold", type=float, default=5, help="seconds the idle connections are held")
    ap.add_argument("--soak-seconds", type=float, default=0)
    ap.add_argument("--soak-clients", type=int, default=16)
    ap.add_argument("--sigterm-after", type=float, default=3.0)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve-extra", default="", help="more `attn serve` arguments, one string")
    ap.add_argument("--source", default="en")
    ap.add_argument("--target", default="de")
    ap.add_argument("--port", type=int, default=5091)
    ap.add_argument("--rss-cap-mb", type=float, default=6000, help="the server is killed past this RSS (a FAIL)")
    ap.add_argument("--skip-faults", default="", help="e.g. alternatives (always skipped for --engine libretranslate)")
    ap.add_argument("--no-reference", action="store_true",
                    help="check statuses and shapes only (e.g. against LibreTranslate, to test this script)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sc.exit_on_signals()
    random.seed(args.seed)
    args.skip_faults = set(x for x in args.skip_faults.split(",") if x)
    if args.engine == "libretranslate":
        args.skip_faults.add("alternatives")  # it would be OOM-killed (see fault_list)
    checks = [c for c in args.checks.split(",") if c]
    if args.soak_seconds <= 0 and "soak" in checks:
        checks.remove("soak")
    args.model = args.model or args.bulk_workdir / "model"
    if not args.no_reference and not Path(args.attn).exists():
        sys.exit(f"{args.attn} does not exist (build it, or pass --attn; --no-reference checks shapes only)")
    texts = Texts(sc.load_corpus(args.bulk_workdir), seed=args.seed)
    conc = plan(args.requests, texts, args.source, args.target, MIX) if "concurrency" in checks else []
    good = plan(400, texts, args.source, args.target, MIX) if "faults" in checks else []
    sig = plan(600, texts, args.source, args.target, MIX) if "sigterm" in checks else []
    soak_texts = Texts(texts.sents[texts.i: texts.i + 1500] or texts.sents[:1500], seed=args.seed + 1)
    fault_texts = Texts(texts.sents[: 50], seed=2)
    need = [s for _, _, ss in conc + good + sig for s in ss] + fault_texts.sents
    if "soak" in checks:
        need += soak_texts.sents
    whole_lines = [b["q"] for k, b, _ in conc + good + sig if k == "multi"]
    ref, whole = build_references(args, need, whole_lines)
    srv = Server(args).start()
    print(f"server up on 127.0.0.1:{srv.port} (pid {srv.proc.pid}), RSS {srv.rss():.0f} MB", flush=True)
    try:
        if "concurrency" in checks:
            check_concurrency(srv, args, conc, ref, whole)
        if "faults" in checks and srv.alive():
            check_faults(srv, args, good, ref, whole, fault_texts)
        if "soak" in checks and srv.alive():
            check_soak(srv, args, soak_texts, ref, whole)
        if "sigterm" in checks and srv.alive():
            check_sigterm(srv, args, sig, ref, whole)
    finally:
        srv.stop()
    if srv.guard.killed_at_mb:
        report(f"memory: server stayed under {args.rss_cap_mb:.0f} MB", False,
               f"killed by the memory guard at {srv.guard.killed_at_mb:.0f} MB")
    n_fail = sum(not r["pass"] for r in RESULTS)
    print(f"\n{len(RESULTS) - n_fail} passed, {n_fail} failed")
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
