"""What bench/compare_serve.py and bench/serve_reliability.py share: a small asyncio HTTP/1.1
client (stdlib only: keep-alive, Content-Length or chunked bodies, raw bytes when a test needs
to send something malformed), a sampler of a process's RSS and CPU seconds from /proc, the
corpus, request texts of 1-3 consecutive corpus sentences, starting and stopping `attn serve`,
and the machine's CPU description.

Every address is 127.0.0.1: these scripts load only servers they start on this machine.
"""
import asyncio
import atexit
import json
import os
import random
import re
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOOPBACK = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- HTTP client
class HttpError(Exception):
    pass


class Conn:
    """One HTTP/1.1 connection to 127.0.0.1:port, reopened when the server closed it."""

    def __init__(self, port, host=LOOPBACK, retry_stale=True):
        self.host, self.port = host, port
        self.reader = self.writer = None
        self.retry_stale = retry_stale

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self):
        if self.writer is not None:
            try:
                self.writer.transport.abort()
            except Exception:
                pass
        self.reader = self.writer = None

    async def send_raw(self, data: bytes):
        if self.writer is None:
            await self.open()
        self.writer.write(data)
        await self.writer.drain()

    async def read_response(self):
        """(status, headers dict lower-cased, body bytes)."""
        line = await self.reader.readline()
        if not line:
            raise HttpError("connection closed before a status line")
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HttpError(f"bad status line {line[:80]!r}")
        status = int(parts[1])
        headers = {}
        while True:
            h = await self.reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await self.reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(chunks)
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:
            body = await self.reader.read()
            self.close()
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body

    async def request(self, method, path, body=None, headers=None, keep_alive=True):
        """One request; on a reused keep-alive connection that the server had closed meanwhile
        (nothing came back), retried once on a new connection."""
        reused = self.writer is not None
        try:
            return await self._request(method, path, body, headers, keep_alive)
        except (HttpError, ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as e:
            if not (reused and self.retry_stale) or (isinstance(e, HttpError) and "before a status line" not in str(e)):
                raise
            self.close()
            return await self._request(method, path, body, headers, keep_alive)

    async def _request(self, method, path, body=None, headers=None, keep_alive=True):
        if self.writer is None:
            await self.open()
        hdrs = {"Host": f"{self.host}:{self.port}", "Connection": "keep-alive" if keep_alive else "close"}
        if body is not None:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                hdrs["Content-Type"] = "application/json"
            hdrs["Content-Length"] = str(len(body))
        hdrs.update(headers or {})
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        self.writer.write(head.encode("latin-1") + (body or b""))
        await self.writer.drain()
        resp = await self.read_response()
        if not keep_alive:
            self.close()
        return resp


async def one_request(port, method, path, body=None, headers=None, timeout=60.0):
    """A request on a connection of its own: (status | 'timeout' | 'conn_error', headers, body, secs)."""
    c = Conn(port)
    t = time.perf_counter()
    try:
        st, h, b = await asyncio.wait_for(c.request(method, path, body, headers, keep_alive=False), timeout)
        return st, h, b, time.perf_counter() - t
    except asyncio.TimeoutError:
        return "timeout", {}, b"", time.perf_counter() - t
    except (OSError, HttpError, asyncio.IncompleteReadError, ValueError) as e:
        return "conn_error", {"error": repr(e)}, b"", time.perf_counter() - t
    finally:
        c.close()


def wait_http(url, proc=None, timeout=180.0):
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


def free_port(preferred=0):
    import socket
    for p in ([preferred] if preferred else []) + [0]:
        s = socket.socket()
        try:
            s.bind((LOOPBACK, p))
            return s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port")


# ---------------------------------------------------------------- process sampling
def proc_cpu_s(pid):
    """utime + stime of the process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_mem_mb(pid):
    """(VmRSS, VmHWM) in MB."""
    rss = hwm = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return rss, hwm


def machine_busy_s():
    """CPU seconds all CPUs of the machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / CLK_TCK


def wait_idle(max_wait=600.0, threshold=0.15, window=3.0, quiet=False):
    """Waits (up to max_wait s) until the machine's busy CPU, over `window` s, is below `threshold`
    cores: on a shared 2-core machine a build next door slows CTranslate2's two spinning intra
    threads 10-40x and any figure with it. Returns the seconds waited, or None if it never got idle."""
    t0 = time.time()
    told = False
    while True:
        b0 = machine_busy_s()
        time.sleep(window)
        busy = (machine_busy_s() - b0) / window
        if busy < threshold:
            return time.time() - t0
        if time.time() - t0 > max_wait:
            if not quiet:
                print(f"  machine still busy ({busy:.2f} cores) after {max_wait:.0f} s: measuring anyway", flush=True)
            return None
        if not told and not quiet:
            print(f"  waiting for an idle machine (busy: {busy:.2f} cores)...", flush=True)
            told = True


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Sampler:
    """Samples a pid's RSS (and CPU seconds) every `every` s in a thread: (t, rss_mb, cpu_s)."""

    def __init__(self, pid, every=0.25):
        self.pid, self.every = pid, every
        self.samples = []
        self._stop = threading.Event()
        self._t = None

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.cpu0 = proc_cpu_s(self.pid)
        self.busy0 = machine_busy_s()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                rss, _ = proc_mem_mb(self.pid)
                self.samples.append((time.perf_counter() - self.t0, rss, proc_cpu_s(self.pid)))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                return
            self._stop.wait(self.every)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.busy1 = machine_busy_s()
        self.wall = time.perf_counter() - self.t0
        self.load1 = loadavg()
        try:
            self.cpu1 = proc_cpu_s(self.pid)
            rss, _ = proc_mem_mb(self.pid)
            self.samples.append((time.perf_counter() - self.t0, rss, self.cpu1))
        except (FileNotFoundError, ProcessLookupError):
            self.cpu1 = self.samples[-1][2] if self.samples else self.cpu0

    @property
    def cpu_s(self):
        return self.cpu1 - self.cpu0

    @property
    def machine_busy(self):
        """Busy CPU seconds of the whole machine over the sampling (server, client and anything else)."""
        return self.busy1 - self.busy0

    @property
    def rss_max(self):
        return max((s[1] for s in self.samples), default=0.0)

    def rss_window(self, a, b):
        """Mean RSS of the samples with a <= t < b (seconds since start)."""
        xs = [s[1] for s in self.samples if a <= s[0] < b]
        return statistics.mean(xs) if xs else None


# ---------------------------------------------------------------- corpus and request texts
SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")  # bench/compare_bulk.py's sentence rule


def load_corpus(bulk_workdir: Path, lines=5000):
    p = Path(bulk_workdir) / f"corpus_{lines}.txt"
    if not p.exists():
        raise SystemExit(f"{p} is missing: build it with `/work/venv/bin/python bench/serve_peer.py build` "
                         f"(the corpus and model of bench/compare_bulk.py)")
    return p.read_text(encoding="utf-8").split("\n")[:-1]


def request_pool(sents, n, seed=0, kmin=1, kmax=3):
    """n request texts, each 1-3 consecutive corpus sentences joined by a space: (text, k)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(kmin, kmax)
        i = rng.randrange(len(sents) - k + 1)
        out.append((" ".join(sents[i:i + k]), k))
    return out


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


# ---------------------------------------------------------------- attn serve
def attn_serve_cmd(attn, model_dir, port, beam=4, max_new_tokens=None, src="en", tgt="de", extra=()):
    cmd = [str(attn), "serve", "--model", f"{src}:{tgt}={model_dir}", "--host", LOOPBACK, "--port", str(port),
           "--beam", str(beam)]
    if max_new_tokens:
        cmd += ["--max-new-tokens", str(max_new_tokens)]
    return cmd + list(extra)


_STARTED = []


def track(proc):
    """Remembers a server this script started, so that it is stopped when the script ends (also on
    SIGTERM/SIGINT, through exit_on_signals)."""
    _STARTED.append(proc)
    return proc


@atexit.register
def _stop_started():
    for p in _STARTED:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except Exception:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except Exception:
                    pass


class MemoryGuard:
    """Kills a server (its process group) whose RSS passes cap_mb: this machine's 24 GB are shared,
    and a server that grows without bound (LibreTranslate on alternatives=100000 did: 24 GB, then
    the kernel's OOM killer) must not take the builds next door with it."""

    def __init__(self, proc, cap_mb=6000, every=0.2):
        self.proc, self.cap, self.every = proc, cap_mb, every
        self.killed_at_mb = None
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.is_set() and self.proc.poll() is None:
            try:
                rss, _ = proc_mem_mb(self.proc.pid)
            except (FileNotFoundError, ProcessLookupError):
                return
            if rss > self.cap:
                self.killed_at_mb = rss
                print(f"  MEMORY GUARD: server RSS {rss:.0f} MB > {self.cap} MB: killed", flush=True)
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            self._stop.wait(self.every)

    def stop(self):
        self._stop.set()


def exit_on_signals():
    """SIGTERM and SIGHUP end the script through SystemExit, so finally blocks and atexit stop its servers."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def start_attn_serve(cmd, threads=2, log=None, env_extra=None):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    env.update(env_extra or {})
    return track(subprocess.Popen(cmd, env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                  start_new_session=True))


def stop_server(proc, sig=signal.SIGTERM, timeout=30.0):
    """Stops a server this script started (its own process group); returns its exit code."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def attn_translate(attn, model_dir, lines, out_path: Path, beam=4, max_new_tokens=None, threads=2, extra=()):
    """`attn translate --model DIR` on lines (one text a line): (wall s, CPU s, outputs)."""
    inp = out_path.with_suffix(".in.txt")
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cmd = [str(attn), "translate", "--model", str(model_dir), "--input", str(inp), "--output", str(out_path),
           "--beam", str(beam)]
    if max_new_tokens:
        cmd += ["--max-new-tokens", str(max_new_tokens)]
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    t, c = time.perf_counter(), os.times()
    subprocess.run(cmd + list(extra), env=env, check=True, stderr=subprocess.DEVNULL)
    secs = time.perf_counter() - t
    c2 = os.times()
    cpu = (c2.children_user - c.children_user) + (c2.children_system - c.children_system)
    return secs, cpu, out_path.read_text(encoding="utf-8").split("\n")[: len(lines)]


def cpu_description(attn=None):
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "CPU family", "Model"):
                info[k.strip()] = v.strip()
            if k.strip() == "Flags":
                flags = set(v.split())
                info["isa"] = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE")
                info["avx512_vnni"] = "avx512_vnni" in flags
    except FileNotFoundError:
        pass
    if attn and Path(attn).exists():
        try:
            info["attn_version"] = subprocess.run([str(attn), "--version"], capture_output=True, text=True,
                                                  timeout=30).stdout.strip()
        except Exception as e:
            info["attn_version"] = f"? ({e})"
    return info
