#!/usr/bin/env python3
"""`attn serve` against LibreTranslate 1.9.6 under concurrent clients, side by side in one run
(issue 42), on the opus-mt-size model and corpus of bench/compare_bulk.py.

    /work/venv-lt/bin/python bench/compare_serve.py [--attn target/release/attn] \
        [--engines ours,libretranslate] [--levels 1,8,32,128] [--seconds 30] [--rounds 2] \
        [--precision f32|int8] [--open-loop-seconds 30] [--open-loop-factor 2] [--quick] \
        [--json FILE] [--markdown FILE]
    # test run, LibreTranslate alone:
    /work/venv-lt/bin/python bench/compare_serve.py --engines libretranslate --levels 1,8 --quick

Before the first run: `/work/venv/bin/python bench/serve_peer.py build` (model, corpus, argos
package; see there for both venvs). Any python 3.9+ runs this script (stdlib only; with
`sentencepiece` importable, output tokens are counted too: both venvs have it).

The engines, each started by this script on 127.0.0.1, one at a time:
* ours: `attn serve --model en:de=DIR --host 127.0.0.1 --port P --beam 4 --max-new-tokens 256`
  with RAYON_NUM_THREADS=2; ready when GET /health answers 200. int8: DIR is the directory
  `attn convert --quantize int8` writes (made once, as compare_bulk.py does).
* libretranslate: bench/libretranslate_offline.py (LibreTranslate's own main(), waitress with its
  4 threads, beam 4, MiniSBD replaced by a rule-based splitter, no model download) with
  ARGOS_INTRA_THREADS=2, ARGOS_COMPUTE_TYPE=float32|int8; ready when GET /languages answers.
  Its CTranslate2 call keeps its defaults: max_decoding_length 256 (hence ours' --max-new-tokens
  256), length_penalty 0.2, batches of 32 tokens.
After it is ready, 3 warm-up requests (LibreTranslate loads the model on the first); the RSS
then is the "idle" RSS.

Per engine and round: closed-loop levels (each client keeps one keep-alive connection and sends
its next request when the last is answered; a request is 1-3 consecutive corpus sentences as
JSON {"q", "source": "en", "target": "de", "format": "text"}, drawn in order from one seeded pool
of request texts, so every engine and round sends the same texts in the same order). Clients
start requests for --seconds; then the ones in flight are awaited (up to --request-timeout).
Throughput counts the 200s answered within the window; latency percentiles are over every
request started in the window (a timed-out one counts as infinitely slow). The server's CPU
seconds and RSS (from /proc/PID) are sampled every 0.25 s, and this client's own CPU seconds are
reported too (it shares the 2 cores). Then an open-loop run: requests started at a fixed rate
(--open-loop-rate, else --open-loop-factor x the engine's best closed-loop requests/s in that
round), each on a new connection with --open-loop-timeout: counts of 200 / 429 / 503 / other /
timeouts, p99 of the 200s, how fast refusals come, RSS over time.
Our bulk path, per round: `attn translate --model DIR --beam 4 --max-new-tokens 256` (the whole
process) on the first --bulk-requests texts of the same pool, one request's text a line
(--bulk-modes request), and one sentence a line (sentence: what the server does after splitting).
Engines alternate ABAB over --rounds; the tables give medians over rounds.

The machine is shared (2 cores; builds run next door): before each level, the open-loop run and
the bulk path, the script waits (--wait-idle, up to 600 s) until the rest of the machine uses
< 0.15 cores, reports the CPU seconds other processes took during each level ("other CPU s") and
marks a level "busy machine!" when they exceed 10 % of its wall time. Measured 2026-12-05: with one
rustc next door, CTranslate2's two intra threads (which spin at barriers) run the same
translate_batch call 10-40x slower (0.9 s idle, 8-34 s contended): such figures mean nothing.

Output lengths are reported per engine (output characters and target.spm tokens per sentence,
and on the texts both answered, the ratio LibreTranslate / ours), since the engines do not write
the same outputs (argos drops the source `</s>`, ranks with length penalty 0.2, and CTranslate2
forbids an empty output).
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import serve_common as sc  # noqa: E402
import serve_peer  # noqa: E402


# ---------------------------------------------------------------- load generators
class Feed:
    """Hands out the pool's request texts in order (one asyncio thread: no lock needed)."""

    def __init__(self, pool):
        self.pool, self.i = pool, 0

    def next(self):
        j = self.i % len(self.pool)
        self.i += 1
        return j


async def closed_loop(port, feed, clients, seconds, timeout, src, tgt, keep_alive=True):
    recs = []
    t0 = time.perf_counter()
    stop_at = t0 + seconds

    async def client(cid):
        conn = sc.Conn(port)
        while time.perf_counter() < stop_at:
            j = feed.next()
            text, k = feed.pool[j]
            body = {"q": text, "source": src, "target": tgt, "format": "text"}
            ts = time.perf_counter()
            status, out = None, None
            try:
                st, _, b = await asyncio.wait_for(conn.request("POST", "/translate", body, keep_alive=keep_alive),
                                                  timeout)
                status = st
                if st == 200:
                    out = json.loads(b).get("translatedText")
            except asyncio.TimeoutError:
                status = "timeout"
                conn.close()
            except (OSError, sc.HttpError, asyncio.IncompleteReadError, ValueError):
                status = "conn_error"
                conn.close()
                await asyncio.sleep(0.05)
            te = time.perf_counter()
            recs.append({"j": j, "k": k, "start": ts - t0, "end": te - t0, "status": status, "out": out})
        conn.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return recs


async def open_loop(port, feed, rate, seconds, timeout, src, tgt):
    recs = []
    t0 = time.perf_counter()
    n = max(1, int(rate * seconds))

    async def fire(j, ts):
        text, k = feed.pool[j]
        st, h, b, secs = await sc.one_request(port, "POST", "/translate",
                                              {"q": text, "source": src, "target": tgt, "format": "text"},
                                              timeout=timeout)
        out = None
        if st == 200:
            try:
                out = json.loads(b).get("translatedText")
            except ValueError:
                st = "bad_json"
        recs.append({"j": j, "k": k, "start": ts - t0, "end": ts - t0 + secs, "status": st, "out": out,
                     "retry_after": h.get("retry-after") if isinstance(h, dict) else None})

    tasks = []
    for i in range(n):
        target = t0 + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(fire(feed.next(), time.perf_counter())))
    sending = time.perf_counter() - t0  # how long starting them took: the achieved rate says if this client kept up
    await asyncio.gather(*tasks)
    return recs, (n - 1) / sending if n > 1 and sending > 0 else rate


# ---------------------------------------------------------------- statistics
def spm_counter(model_dir):
    try:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(Path(model_dir) / "target.spm"))
        return lambda s: len(sp.encode(s))
    except Exception:
        return None


def level_stats(recs, seconds, sampler, client_cpu, count_tokens):
    ok = [r for r in recs if r["status"] == 200]
    in_window = [r for r in ok if r["end"] <= seconds]
    started = [r for r in recs if r["start"] < seconds]
    lat = [(r["end"] - r["start"]) if r["status"] == 200 else float("inf") for r in started]
    errors = {}
    for r in recs:
        if r["status"] != 200:
            errors[str(r["status"])] = errors.get(str(r["status"]), 0) + 1
    sents = sum(r["k"] for r in in_window)
    chars = sum(len(r["out"] or "") for r in in_window)
    toks = sum(count_tokens(r["out"] or "") for r in in_window) if count_tokens else None
    q = lambda p: (None if not lat else (round(sc.percentile(lat, p), 3) if sc.percentile(lat, p) != float("inf") else "timeout"))
    wall = max([seconds] + [r["end"] for r in recs])
    return {
        "requests": len(in_window), "req_per_s": round(len(in_window) / seconds, 2),
        "sent_per_s": round(sents / seconds, 2), "out_chars_per_s": round(chars / seconds, 1),
        "out_tokens_per_s": round(toks / seconds, 1) if toks is not None else None,
        "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "errors": errors,
        "answered_total": len(ok), "started_in_window": len(started),
        "server_cpu_s": round(sampler.cpu_s, 2), "server_cpu_per_wall": round(sampler.cpu_s / wall, 2),
        "client_cpu_s": round(client_cpu, 2), "wall_s": round(wall, 1),
        # CPU seconds the rest of the machine took meanwhile (builds, other sessions): contention
        "other_cpu_s": round(max(0.0, sampler.machine_busy - sampler.cpu_s - client_cpu), 2),
        "loadavg_1m_end": sampler.load1,
        "rss_peak_mb": round(sampler.rss_max, 1),
        "out_chars_per_sentence": round(chars / sents, 1) if sents else None,
        "out_tokens_per_sentence": round(toks / sents, 1) if (toks is not None and sents) else None,
    }


def open_loop_stats(recs, rate, seconds, timeout, sampler, idle_rss):
    by = {}
    for r in recs:
        by[str(r["status"])] = by.get(str(r["status"]), 0) + 1
    ok = [r["end"] - r["start"] for r in recs if r["status"] == 200]
    rej = [r["end"] - r["start"] for r in recs if r["status"] in (429, 503)]
    answered = sum(1 for r in recs if r["status"] in (200, 429, 503))
    wall = max([seconds] + [r["end"] for r in recs])
    first = sampler.rss_window(0, min(5, seconds / 3))
    last = sampler.rss_window(max(0, seconds - 5), seconds + 0.01)
    return {
        "rate": round(rate, 2), "seconds": seconds, "sent": len(recs), "by_status": by,
        "answered_200_429_503": answered, "all_answered": answered == len(recs),
        "ok_per_s": round(len(ok) / wall, 2),  # over the time until the last answer (the queue drains after)
        "p50_ok": round(sc.percentile(ok, 0.5), 3) if ok else None,
        "p99_ok": round(sc.percentile(ok, 0.99), 3) if ok else None,
        "p99_refusal": round(sc.percentile(rej, 0.99), 3) if rej else None,
        "timeout_s": timeout, "wall_s": round(wall, 1),
        "rss_idle_mb": idle_rss, "rss_first5s_mb": round(first, 1) if first else None,
        "rss_last5s_mb": round(last, 1) if last else None, "rss_peak_mb": round(sampler.rss_max, 1),
        "server_cpu_s": round(sampler.cpu_s, 2),
        "rss_trace_mb": [round(s[1], 1) for s in sampler.samples[::8]],
    }


# ---------------------------------------------------------------- engines
class Engine:
    def __init__(self, name, args, work):
        self.name, self.args, self.work = name, args, work
        self.proc = None
        self.log = None

    def start(self, port):
        a = self.args
        self.port = port
        self.log = open(self.work / f"{self.name}_{a.precision}_{port}.log", "w")
        if self.name == "ours":
            env = {"ATTN_CPU_ISA": a.isa} if a.isa else {}
            cmd = sc.attn_serve_cmd(a.attn, a.ours_model, port, beam=a.beam, max_new_tokens=a.max_new_tokens,
                                    src=a.source, tgt=a.target, extra=a.ours_extra.split())
            self.proc = sc.start_attn_serve(cmd, threads=a.threads, log=self.log, env_extra=env)
            ready = "/health"
        else:
            env = {"CT2_VERBOSE": "1"}
            if a.isa:
                env.update({"CT2_FORCE_CPU_ISA": a.isa.upper(), "ONEDNN_MAX_CPU_ISA": a.isa.upper()})
            if a.ct2_isa:
                env["CT2_FORCE_CPU_ISA"] = a.ct2_isa.upper()
            self.proc = serve_peer.start_lt(a.lt_python, a.workdir, port, a.precision, threads=a.threads,
                                            log=self.log, src=a.source, tgt=a.target, env_extra=env)
            ready = "/languages"
        self.guard = sc.MemoryGuard(self.proc, a.rss_cap_mb)
        t = sc.wait_http(f"http://{sc.LOOPBACK}:{port}{ready}", self.proc, timeout=300)
        return t

    def stop(self):
        self.guard.stop()
        rc = sc.stop_server(self.proc)
        self.log.close()
        return rc


async def warm_up(port, pool, src, tgt):
    c = sc.Conn(port)
    for j in range(3):
        st, _, b = await c.request("POST", "/translate", {"q": pool[-1 - j][0], "source": src, "target": tgt})
        if st != 200:
            raise RuntimeError(f"warm-up request answered {st}: {b[:200]!r}")
    c.close()


def run_engine_round(eng, args, pool, count_tokens, outputs):
    res = {"engine": eng.name, "levels": {}}
    port = sc.free_port(args.port_ours if eng.name == "ours" else args.port_lt)
    res["startup_s"] = round(eng.start(port), 2)
    pid = eng.proc.pid
    try:
        res["rss_ready_mb"] = round(sc.proc_mem_mb(pid)[0], 1)
        asyncio.run(warm_up(port, pool, args.source, args.target))
        time.sleep(1.0)
        res["rss_idle_mb"] = round(sc.proc_mem_mb(pid)[0], 1)
        best_rps = 0.0
        for n in args.level_list:
            waited = sc.wait_idle(args.wait_idle) if args.wait_idle > 0 else 0
            feed = Feed(pool)
            c0 = time.process_time()
            with sc.Sampler(pid) as smp:
                recs = asyncio.run(closed_loop(port, feed, n, args.seconds, args.request_timeout, args.source,
                                               args.target, keep_alive=not args.close_connections))
            st = level_stats(recs, args.seconds, smp, time.process_time() - c0, count_tokens)
            st["rss_peak_over_idle"] = round(st["rss_peak_mb"] / res["rss_idle_mb"], 2)
            st["waited_for_idle_s"] = None if waited is None else round(waited, 1)
            st["contended"] = st["other_cpu_s"] > 0.1 * st["wall_s"]
            res["levels"][n] = st
            best_rps = max(best_rps, st["req_per_s"])
            for r in recs:
                if r["out"] is not None:
                    outputs.setdefault(r["j"], r["out"])
            print(f"  {eng.name} {args.precision} {n:>3} clients: {st['req_per_s']} req/s, {st['sent_per_s']} "
                  f"sentences/s, p50/p90/p99 {st['p50']}/{st['p90']}/{st['p99']} s, errors {st['errors']}, "
                  f"server CPU {st['server_cpu_s']} s, other processes' CPU {st['other_cpu_s']} s, RSS peak {st['rss_peak_mb']} MB", flush=True)
            time.sleep(1.0)
        if args.open_loop_seconds > 0:
            if args.wait_idle > 0:
                sc.wait_idle(args.wait_idle)
            rate = args.open_loop_rate or max(0.5, args.open_loop_factor * best_rps)
            feed = Feed(pool)
            with sc.Sampler(pid) as smp:
                recs, achieved = asyncio.run(open_loop(port, feed, rate, args.open_loop_seconds,
                                                       args.open_loop_timeout, args.source, args.target))
            ol = open_loop_stats(recs, rate, args.open_loop_seconds, args.open_loop_timeout, smp, res["rss_idle_mb"])
            ol["achieved_rate"] = round(achieved, 2)
            res["open_loop"] = ol
            print(f"  {eng.name} {args.precision} open loop {ol['rate']} req/s (achieved {ol['achieved_rate']}) for {ol['seconds']} s: "
                  f"{ol['by_status']}, p99 of 200s {ol['p99_ok']} s, RSS {ol['rss_first5s_mb']} -> "
                  f"{ol['rss_last5s_mb']} MB (peak {ol['rss_peak_mb']})", flush=True)
    finally:
        res["exit_code"] = eng.stop()
    if eng.name == "libretranslate":
        log = Path(eng.log.name).read_text(errors="replace")
        isa = [line.strip() for line in log.splitlines() if "ISA" in line or "CPU:" in line]
        res["ct2_cpu_log"] = isa[:4]
    return res


def run_bulk(args, pool, count_tokens, mode, tag):
    texts = pool[: args.bulk_requests]
    if mode == "sentence":
        lines = [s for t, _ in texts for s in sc.SPLIT.split(t)]
    else:
        lines = [t for t, _ in texts]
    nsent = sum(k for _, k in texts)
    out = args.workdir / f"bulk_{mode}_{tag}.txt"
    secs, cpu, outs = sc.attn_translate(args.attn, args.ours_model, lines, out, beam=args.beam,
                                        max_new_tokens=args.max_new_tokens, threads=args.threads)
    toks = sum(count_tokens(o) for o in outs) if count_tokens else None
    return {"mode": mode, "requests": len(texts), "lines": len(lines), "sentences": nsent, "wall_s": round(secs, 2),
            "cpu_s": round(cpu, 2), "sent_per_s": round(nsent / secs, 2), "req_per_s": round(len(texts) / secs, 2),
            "out_tokens_per_s": round(toks / secs, 1) if toks is not None else None,
            "out_chars_per_sentence": round(sum(map(len, outs)) / nsent, 1)}


# ---------------------------------------------------------------- report
def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    if not xs:
        return None
    return round(statistics.median(xs), 3)


def med_any(xs):
    """Median where 'timeout' counts as +inf."""
    ys = [float("inf") if x == "timeout" else x for x in xs if x is not None]
    if not ys:
        return None
    m = statistics.median_low(sorted(ys))
    return "timeout" if m == float("inf") else round(m, 3)


def summarize(rounds, bulk, args):
    summ = {}
    for eng in args.engine_list:
        rs = [r for r in rounds if r["engine"] == eng]
        if not rs:
            continue
        e = {"rss_idle_mb": med([r["rss_idle_mb"] for r in rs]), "levels": {}}
        for n in args.level_list:
            ls = [r["levels"][n] for r in rs if n in r["levels"]]
            if not ls:
                continue
            row = {}
            for k in ("req_per_s", "sent_per_s", "out_tokens_per_s", "out_chars_per_s", "server_cpu_s", "other_cpu_s",
                      "server_cpu_per_wall", "client_cpu_s", "rss_peak_mb", "rss_peak_over_idle",
                      "out_chars_per_sentence", "out_tokens_per_sentence"):
                row[k] = med([l[k] for l in ls])
            for k in ("p50", "p90", "p99"):
                row[k] = med_any([l[k] for l in ls])
            row["contended_rounds"] = sum(1 for l in ls if l.get("contended"))
            errs = {}
            for l in ls:
                for s, c in l["errors"].items():
                    errs[s] = errs.get(s, 0) + c
            row["errors"] = errs
            e["levels"][n] = row
        ols = [r["open_loop"] for r in rs if "open_loop" in r]
        if ols:
            e["open_loop"] = ols
        summ[eng] = e
    if bulk:
        summ["bulk"] = {m: {"sent_per_s": med([b["sent_per_s"] for b in bulk if b["mode"] == m]),
                            "req_per_s": med([b["req_per_s"] for b in bulk if b["mode"] == m]),
                            "out_tokens_per_s": med([b["out_tokens_per_s"] for b in bulk if b["mode"] == m]),
                            "runs": [b for b in bulk if b["mode"] == m]}
                        for m in sorted({b["mode"] for b in bulk})}
    return summ


def targets(summ, args):
    """The issue's targets, where the run measured both sides."""
    out = []
    o, l = summ.get("ours"), summ.get("libretranslate")
    num = lambda x: x if isinstance(x, (int, float)) else float("inf")

    def add(name, value, ok, detail):
        out.append({"target": name, "value": value, "pass": ok, "detail": detail})

    if o and l:
        for n, need in ((32, 4.0), (8, 3.0)):
            if n in o["levels"] and n in l["levels"]:
                r = o["levels"][n]["sent_per_s"] / max(1e-9, l["levels"][n]["sent_per_s"])
                add(f"sentences/s at {n} clients >= {need}x LibreTranslate", round(r, 2), r >= need,
                    f"{o['levels'][n]['sent_per_s']} vs {l['levels'][n]['sent_per_s']}")
        if 32 in o["levels"] and 32 in l["levels"]:
            po, pl = num(o["levels"][32]["p99"]), num(l["levels"][32]["p99"])
            r = po / pl if pl not in (0, float("inf")) else (0.0 if po != float("inf") else float("inf"))
            add("p99 at 32 clients <= 0.5x LibreTranslate", round(r, 3), r <= 0.5, f"{po} s vs {pl} s")
        if 1 in o["levels"] and 1 in l["levels"]:
            po, pl = num(o["levels"][1]["p50"]), num(l["levels"][1]["p50"])
            r = po / pl if pl else float("inf")
            add("single-client median latency <= 0.6x LibreTranslate", round(r, 3), r <= 0.6, f"{po} s vs {pl} s")
    if o:
        best = max((v["sent_per_s"] or 0) for v in o["levels"].values()) if o["levels"] else 0
        for mode, b in (summ.get("bulk") or {}).items():
            if b["sent_per_s"]:
                r = best / b["sent_per_s"]
                add(f"saturated sentences/s >= 85% of the bulk path ({mode} a line)", round(r, 3), r >= 0.85,
                    f"{best} vs {b['sent_per_s']}")
        for ol in o.get("open_loop", []):
            add("open loop: every request answered 200/429/503", ol["answered_200_429_503"], ol["all_answered"],
                f"{ol['by_status']} at {ol['rate']} req/s; p99 of 200s {ol['p99_ok']} s, of refusals "
                f"{ol['p99_refusal']} s")
            if ol["rss_first5s_mb"] and ol["rss_last5s_mb"]:
                flat = ol["rss_last5s_mb"] <= 1.05 * ol["rss_first5s_mb"] + 5
                add("open loop: memory flat", f"{ol['rss_first5s_mb']} -> {ol['rss_last5s_mb']} MB", flat,
                    f"peak {ol['rss_peak_mb']} MB, idle {ol['rss_idle_mb']} MB")
        top = max(args.level_list)
        if top in o["levels"]:
            r = o["levels"][top]["rss_peak_over_idle"]
            add(f"peak RSS at {top} clients <= 1.3x idle", r, r is not None and r <= 1.3,
                f"{o['levels'][top]['rss_peak_mb']} MB vs idle {o['rss_idle_mb']} MB"
                + (f"; LibreTranslate {l['levels'][top]['rss_peak_mb']} MB vs idle {l['rss_idle_mb']} MB"
                   if l and top in l["levels"] else ""))
    return out


def markdown(summ, tg, meta, args):
    L = []
    L.append(f"### Serving: {', '.join(args.engine_list)}, {args.precision}, beam {args.beam} "
             f"({meta['date']})\n")
    cpu = meta["cpu"]
    L.append(f"CPU: {cpu.get('Model name', '?')}, {cpu.get('CPU(s)', '?')} CPUs, ISA {cpu.get('isa', '?')}"
             + (f"; `{cpu['attn_version']}`" if cpu.get("attn_version") else "")
             + (f"; CTranslate2: {'; '.join(meta['ct2_cpu_log'])}" if meta.get("ct2_cpu_log") else "")
             + (f"; forced ISA {args.isa}" if args.isa else "")
             + (f"; CT2_FORCE_CPU_ISA={args.ct2_isa}" if args.ct2_isa else "") + ".")
    L.append(f"Closed loop: {args.seconds} s a level, 1-3 corpus sentences a request, medians of {args.rounds} "
             f"alternating round(s); server threads {args.threads}; ours --max-new-tokens {args.max_new_tokens}. "
             f"'other CPU s': busy CPU seconds of the rest of the machine during the level (0 on an idle machine).\n")
    L.append("| engine | clients | req/s | sentences/s | out tokens/s | p50 s | p90 s | p99 s | errors | "
             "server CPU s (per wall s) | client CPU s | other CPU s | RSS idle / peak MB | out chars (tokens) / sentence |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for eng in args.engine_list:
        e = summ.get(eng)
        if not e:
            continue
        for n, r in e["levels"].items():
            L.append(f"| {eng} | {n}{' (busy machine!)' if r['contended_rounds'] else ''} | {r['req_per_s']} | {r['sent_per_s']} | {r['out_tokens_per_s']} | {r['p50']} | "
                     f"{r['p90']} | {r['p99']} | {r['errors'] or 0} | {r['server_cpu_s']} ({r['server_cpu_per_wall']}) | "
                     f"{r['client_cpu_s']} | {r['other_cpu_s']} | {e['rss_idle_mb']} / {r['rss_peak_mb']} | {r['out_chars_per_sentence']} "
                     f"({r['out_tokens_per_sentence']}) |")
    ols = [(eng, ol) for eng in args.engine_list if summ.get(eng) for ol in summ[eng].get("open_loop", [])]
    if ols:
        L.append("\nOpen loop (each request on a new connection):\n")
        L.append("| engine | rate req/s (achieved) | s | sent | by status | 200s/s (to the last answer) | p50 / p99 of 200s s | p99 refusal s | "
                 "RSS idle / first 5 s / last 5 s / peak MB |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for eng, ol in ols:
            L.append(f"| {eng} | {ol['rate']} ({ol['achieved_rate']}) | {ol['seconds']} | {ol['sent']} | {ol['by_status']} | {ol['ok_per_s']} | "
                     f"{ol['p50_ok']} / {ol['p99_ok']} | {ol['p99_refusal']} | {ol['rss_idle_mb']} / "
                     f"{ol['rss_first5s_mb']} / {ol['rss_last5s_mb']} / {ol['rss_peak_mb']} |")
    if summ.get("bulk"):
        L.append("")
        for m, b in summ["bulk"].items():
            r0 = b["runs"][0]
            L.append(f"Bulk path (`attn translate --model`, whole process, {r0['requests']} request texts, one "
                     f"{m} a line, {r0['lines']} lines): {b['sent_per_s']} sentences/s, {b['req_per_s']} req/s, "
                     f"{b['out_tokens_per_s']} out tokens/s.")
    if meta.get("length_ratio"):
        lr = meta["length_ratio"]
        L.append(f"\nOn the {lr['texts']} request texts both engines answered: LibreTranslate's outputs are "
                 f"{lr['chars']}x ours in characters ({lr['tokens']}x in target.spm tokens); identical on "
                 f"{lr['same']:.1%}.")
    if tg:
        L.append("\n| target | measured | pass | detail |")
        L.append("|---|---|---|---|")
        for t in tg:
            L.append(f"| {t['target']} | {t['value']} | {'PASS' if t['pass'] else 'FAIL'} | {t['detail']} |")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn", default=str(ROOT / "target" / "release" / "attn"))
    ap.add_argument("--bulk-workdir", type=Path, default=Path("/work/bench_models/bulk"))
    ap.add_argument("--workdir", type=Path, default=Path("/work/bench_models/serve"),
                    help="argos package, logs, bulk outputs")
    ap.add_argument("--lt-python", default="/work/venv-lt/bin/python")
    ap.add_argument("--engines", default="ours,libretranslate")
    ap.add_argument("--levels", default="1,8,32,128")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precision", choices=["f32", "int8"], default="f32")
    ap.add_argument("--beam", type=int, default=4, help="LibreTranslate's (ARGOS_BEAM_SIZE default)")
    ap.add_argument("--max-new-tokens", type=int, default=256,
                    help="ours, serve and bulk (CTranslate2's default max_decoding_length, which argos keeps); 0: omit")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--request-timeout", type=float, default=300)
    ap.add_argument("--close-connections", action="store_true", help="closed loop: a new connection per request")
    ap.add_argument("--open-loop-seconds", type=float, default=30)
    ap.add_argument("--open-loop-rate", type=float, default=0, help="req/s; default: factor x best closed-loop req/s")
    ap.add_argument("--open-loop-factor", type=float, default=2.0)
    ap.add_argument("--open-loop-timeout", type=float, default=30)
    ap.add_argument("--bulk-requests", type=int, default=500)
    ap.add_argument("--bulk-modes", default="request,sentence", help="'' to skip the bulk path")
    ap.add_argument("--pool", type=int, default=20000, help="request texts in the seeded pool")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", default="en")
    ap.add_argument("--target", default="de")
    ap.add_argument("--isa", default="", help="e.g. avx2: ATTN_CPU_ISA for ours, CT2_FORCE_CPU_ISA for CTranslate2")
    ap.add_argument("--ct2-isa", default="",
                    help="CTranslate2 only, e.g. AVX512 (on AMD CPUs it selects AVX2 by itself: see its log line)")
    ap.add_argument("--ours-extra", default="", help="more `attn serve` arguments, one string")
    ap.add_argument("--rss-cap-mb", type=float, default=6000, help="a server past this RSS is killed (shared machine)")
    ap.add_argument("--wait-idle", type=float, default=600,
                    help="before each level, wait up to this many s for the rest of the machine to be idle "
                         "(< 0.15 busy cores); 0: don't wait. Levels measured with others busy are marked")
    ap.add_argument("--port-ours", type=int, default=5081)
    ap.add_argument("--port-lt", type=int, default=5082)
    ap.add_argument("--quick", action="store_true",
                    help="test run: 10 s a level, 1 round, 10 s open loop, 100 bulk requests (one a line), 60 s timeouts")
    ap.add_argument("--json", default=None, help="write everything (rounds, medians, targets) to FILE ('-': stdout)")
    ap.add_argument("--markdown", default=None, help="also write the tables to FILE")
    args = ap.parse_args()
    sc.exit_on_signals()
    if args.quick:
        args.seconds, args.rounds, args.open_loop_seconds = 10, 1, 10
        args.bulk_requests, args.bulk_modes, args.request_timeout, args.open_loop_timeout = 100, "request", 60, 30
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.level_list = [int(x) for x in args.levels.split(",") if x.strip()]
    args.workdir.mkdir(parents=True, exist_ok=True)
    hf_model = args.bulk_workdir / "model"
    sents = sc.load_corpus(args.bulk_workdir)
    pool = sc.request_pool(sents, args.pool, seed=args.seed)
    count_tokens = spm_counter(hf_model)
    attn_ok = Path(args.attn).exists()
    if "ours" in args.engine_list or args.bulk_modes:
        if not attn_ok:
            print(f"NOTE: {args.attn} does not exist: ours and the bulk path are skipped", flush=True)
            args.engine_list = [e for e in args.engine_list if e != "ours"]
            args.bulk_modes = ""
    args.ours_model = hf_model
    if attn_ok and args.precision == "int8" and ("ours" in args.engine_list or args.bulk_modes):
        args.ours_model = args.bulk_workdir / "model_int8"
        if not (args.ours_model / "config.json").exists():
            subprocess.run([args.attn, "convert", "--model", str(hf_model), "--output", str(args.ours_model),
                            "--quantize", "int8", "--force"], check=True, stdout=subprocess.DEVNULL)
    if "libretranslate" in args.engine_list:
        pkg = serve_peer.package_dir(args.workdir, args.source, args.target)
        if not (pkg / "metadata.json").exists():
            sys.exit(f"no argos package at {pkg}: run `/work/venv/bin/python bench/serve_peer.py build` first")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": sc.cpu_description(args.attn if attn_ok else None),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    print(f"CPU: {meta['cpu']}", flush=True)
    rounds, bulk = [], []
    outputs = {e: {} for e in args.engine_list}
    for rnd in range(args.rounds):
        for name in args.engine_list:  # ABAB
            print(f"round {rnd + 1}/{args.rounds}: {name}", flush=True)
            res = run_engine_round(Engine(name, args, args.workdir), args, pool, count_tokens, outputs[name])
            res["round"] = rnd
            rounds.append(res)
            if res.get("ct2_cpu_log"):
                meta["ct2_cpu_log"] = res["ct2_cpu_log"]
        for mode in [m for m in args.bulk_modes.split(",") if m]:
            if args.wait_idle > 0:
                sc.wait_idle(args.wait_idle)
            b = run_bulk(args, pool, count_tokens, mode, f"{args.precision}_{rnd}")
            b["round"] = rnd
            bulk.append(b)
            print(f"  bulk ({mode} a line): {b['sent_per_s']} sentences/s, {b['req_per_s']} req/s over "
                  f"{b['requests']} requests, {b['wall_s']} s", flush=True)
    if "ours" in outputs and "libretranslate" in outputs:
        common = sorted(set(outputs["ours"]) & set(outputs["libretranslate"]))
        if common:
            co = sum(len(outputs["ours"][j]) for j in common)
            cl = sum(len(outputs["libretranslate"][j]) for j in common)
            lr = {"texts": len(common), "chars": round(cl / max(1, co), 2),
                  "same": sum(outputs["ours"][j] == outputs["libretranslate"][j] for j in common) / len(common)}
            if count_tokens:
                lr["tokens"] = round(sum(count_tokens(outputs["libretranslate"][j]) for j in common)
                                     / max(1, sum(count_tokens(outputs["ours"][j]) for j in common)), 2)
            meta["length_ratio"] = lr
    summ = summarize(rounds, bulk, args)
    tg = targets(summ, args)
    md = markdown(summ, tg, meta, args)
    print("\n" + md)
    if args.markdown:
        Path(args.markdown).write_text(md + "\n")
    if args.json:
        blob = json.dumps({"meta": meta, "summary": summ, "targets": tg, "rounds": rounds, "bulk": bulk}, indent=1,
                          default=str)
        if args.json == "-":
            print(blob)
        else:
            Path(args.json).write_text(blob)


if __name__ == "__main__":
    main()
