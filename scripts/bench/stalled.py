"""Can slow or stalled peers stall the server? The client half of scripts/bench/stalled.

The wrapper (scripts/bench/stalled) starts sandboxd (lib.sh's start_sandboxd, default workers)
and nginx with 1 worker serving the same directory, then runs this file once; it drives each
server in turn through three scenarios and prints one table, sandboxd beside nginx:

  1. stalled 200+50: DOWNLOADS downloads of FILE_MIB MiB files and UPLOADS uploads of UPLOAD_MIB
     MiB, all started within half a second. Each download (client SO_RCVBUF = RCVBUF) reads
     about half its body (less if needed so that what is left exceeds the largest send buffer
     the kernel allows, tcp_wmem: the server must then wait on the socket; see stall_point),
     reads nothing for STALL seconds, then reads the rest and checks its SHA-256. Each upload
     (sandboxd: raw `POST /files?path=...`, application/octet-stream; nginx: WebDAV `PUT`)
     sends half its body, sends nothing for STALL seconds, sends the rest and reads the
     answer; the file on disk is then checked (SHA-256).
  2. stalled 1000: STALLED_CONNS connections each ask for an FILE_MIB MiB file and never read
     (opened 50 at a time, for at most OPEN_WITHIN seconds); all are held HOLD seconds once
     open. Afterwards each one's receive queue is peeked to see
     whether its response had started (200), it was refused (503, say) or got nothing.
  3. withheld body x8: WITHHOLDERS unauthenticated connections send
     `GET /health` with `Content-Length: 100` and never send the body, held HOLD seconds.
     Then the variant: WITHHOLDERS concurrent `POST /files?path=x` with
     `Content-Length: 1000000`, no token and no body, each of which must get its 401 at once
     (time to the status line, at most UNAUTH_TIMEOUT seconds).

While a scenario runs, a separate probe process (its own event loop, so the transfers' hashing
cannot delay it) opens a fresh connection every 50 ms for `GET /health` and every 100 ms for
an authenticated download of a 6-byte file; each probe has PROBE_TIMEOUT seconds (2) from
connect to the whole answer. "answered" counts the probes that got the right status (and
body); p99 is over all probes, an unanswered one counting as longer than the timeout (shown
">2000"). The same process samples VmRSS and Threads of the server every 50 ms (/proc/PID/
status) and keeps the peaks: sandboxd's process; for nginx its worker (the master's figure is
in the notes). Every client operation has a deadline (TRANSFER_TIMEOUT for a whole stalled
transfer), so a server that never answers shows up as a count, never as a hang; between
scenarios the client waits (at most SETTLE_TIMEOUT) for the server to answer /health again.

Rows go to $BENCH_RESULTS (benchrow.py): metric, sandboxd, "nginx 1 worker", nginx's figure,
ratio "-", and the issue's absolute target.
"""

import asyncio
import hashlib
import math
import multiprocessing
import os
import resource
import socket
import sys
import time
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchrow import bench_row  # noqa: E402

MIB = 1 << 20


def env_int(name, default):
    return int(os.environ.get(name, default))


def env_float(name, default):
    return float(os.environ.get(name, default))


DOWNLOADS = env_int("DOWNLOADS", 200)
UPLOADS = env_int("UPLOADS", 50)
FILE_MIB = env_int("FILE_MIB", 8)
FILES = env_int("FILES", 4)  # distinct download files, shared round-robin
UPLOAD_MIB = env_int("UPLOAD_MIB", 4)
STALL = env_float("STALL", 8)
RCVBUF = env_int("RCVBUF", 64 * 1024)
TRANSFER_TIMEOUT = env_float("TRANSFER_TIMEOUT", 30)
STALLED_CONNS = env_int("STALLED_CONNS", 1000)
HOLD = env_float("HOLD", 5)
WITHHOLDERS = env_int("WITHHOLDERS", 8)
UNAUTH_TIMEOUT = env_float("UNAUTH_TIMEOUT", 5)
PROBE_TIMEOUT = env_float("PROBE_TIMEOUT", 2)
HEALTH_EVERY = 0.05
SIX_EVERY = 0.1
SAMPLE_EVERY = 0.05
CONNECT_TIMEOUT = 5
OPEN_WITHIN = 15  # scenario 2 stops opening connections after this many seconds
SETTLE_TIMEOUT = env_float("SETTLE_TIMEOUT", 30)
MARGIN = 512 * 1024  # on top of the socket buffers, for the stall point
LAUNCH_GAP = 0.002  # between starts of the stalled transfers: 250 in half a second
SIX_BYTES = b"sixby\n"


# ---------------------------------------------------------------- a minimal HTTP/1.1 client

def http_request(method, target, token=None, length=None, content_type=None, close=True):
    """The bytes of a request head."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    if token:
        lines.append(f"X-Access-Token: {token}")
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def connect(port, rcvbuf=None):
    """A connected non-blocking socket to 127.0.0.1:port; `rcvbuf` is set before connecting,
    so the TCP window the server sees is small from the start."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return sock
    except BaseException:
        sock.close()
        raise


async def read_head(sock):
    """(status, lower-cased headers, body bytes already received) of a response."""
    loop = asyncio.get_running_loop()
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionError("closed before the end of the response head")
        buf += chunk
        if len(buf) > 65536:
            raise ConnectionError("response head over 64 KiB")
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, rest


async def read_response(sock):
    """(status, body) of a small response: Content-Length bytes, else up to EOF."""
    loop = asyncio.get_running_loop()
    status, headers, body = await read_head(sock)
    length = int(headers.get("content-length", -1))
    if status in (204, 304):
        length = 0
    while length < 0 or len(body) < length:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            if length < 0:
                break
            raise ConnectionError("closed in the middle of the body")
        body += chunk
    return status, body


async def read_hashed(sock, digest, have, upto, buf):
    """Reads body bytes into `digest` until `upto` bytes in all; returns the new count."""
    loop = asyncio.get_running_loop()
    view = memoryview(buf)
    while have < upto:
        n = await loop.sock_recv_into(sock, view[:min(len(buf), upto - have)])
        if n == 0:
            raise ConnectionError(f"closed after {have} of {upto} body bytes")
        digest.update(view[:n])
        have += n
    return have


# ---------------------------------------------------------------- the two servers

class Sandboxd:
    name = "sandboxd"
    upload_ok = (200,)

    def __init__(self, port, pid, token, upload_dir):
        self.port, self.pid, self.token, self.upload_dir = port, pid, token, upload_dir

    def download_target(self, path):
        return "/files?path=" + quote(path, safe="/")

    def upload_head(self, index, length):
        target = "/files?path=" + quote(self.upload_path(index), safe="/")
        return http_request("POST", target, self.token, length, "application/octet-stream")

    def upload_path(self, index):
        return os.path.join(self.upload_dir, f"u-{index}.bin")

    def unauthenticated_post(self):
        return http_request("POST", "/files?path=x", None, 1000000, "application/octet-stream",
                            close=False)

    def pids(self):
        """Processes sampled: {role: pid}; the first is the one reported."""
        return {"sandboxd": self.pid}


class Nginx:
    """nginx, 1 worker: root = the files' directory, WebDAV PUT under /up/, the same token
    checked by an `if` on every location but /health (see scripts/bench/stalled)."""
    name = "nginx"
    upload_ok = (201, 204)

    def __init__(self, port, pid, token, root):
        self.port, self.pid, self.token, self.root = port, pid, token, root

    def download_target(self, path):
        return "/" + quote(os.path.relpath(path, self.root))

    def upload_head(self, index, length):
        return http_request("PUT", f"/up/u-{index}.bin", self.token, length,
                            "application/octet-stream")

    def upload_path(self, index):
        return os.path.join(self.root, "up", f"u-{index}.bin")

    def unauthenticated_post(self):
        return http_request("POST", "/files?path=x", None, 1000000, "application/octet-stream",
                            close=False)

    def pids(self):
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                workers = [int(p) for p in f.read().split()]
        except OSError:
            workers = []
        roles = {f"worker{'' if i == 0 else i}": pid for i, pid in enumerate(workers)}
        roles["master"] = self.pid
        return roles


# ---------------------------------------------------------------- probes, in their own process

async def probe_once(port, request, status, body):
    """Seconds for one request on a fresh connection, or None if not answered as expected."""
    start = time.perf_counter()
    sock = None
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            sock = await connect(port)
            await asyncio.get_running_loop().sock_sendall(sock, request)
            got_status, got_body = await read_response(sock)
        if got_status != status or (body is not None and got_body != body):
            return None
        return time.perf_counter() - start
    except (OSError, TimeoutError, ValueError, IndexError):
        return None
    finally:
        if sock is not None:
            sock.close()


def should_stop(stop, parent, deadline):
    return stop.is_set() or os.getppid() != parent or time.monotonic() > deadline


async def probe_loop(probe, port, stop, parent, deadline):
    """Starts a probe every `every` seconds (without waiting for the previous one) until
    told to stop; returns the latencies (None: not answered)."""
    tasks = []
    start = time.monotonic()
    while not should_stop(stop, parent, deadline):
        tasks.append(asyncio.create_task(
            probe_once(port, probe["request"], probe["status"], probe["body"])))
        next_at = start + len(tasks) * probe["every"]
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return list(await asyncio.gather(*tasks))


def read_status(pid):
    """(VmRSS KiB, Threads) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["VmRSS"].split()[0]), int(fields["Threads"])
    except (OSError, KeyError, ValueError):
        return None


async def sample_peaks(pids, stop, parent, deadline):
    """{role: [peak VmRSS KiB, peak Threads]}, sampled every SAMPLE_EVERY seconds."""
    peaks = {role: [0, 0] for role in pids}
    while True:
        for role, pid in pids.items():
            now = read_status(pid)
            if now:
                peaks[role] = [max(peaks[role][0], now[0]), max(peaks[role][1], now[1])]
        if should_stop(stop, parent, deadline):
            return peaks
        await asyncio.sleep(SAMPLE_EVERY)


async def probe_main(spec, ready, stop):
    parent = os.getppid()
    deadline = time.monotonic() + spec["max_seconds"]  # in case the parent never says stop
    sampler = asyncio.create_task(sample_peaks(spec["pids"], stop, parent, deadline))
    loops = [asyncio.create_task(probe_loop(p, spec["port"], stop, parent, deadline))
             for p in spec["probes"]]
    ready.set()
    latencies = await asyncio.gather(*loops)
    return {"latencies": {p["name"]: lat for p, lat in zip(spec["probes"], latencies)},
            "peaks": await sampler}


def probe_process(spec, ready, stop, pipe):
    pipe.send(asyncio.run(probe_main(spec, ready, stop)))


class Probes:
    """Probes and samples a server from a separate process while the caller's work runs."""

    def __init__(self, server, probes, max_seconds):
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self.results, sender = ctx.Pipe(duplex=False)
        spec = {"port": server.port, "pids": server.pids(), "probes": probes,
                "max_seconds": max_seconds}
        self.proc = ctx.Process(target=probe_process, args=(spec, self.ready, self.stop, sender),
                                daemon=True)
        self.proc.start()
        sender.close()

    async def started(self):
        for _ in range(1000):
            if self.ready.is_set():
                return
            await asyncio.sleep(0.01)
        raise RuntimeError("the probe process did not start")

    def finish(self):
        """Stops probing; the results once the last probes are answered or timed out."""
        self.stop.set()
        result = None
        if self.results.poll(PROBE_TIMEOUT + 10):
            result = self.results.recv()
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
        if result is None:
            raise RuntimeError("the probe process sent no results")
        return result


def health_probe():
    return {"name": "health", "request": http_request("GET", "/health"), "status": 204,
            "body": None, "every": HEALTH_EVERY}


def six_probe(server, six_path):
    return {"name": "six", "status": 200, "body": SIX_BYTES, "every": SIX_EVERY,
            "request": http_request("GET", server.download_target(six_path), server.token)}


async def while_probing(server, probes, work, max_seconds):
    """Runs the coroutine function `work` while `probes` run; returns (work's result, probe
    results)."""
    probing = Probes(server, probes, max_seconds)
    try:
        await probing.started()
        result = await work()
    finally:
        probed = probing.finish()
    return result, probed


# ---------------------------------------------------------------- statistics and formatting

def p99(latencies):
    """Nearest-rank 99th percentile in seconds; unanswered (None) count as infinite."""
    if not latencies:
        return None
    ordered = sorted(math.inf if x is None else x for x in latencies)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def fmt_ms(seconds, timeout=PROBE_TIMEOUT):
    if seconds is None:
        return "-"
    if math.isinf(seconds):
        return f">{timeout * 1000:.0f}"
    return f"{seconds * 1000:.1f}"


def fmt_count(ok, total):
    return f"{ok}/{total}"


def answered(latencies):
    return fmt_count(sum(x is not None for x in latencies), len(latencies))


def fmt_mib(kib):
    return f"{kib / 1024:.1f}"


def note(text):
    print(f"# {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- files

def max_send_buffer():
    """The kernel's largest TCP send buffer (tcp_wmem's third field), in bytes."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, IndexError, ValueError):
        return 4 * MIB


def stall_point(size):
    """How many body bytes a stalled download reads before its pause: about half, but at most
    so much that what is left exceeds the largest send buffer the server's socket can grow to
    plus the client's receive buffer, so the server cannot finish into its buffers and must
    wait for the client (else a blocking server would look as good as a non-blocking one)."""
    left = max_send_buffer() + 4 * RCVBUF + MARGIN
    return max(min(size // 2, size - left), min(size // 2, 1 * MIB))


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)


def sha256_file(path):
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(MIB):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def make_download_files(root):
    """FILES random files of FILE_MIB MiB and the 6-byte file in `root`: [(path, size, sha)]."""
    files = []
    for i in range(FILES):
        data = os.urandom(FILE_MIB * MIB)
        path = os.path.join(root, f"big-{i}.bin")
        write_file(path, data)
        files.append((path, len(data), hashlib.sha256(data).hexdigest()))
    write_file(os.path.join(root, "six.txt"), SIX_BYTES)
    return files


class UploadData:
    """Upload i's body: a 16-byte big-endian i, then a shared random block; so each upload's
    content (and SHA-256) is its own."""

    def __init__(self):
        self.block = memoryview(os.urandom(UPLOAD_MIB * MIB))
        self.size = len(self.block)

    def prefix(self, index):
        return index.to_bytes(16, "big")

    def pieces(self, index):
        """The body in three pieces, without copying the block: its 16-byte prefix, the rest
        of the first half, the second half."""
        half = self.size // 2
        return self.prefix(index), self.block[16:half], self.block[half:]

    def sha(self, index):
        digest = hashlib.sha256(self.prefix(index))
        digest.update(self.block[16:])
        return digest.hexdigest()


# ---------------------------------------------------------------- scenario 1: stalled transfers

async def stalled_download(server, path, size, sha):
    """True if the whole file arrived intact despite a STALL-second pause after
    stall_point(size) bytes of it."""
    loop = asyncio.get_running_loop()
    sock = None
    try:
        async with asyncio.timeout(TRANSFER_TIMEOUT):
            sock = await connect(server.port, RCVBUF)
            await loop.sock_sendall(sock, http_request("GET", server.download_target(path),
                                                       server.token))
            status, headers, rest = await read_head(sock)
            if status != 200 or int(headers.get("content-length", -1)) != size:
                return False
            digest = hashlib.sha256(rest)
            buf = bytearray(64 * 1024)
            have = await read_hashed(sock, digest, len(rest), stall_point(size), buf)
            await asyncio.sleep(STALL)
            await read_hashed(sock, digest, have, size, buf)
            return digest.hexdigest() == sha
    except (OSError, TimeoutError, ValueError, IndexError):
        return False
    finally:
        if sock is not None:
            sock.close()


async def stalled_upload(server, index, data):
    """True if the server accepted the upload (its 2xx) after a STALL-second pause in the
    middle of the body; the file on disk is checked afterwards."""
    loop = asyncio.get_running_loop()
    sock = None
    prefix, first, second = data.pieces(index)
    try:
        async with asyncio.timeout(TRANSFER_TIMEOUT):
            sock = await connect(server.port)
            await loop.sock_sendall(sock, server.upload_head(index, data.size) + prefix)
            await loop.sock_sendall(sock, first)
            await asyncio.sleep(STALL)
            await loop.sock_sendall(sock, second)
            status, _ = await read_response(sock)
            return status in server.upload_ok
    except (OSError, TimeoutError, ValueError, IndexError):
        return False
    finally:
        if sock is not None:
            sock.close()


async def start_transfers(server, files, data):
    """Starts DOWNLOADS downloads and UPLOADS uploads, interleaved, LAUNCH_GAP apart; returns
    (download tasks, upload tasks)."""
    downloads, uploads = [], []
    every = max(1, DOWNLOADS // max(1, UPLOADS))
    for i in range(max(DOWNLOADS, UPLOADS)):
        if i < DOWNLOADS:
            path, size, sha = files[i % len(files)]
            downloads.append(asyncio.create_task(stalled_download(server, path, size, sha)))
        if i % every == 0 and len(uploads) < UPLOADS:
            uploads.append(asyncio.create_task(stalled_upload(server, len(uploads), data)))
        await asyncio.sleep(LAUNCH_GAP)
    while len(uploads) < UPLOADS:
        uploads.append(asyncio.create_task(stalled_upload(server, len(uploads), data)))
    return downloads, uploads


async def scenario_transfers(server, files, six_path, data):
    for i in range(UPLOADS):
        try:
            os.unlink(server.upload_path(i))
        except FileNotFoundError:
            pass

    async def work():
        downloads, uploads = await start_transfers(server, files, data)
        return await asyncio.gather(*downloads), await asyncio.gather(*uploads)

    (downloads, uploads), probed = await while_probing(
        server, [health_probe(), six_probe(server, six_path)], work, TRANSFER_TIMEOUT + 30)
    intact_uploads = sum(ok and sha256_file(server.upload_path(i)) == data.sha(i)
                         for i, ok in enumerate(uploads))
    return {"downloads": sum(downloads), "uploads": intact_uploads, **probed}


# ---------------------------------------------------------------- scenario 2: 1000 never read

async def open_stalled(server, request):
    """A connection that sent `request` and will never read, or None."""
    sock = None
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            sock = await connect(server.port, RCVBUF)
            await asyncio.get_running_loop().sock_sendall(sock, request)
            return sock
    except (OSError, TimeoutError):
        if sock is not None:
            sock.close()
        return None


def peek_status(sock):
    """What a never-read connection has received: "200", "503", ..., "closed" or "nothing"."""
    try:
        head = sock.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return "nothing"
    except OSError:
        return "reset"
    if not head:
        return "closed"
    parts = head.split(b" ", 2)
    return parts[1].decode("latin-1") if len(parts) > 1 and head.startswith(b"HTTP/") else "other"


def tally(labels):
    counts = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


async def scenario_many_stalled(server, files):
    path = files[0][0]
    request = http_request("GET", server.download_target(path), server.token, close=False)

    async def work():
        socks = []
        give_up = time.monotonic() + OPEN_WITHIN
        for start in range(0, STALLED_CONNS, 50):
            if time.monotonic() > give_up:
                break
            batch = range(start, min(start + 50, STALLED_CONNS))
            socks += await asyncio.gather(*(open_stalled(server, request) for _ in batch))
        opened = [s for s in socks if s is not None]
        await asyncio.sleep(HOLD)
        states = [peek_status(s) for s in opened]
        for s in opened:
            s.close()
        return len(opened), tally(states)

    (opened, states), probed = await while_probing(
        server, [health_probe()], work, OPEN_WITHIN + CONNECT_TIMEOUT + HOLD + 30)
    return {"opened": opened, "states": states, **probed}


# ---------------------------------------------------------------- scenario 3: withheld bodies

async def scenario_withheld(server, six_path):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"

    async def work():
        socks = await asyncio.gather(*(open_stalled(server, request) for _ in range(WITHHOLDERS)))
        opened = [s for s in socks if s is not None]
        await asyncio.sleep(HOLD)
        states = [peek_status(s) for s in opened]
        for s in opened:
            s.close()
        return tally(states)

    states, probed = await while_probing(
        server, [health_probe(), six_probe(server, six_path)], work, CONNECT_TIMEOUT + HOLD + 30)
    return {"states": states, **probed}


async def unauthenticated_post(server):
    """(status, seconds to the status line) of a POST that announces 1 MB, sends no body and
    has no token; status None if nothing came within UNAUTH_TIMEOUT."""
    start = time.perf_counter()
    sock = None
    try:
        async with asyncio.timeout(UNAUTH_TIMEOUT):
            sock = await connect(server.port)
            await asyncio.get_running_loop().sock_sendall(sock, server.unauthenticated_post())
            status, _, _ = await read_head(sock)
        return status, time.perf_counter() - start
    except (OSError, TimeoutError, ValueError, IndexError):
        return None, math.inf
    finally:
        if sock is not None:
            sock.close()


async def scenario_unauthenticated(server):
    answers = await asyncio.gather(*(unauthenticated_post(server) for _ in range(WITHHOLDERS)))
    return {"got_401": sum(status == 401 for status, _ in answers),
            "slowest": max(seconds for _, seconds in answers),
            "states": tally(str(status) for status, _ in answers)}


# ---------------------------------------------------------------- between scenarios

async def settle(server):
    """Waits until GET /health answers within a second again; returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < SETTLE_TIMEOUT:
        if await probe_once(server.port, http_request("GET", "/health"), 204, None) is not None:
            return time.monotonic() - start
        await asyncio.sleep(0.2)
    return math.inf


# ---------------------------------------------------------------- the report

class Report:
    """Rows of (metric, {server: figure}, target), printed as one table and sent to
    $BENCH_RESULTS."""

    def __init__(self, servers):
        self.servers = servers
        self.rows = []
        self.notes = []

    def add(self, metric, figures, target="-"):
        self.rows.append((metric, figures, target))

    def note(self, text):
        self.notes.append(text)

    def print(self):
        width = max(len(m) for m, _, _ in self.rows) + 2
        names = [s.name + (" (1 worker)" if s.name == "nginx" else "") for s in self.servers]
        print(f"\n{'metric':<{width}}" + "".join(f"{n:>20}" for n in names) + f"{'target':>12}")
        for metric, figures, target in self.rows:
            print(f"{metric:<{width}}" + "".join(f"{figures.get(s.name, '-'):>20}"
                                                 for s in self.servers) + f"{target:>12}")
        if self.notes:
            print()
            for text in self.notes:
                print(f"note: {text}")

    def bench_rows(self):
        for metric, figures, target in self.rows:
            if "sandboxd" not in figures:
                continue
            if "nginx" in figures:
                bench_row(metric, figures["sandboxd"], "nginx 1 worker", figures["nginx"], "-",
                          target)
            else:
                bench_row(metric, figures["sandboxd"], "-", "-", "-", target)


def main_figure(server, peaks):
    """(peak RSS KiB, peak threads) of the process reported for `server`."""
    role = "sandboxd" if server.name == "sandboxd" else "worker"
    return peaks.get(role, [0, 0])


def scenario_names():
    return (f"stalled {DOWNLOADS}+{UPLOADS}", f"stalled {STALLED_CONNS}",
            f"withheld body x{WITHHOLDERS}")


async def run_scenarios(servers, report, files, six_path, data):
    """{(scenario, server name): results}, each scenario on each server in turn."""
    s1, s2, s3 = scenario_names()
    results = {}
    for scenario, run in ((s1, lambda s: scenario_transfers(s, files, six_path, data)),
                          (s2, lambda s: scenario_many_stalled(s, files)),
                          (s3, lambda s: scenario_withheld(s, six_path)),
                          (s3 + " POST", scenario_unauthenticated)):
        for server in servers:
            waited = await settle(server)
            if math.isinf(waited):
                report.note(f"{server.name} did not answer /health within {SETTLE_TIMEOUT:g} s "
                            f"before '{scenario}'")
            elif waited > 1:
                report.note(f"{server.name} took {waited:.1f} s to answer /health again before "
                            f"'{scenario}'")
            note(f"{scenario}: {server.name} ...")
            started = time.monotonic()
            results[scenario, server.name] = await run(server)
            note(f"{scenario}: {server.name} done in {time.monotonic() - started:.1f} s")
    return results


def add_rows(report, servers, results, workers):
    """The table: one row per figure, one column per server."""
    s1, s2, s3 = scenario_names()

    def row(scenario, metric, target, figure):
        report.add(f"{scenario}: {metric}",
                   {s.name: figure(results[scenario, s.name], s) for s in servers}, target)

    def p99_of(name):
        return lambda r, s: fmt_ms(p99(r["latencies"][name]))

    def answered_of(name):
        return lambda r, s: answered(r["latencies"][name])

    def rss(r, s):
        return fmt_mib(main_figure(s, r["peaks"])[0])

    def threads(r, s):
        return str(main_figure(s, r["peaks"])[1])

    def post(key, show):
        return lambda r, s: show(results[s3 + " POST", s.name][key])

    row(s1, "/health answered", "all", answered_of("health"))
    row(s1, "/health p99 ms", "<=20", p99_of("health"))
    row(s1, "6-byte download answered", "all", answered_of("six"))
    row(s1, "6-byte download p99 ms", "<=50", p99_of("six"))
    row(s1, "downloads intact", f"{DOWNLOADS}/{DOWNLOADS}",
        lambda r, s: fmt_count(r["downloads"], DOWNLOADS))
    row(s1, "uploads intact", f"{UPLOADS}/{UPLOADS}", lambda r, s: fmt_count(r["uploads"], UPLOADS))
    row(s1, "peak RSS MiB", "<=8", rss)
    row(s1, "peak threads", f"{workers}+few", threads)
    row(s2, "/health answered", "all", answered_of("health"))
    row(s2, "/health p99 ms", "<=20", p99_of("health"))
    row(s2, "connections opened", f"{STALLED_CONNS}", lambda r, s: str(r["opened"]))
    row(s2, "peak RSS MiB", "<=16", rss)
    row(s2, "peak threads", f"{workers}+few", threads)
    row(s3, "/health answered", "all", answered_of("health"))
    row(s3, "/health p99 ms", "<=20", p99_of("health"))
    row(s3, "6-byte download answered", "all", answered_of("six"))
    row(s3, "6-byte download p99 ms", "<=20", p99_of("six"))
    row(s3, "POST no token: 401s", f"{WITHHOLDERS}/{WITHHOLDERS}",
        post("got_401", lambda n: fmt_count(n, WITHHOLDERS)))
    row(s3, "POST no token: slowest 401 ms", "<=50",
        post("slowest", lambda t: fmt_ms(t, UNAUTH_TIMEOUT)))


def add_notes(report, servers, results):
    """What the table leaves out: nginx's master, what the held connections had received."""
    s1, s2, s3 = scenario_names()
    if any(s.name == "nginx" for s in servers):
        masters = ", ".join(f"{fmt_mib(results[sc, 'nginx']['peaks']['master'][0])} MiB ({sc})"
                            for sc in (s1, s2))
        report.note(f"nginx master peak VmRSS (not in the table): {masters}")
    for scenario, what in ((s2, "never-read connections had received"),
                           (s3, "withholding connections had received"),
                           (s3 + " POST", "answers")):
        for server in servers:
            report.note(f"{scenario}: {server.name}'s {what}: "
                        f"{results[scenario, server.name]['states']}")
    for server in servers:
        if server.name == "sandboxd":
            report.note(f"sandboxd VmHWM (peak RSS over the whole run): "
                        f"{fmt_mib(read_hwm(server.pid))} MiB")


def read_hwm(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def servers_from_env():
    tmp = os.environ["BENCH_TMP"]
    wanted = os.environ.get("SERVERS", "sandboxd nginx").split()
    servers = []
    if "sandboxd" in wanted:
        servers.append(Sandboxd(int(os.environ["SANDBOXD_PORT"]), int(os.environ["SANDBOXD_PID"]),
                                os.environ["SANDBOXD_TOKEN"], os.path.join(tmp, "sandboxd-up")))
    if "nginx" in wanted:
        servers.append(Nginx(int(os.environ["NGINX_PORT"]), int(os.environ["NGINX_PID"]),
                             os.environ["SANDBOXD_TOKEN"], os.path.join(tmp, "www")))
    return servers


def raise_nofile():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < STALLED_CONNS + 200:
        note(f"open-file limit {hard} is low for {STALLED_CONNS} connections")


def print_header():
    size = FILE_MIB * MIB
    print(f"stalled: {DOWNLOADS} downloads of {FILE_MIB} MiB (client SO_RCVBUF {RCVBUF // 1024} "
          f"KiB) + {UPLOADS} uploads of {UPLOAD_MIB} MiB, each paused {STALL:g} s mid-transfer "
          f"(deadline {TRANSFER_TIMEOUT:g} s); {STALLED_CONNS} never-read downloads held "
          f"{HOLD:g} s; {WITHHOLDERS} withheld bodies held {HOLD:g} s")
    print(f"a download pauses after {stall_point(size) / MIB:.2f} MiB, with "
          f"{(size - stall_point(size)) / MIB:.2f} MiB unsent (the largest TCP send buffer here: "
          f"{max_send_buffer() / MIB:.2f} MiB); an upload after half its body")
    if size - stall_point(size) <= max_send_buffer() + 2 * RCVBUF:
        note(f"FILE_MIB={FILE_MIB} is too small: a blocking server may finish into its socket "
             "buffers and never wait on a stalled client")
    print(f"probes: GET /health every {HEALTH_EVERY * 1000:.0f} ms, 6-byte download every "
          f"{SIX_EVERY * 1000:.0f} ms, fresh connection each, {PROBE_TIMEOUT * 1000:.0f} ms "
          "timeout; p99 counts unanswered probes as over the timeout", flush=True)


def main():
    raise_nofile()
    servers = servers_from_env()
    root = os.path.join(os.environ["BENCH_TMP"], "www")
    files = make_download_files(root)
    six_path = os.path.join(root, "six.txt")
    data = UploadData()
    print_header()
    report = Report(servers)
    results = asyncio.run(run_scenarios(servers, report, files, six_path, data))
    add_rows(report, servers, results, os.environ.get("SANDBOXD_WORKERS_SEEN", "?"))
    add_notes(report, servers, results)
    report.print()
    report.bench_rows()


if __name__ == "__main__":
    main()
