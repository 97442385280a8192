"""The port forwarder's figures (scripts/bench/forward runs this; see there). Loopback only.

Arguments: PORT TOKEN PID OFF_PID FORWARD_IP SOCAT_IP OFF_PORT LOG (the forwarding daemon's
stderr, where its forwards' changes are counted during the idle window). A sandboxd on 127.0.0.1:PORT with token
TOKEN and pid PID forwards localhost ports to FORWARD_IP; OFF_PID is a sandboxd started with
`--forward-address off` on 127.0.0.1:OFF_PORT, the peer for idle cost and `/health`; socat (the peer for bytes) is started here per port on
SOCAT_IP, as envd starts it. The byte sink runs in a process of its own (no shared GIL with the
sender). Every figure is printed and, for `make bench`, given to
bench_row. Stdlib only.
"""
import json, multiprocessing, random, os, resource, socket, statistics, subprocess, sys, threading, time

from benchrow import bench_row
from forwardlib import wait_forwarded
import rxshare

PORT, TOKEN, PID, OFF_PID = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
FWD, SOCAT_IP, OFF_PORT, LOG = sys.argv[5], sys.argv[6], int(sys.argv[7]), sys.argv[8]


# BASE_BIN's daemon (scripts/bench/forward), measured beside this one when set.
BASE = None
if os.environ.get("BASE_PID"):
    BASE = (os.environ["BASE_IP"], int(os.environ["BASE_PID"]), int(os.environ["BASE_PORT"]),
            os.environ["BASE_TOKEN"])
RT_C = os.environ.get("RT_C")
RT_ROUNDS = int(os.environ.get("RT_ROUNDS", "5"))
IDLE_WINDOW = float(os.environ.get("IDLE_WINDOW", "30"))


def forward_changes():
    """Lines of the daemon's log that record a forward opened or closed."""
    with open(LOG, errors="replace") as f:
        return sum(1 for line in f if f"forwarding {FWD}:" in line or f"forward {FWD}:" in line)
GIB = int(os.environ.get("FORWARD_BYTES", str(1 << 30)))
ROUNDS = int(os.environ.get("FORWARD_ROUNDS", "3"))
LATENCY_ROUNDS = int(os.environ.get("LATENCY_ROUNDS", "100"))
IDLE_ROUNDS = int(os.environ.get("IDLE_ROUNDS", "20"))
HELD = int(os.environ.get("HELD", "1000"))
# FORWARD_ONLY=bytes: only the 1 GiB and round-trip figures (to compare builds quickly).
ONLY = os.environ.get("FORWARD_ONLY", "")


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def nudge():
    """A `Start` of /bin/true through the process service: what a client starting a server does.
    The daemon without forwarding gets the same calls, so the idle figures compare daemons that
    both run the process service's thread."""
    start_true(OFF_PORT)
    start_true(PORT)


def start_true(port):
    data = json.dumps({"process": {"cmd": "/bin/true"}}).encode()
    body = bytes([0]) + len(data).to_bytes(4, "big") + data
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall((f"POST /process.Process/Start HTTP/1.1\r\nHost: b\r\nX-Access-Token: {TOKEN}\r\n"
                   f"Content-Type: application/connect+json\r\nConnection: close\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        while s.recv(65536):
            pass


def listen(ip="127.0.0.1", port=0):
    s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(4096)
    return s


def wait_refused(ip, port):
    """Until nothing listens on ip:port (the forward of a closed server is gone)."""
    for _ in range(5000):
        try:
            socket.create_connection((ip, port), timeout=1).close()
        except OSError:
            return
        time.sleep(0.002)


def listen_to_accept(with_nudge):
    """Seconds from listen() on 127.0.0.1 to the server's accept() of a connection made to the
    forward address (the client retries every millisecond until the forward exists)."""
    if with_nudge:
        nudge()
    else:
        # A random phase against the 1 s scan: the last round ended right after a scan (its
        # forward's closing), and a server in the wild starts at any moment.
        time.sleep(random.random())
    server = listen()
    t0 = time.perf_counter()
    port = server.getsockname()[1]
    while True:
        try:
            client = socket.create_connection((FWD, port), timeout=2)
            break
        except OSError:
            time.sleep(0.001)
    server.accept()[0].close()
    took = time.perf_counter() - t0
    client.close()
    server.close()
    wait_refused(FWD, port)
    return took


def socat(port):
    # At envd's priority when the daemons are (PRIORITY, scripts/bench/forward): envd's child.
    prefix = ["nice", "-n", "-20", "ionice", "-c", "1", "-n", "4"] if os.environ.get("PRIORITY") == "envd" else []
    proc = subprocess.Popen(prefix + ["socat", f"TCP4-LISTEN:{port},bind={SOCAT_IP},reuseaddr,fork",
                             f"TCP4:127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    for _ in range(1000):
        try:
            socket.create_connection((SOCAT_IP, port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.005)
    raise RuntimeError("socat did not start")


def forward_of(port):
    wait_forwarded(FWD, port)


def sink_loop(server, results):
    """Accepts connections one at a time; each is read to its end and its byte count queued."""
    buf = bytearray(1 << 20)
    while True:
        conn, _ = server.accept()
        total = 0
        while True:
            n = conn.recv_into(buf)
            if not n:
                break
            total += n
        conn.close()
        results.put(total)


def cpu_seconds(pid):
    """User and system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu():
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def throughput(ip, port, results, sender_cpu=None, congestion=None):
    """GIB bytes sent to ip:port in 1 MiB sends, read by the sink: MB/s. `sender_cpu`, a list,
    gets this thread's CPU seconds for the sends (a lone sender's cost: the copy from user
    space, TCP's send path and loopback's delivery to the sink in its softirq). `congestion`
    names the sending socket's congestion control (else the system's)."""
    chunk = memoryview(bytearray(1 << 20))
    cpu = thread_cpu()
    t = time.perf_counter()
    with socket.create_connection((ip, port)) as s:
        if congestion:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion)
        for _ in range(GIB >> 20):
            s.sendall(chunk)
        s.shutdown(socket.SHUT_WR)
        if sender_cpu is not None:
            sender_cpu.append(thread_cpu() - cpu)
        s.recv(1)
    total = 0
    while total == 0:  # the probes that waited for the forward and socat were empty connections
        total = results.get(timeout=120)
    took = time.perf_counter() - t
    assert total == GIB, total
    return GIB / took / 1e6


def spread(values, form="{:.2f}"):
    """The median of `values` and their range, e.g. "0.81 (0.62-0.90)"."""
    values = sorted(values)
    return (form.format(statistics.median(values)) + " (" + form.format(values[0]) + "-"
            + form.format(values[-1]) + ")")


def count_syscalls(pid):
    """Starts counting the system calls of every thread of `pid` (perf); None without perf."""
    out = os.path.join(os.environ.get("BENCH_TMP", "/tmp"), f"perf-{pid}.csv")
    try:
        proc = subprocess.Popen(["perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p",
                                 str(pid), "-o", out], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return None
    time.sleep(0.3)  # perf attached
    return proc, out


def counted(counting):
    """The count a `count_syscalls` made (NaN without perf)."""
    if counting is None:
        return float("nan")
    proc, out = counting
    proc.send_signal(2)
    proc.wait()
    for line in open(out):
        if "raw_syscalls:sys_enter" in line:
            return float(line.split(",")[0])
    return float("nan")


def start_process(port, token, argv, what):
    """Starts argv through the process service of the daemon on `port`; its stream, read up to
    the start event."""
    data = json.dumps({"process": {"cmd": argv[0], "args": argv[1:]}}).encode()
    body = bytes([0]) + len(data).to_bytes(4, "big") + data
    stream = socket.create_connection(("127.0.0.1", port))
    stream.sendall((f"POST /process.Process/Start HTTP/1.1\r\nHost: b\r\nX-Access-Token: {token}\r\n"
                    f"Content-Type: application/connect+json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    seen = b""
    while b'"start"' not in seen:
        chunk = stream.recv(65536)
        if not chunk:
            sys.exit(f"{what}'s Start failed: {seen[:300]!r}")
        seen += chunk
    return stream


def hold_servers(port, token, ip, n):
    """Starts n servers (Python, silent) through the process service of the daemon on `port`;
    returns a connection to each through the forward on `ip`, each having echoed 4 bytes (a
    server ends when its connection is closed)."""
    held = []
    for _ in range(n):
        probe = listen()
        server_port = probe.getsockname()[1]
        probe.close()
        code = ("import socket,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
                f"socket.SO_REUSEADDR,1);s.bind(('127.0.0.1',{server_port}));s.listen(8)\n"
                "a,_=s.accept();a.sendall(a.recv(4));a.recv(1)")
        start_process(port, token, [sys.executable, "-c", code], "a held server").close()
        for _ in range(2000):
            try:
                c = socket.create_connection((ip, server_port), timeout=2)
                c.sendall(b"ping")
                if c.recv(4) == b"ping":
                    break
                c.close()
            except OSError:
                pass
            time.sleep(0.005)
        else:
            raise RuntimeError(f"server {server_port} not forwarded on {ip}")
        held.append(c)
    return held


def c_round_trips(ip, port, n=3000):
    """p50 and p99 in µs of 1-byte round trips by the C client (scripts/bench/forward builds it)."""
    out = subprocess.run([RT_C, ip, str(port), str(n), "1"], capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1])


def echo_server(server):
    def serve(conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            data = conn.recv(65536)
            if not data:
                break
            conn.sendall(data)
        conn.close()
    def loop():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()


def round_trips(ip, port, n=3000):
    """p50 and p99 in µs of 1-byte round trips by this (Python) client, the first tenth left out."""
    with socket.create_connection((ip, port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(b"x")
            while not s.recv(1):
                raise RuntimeError("the echo ended")
            times.append(time.perf_counter() - t)
    times = times[n // 10:]
    return p(times, 0.5) * 1e6, p(times, 0.99) * 1e6


def proc_status(field):
    with open(f"/proc/{PID}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])


def health_p99(port, n=300):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
            while s.recv(4096):
                pass
        times.append(time.perf_counter() - t)
        time.sleep(0.005)
    return p(times, 0.99) * 1e3


def wakeups(pids, seconds=20.0):
    """For each pid: context switches of all its threads per second (each wakeup of a sleeping
    thread is one), and its CPU share in %, over one window; and the same per thread name."""
    def threads(pid):
        counts = {}
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as f:
                lines = f.read().splitlines()
            name = lines[0].split(None, 1)[1]
            switches = sum(int(l.split()[1]) for l in lines if "ctxt_switches" in l)
            counts[name] = counts.get(name, 0) + switches
        return counts
    def switches(pid):
        return sum(threads(pid).values())
    def cpu(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    before = [(switches(pid), cpu(pid)) for pid in pids]
    named = [threads(pid) for pid in pids]
    t0 = time.perf_counter()
    time.sleep(seconds)
    took = time.perf_counter() - t0
    for pid, was in zip(pids, named):
        now = threads(pid)
        busy = {n: round((c - was.get(n, 0)) / took, 2) for n, c in now.items() if c != was.get(n, 0)}
        print(f"  pid {pid}: switches per second by thread: {busy}")
    return [((switches(pid) - s) / took, (cpu(pid) - c) / took * 100)
            for pid, (s, c) in zip(pids, before)]


# A process started long before its server (an agent's terminal, a shell running for an hour):
# it waits silently for GO_FILE, then per round listens on 127.0.0.1, prints as a server does,
# writes "port" to PORT_FILE, accepts once and appends the seconds from listen() to accept() to
# RESULT_FILE (its own monotonic clock), then rests a random moment.
LATE_SERVER = r"""
import os, random, socket, sys, time
go, port_file, result_file, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
while not os.path.exists(go):
    time.sleep(0.05)
for _ in range(rounds):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    t0 = time.monotonic()
    print(f"serving on port {s.getsockname()[1]}", flush=True)
    with open(port_file + ".new", "w") as f:
        f.write(str(s.getsockname()[1]))
    os.rename(port_file + ".new", port_file)
    conn, _ = s.accept()
    took = time.monotonic() - t0
    conn.close()
    s.close()
    with open(result_file, "a") as f:
        f.write(f"{took}\n")
    time.sleep(random.random())
"""


def start_late_server(workdir, rounds):
    """Starts LATE_SERVER through the process service; its files (go, port, results)."""
    script = os.path.join(workdir, "late_server.py")
    with open(script, "w") as f:
        f.write(LATE_SERVER)
    files = [os.path.join(workdir, n) for n in ("go", "port", "results")]
    # Its start event, then the stream is left: the process runs on with no subscriber (so no
    # keep-alive ticks wake the daemon during the idle window), its output read and dropped.
    start_process(PORT, TOKEN, [sys.executable, script, *files, str(rounds)],
                  "the late server").close()
    return files


def late_server_rounds(files, rounds):
    """Lets the late server go; connects to each of its forwards as soon as it exists."""
    go, port_file, result_file = files
    open(go, "w").close()
    seen = None
    for _ in range(rounds):
        while True:
            try:
                port = int(open(port_file).read())
            except (OSError, ValueError):
                port = None
            if port is not None and port != seen:
                break
            time.sleep(0.001)
        seen = port
        while True:
            try:
                socket.create_connection((FWD, port), timeout=2).close()
                break
            except OSError:
                time.sleep(0.001)
    deadline = time.time() + 10
    while time.time() < deadline:
        lines = open(result_file).read().split() if os.path.exists(result_file) else []
        if len(lines) >= rounds:
            return [float(x) for x in lines]
        time.sleep(0.01)
    return [float(x) for x in lines]


def main():
    started = time.perf_counter()
    # 7's server process, started now so that its Start's fast minute is long over by then.
    late_dir = os.environ.get("BENCH_TMP", "/tmp")
    late_files = start_late_server(late_dir, IDLE_ROUNDS)
    # 1. listen() to the first forwarded accept, after a process start (fast scans).
    fast = [listen_to_accept(True) for _ in range(LATENCY_ROUNDS if ONLY != "bytes" else 1)]
    fast_p50, fast_p99 = p(fast, 0.5) * 1e3, p(fast, 0.99) * 1e3
    print(f"listen() to first forwarded accept, after a Start, {LATENCY_ROUNDS} rounds: "
          f"p50 {fast_p50:.1f} ms, p99 {fast_p99:.1f} ms (envd: up to 1,000 ms plus socat's start)")
    bench_row("forward: listen() to first forwarded accept after a Start, p99 (ms)",
              f"{fast_p99:.1f}", "-", "-", "-", "<=200")

    # 2. 1 GiB one way: direct, through the forward (and the base build's), through socat.
    results = multiprocessing.Queue()
    server = listen()
    port = server.getsockname()[1]
    sink = multiprocessing.Process(target=sink_loop, args=(server, results), daemon=True)
    sink.start()
    forward_of(port)
    daemons = [("forward", FWD, PID)] + ([("base", BASE[0], BASE[1])] if BASE else [])
    for _, ip, _ in daemons[1:]:
        wait_forwarded(ip, port)
    peer = socat(port)
    ratios = {name: [] for name, _, _ in daemons + [("socat", None, None)]}
    cpu = {name: [] for name, _, _ in daemons}
    calls = {name: [] for name, _, _ in daemons}
    sender, reno_sender, to_reno = [], [], []
    for _ in range(ROUNDS):
        direct = throughput("127.0.0.1", port, results, sender)
        # The same with the sender on Reno, as the daemon's connection to the server is: the
        # forward's own cost, apart from the system's congestion control (BBR paces).
        direct_reno = throughput("127.0.0.1", port, results, reno_sender, b"reno")
        for name, ip, pid in daemons:
            before, counting = cpu_seconds(pid), count_syscalls(pid)
            mbps = throughput(ip, port, results)
            if name == "forward":
                to_reno.append(mbps / direct_reno)
            ratios[name].append(mbps / direct)
            cpu[name].append((cpu_seconds(pid) - before) / (GIB / (1 << 30)))
            calls[name].append(counted(counting) / (GIB / (1 << 30)))
        ratios["socat"].append(throughput(SOCAT_IP, port, results) / direct)
    # One more transfer per daemon, traced: the share of its CPU that is loopback's delivery
    # of segments to a socket in its own softirq (rxshare.py), applied to the rounds' CPU.
    rx = {}
    for name, ip, pid in daemons:
        tracing = rxshare.start([pid])
        throughput(ip, port, results)
        rx[name] = rxshare.stop(tracing)
    peer.terminate()
    peer.wait()
    sink.terminate()
    server.close()
    for name, _, _ in daemons:
        r, c, n = spread(ratios[name]), spread(cpu[name]), spread(calls[name], "{:.0f}")
        share = rx[name]
        excl = ("-" if share is None else
                f"{share[0]:.0%} of it delivering data segments in its own softirq, "
                f"{share[1]:.0%} ACKs, so {statistics.median(cpu[name]) * (1 - share[0]):.2f} s "
                f"without the data's delivery ({share[2] / (2 * GIB):.2f} of the two hops' bytes "
                "delivered there)")
        print(f"{GIB >> 20} MiB one way, {ROUNDS} interleaved rounds, {name}: {r} × direct "
              f"(socat {spread(ratios['socat'])} ×); the daemon's CPU {c} s per GiB ({excl}), "
              f"system calls {n} per GiB")
    # The floor of a hop's CPU: what the sender of the direct transfer paid for its one hop.
    lone = statistics.median(sender) / (GIB / (1 << 30))
    forwarded = statistics.median(cpu["forward"])
    print(f"a lone sender's own CPU per GiB (the direct transfer's client, 1 MiB sends, its copy "
          f"from user space included): {spread([c / (GIB / (1 << 30)) for c in sender])} s; the "
          f"forwarder's {forwarded:.2f} s is {forwarded / lone:.2f} × it")
    bench_row("forward: 1 GiB, the daemon's CPU per GiB forwarded, vs a lone sender's (s)",
              f"{forwarded:.2f}", "a lone sender's CPU (direct)", f"{lone:.2f}", f"{forwarded / lone:.2f}", "-")
    lone_reno = statistics.median(reno_sender) / (GIB / (1 << 30))
    print(f"with the sender on Reno (the congestion control of the forward's connection to the "
          f"server; the system's is {open('/proc/sys/net/ipv4/tcp_congestion_control').read().strip()}): "
          f"forward {spread(to_reno)} × direct; a lone sender's CPU per GiB "
          f"{spread([c / (GIB / (1 << 30)) for c in reno_sender])} s, the forwarder's "
          f"{forwarded / lone_reno:.2f} × it")
    bench_row("forward: 1 GiB through the forward vs direct with the sender on Reno (ratio, "
              "median of rounds)", f"{statistics.median(to_reno):.2f}", "direct, Reno", "1",
              f"{statistics.median(to_reno):.2f}", "")
    bench_row("forward: 1 GiB, the daemon's CPU per GiB forwarded, vs a lone sender's on Reno (s)",
              f"{forwarded:.2f}", "a lone sender's CPU (direct, Reno)", f"{lone_reno:.2f}",
              f"{forwarded / lone_reno:.2f}", "-")
    o = statistics.median(ratios["forward"])
    bench_row("forward: 1 GiB through the forward vs direct (ratio, median of rounds)",
              f"{o:.2f}", "direct", "1", f"{o:.2f}", ">=0.75")
    bench_row("forward: 1 GiB, the daemon's CPU per GiB forwarded (s)",
              f"{statistics.median(cpu['forward']):.2f}", "-", "-", "-", "<=0.3")
    bench_row("forward: 1 GiB, the daemon's system calls per GiB forwarded",
              f"{statistics.median(calls['forward']):.0f}", "-", "-", "-", "-")
    bench_row("forward: 1 GiB through the forward vs socat (ratio, median of rounds)",
              f"{o / statistics.median(ratios['socat']):.2f}", "socat", "-", "-", ">=1.5")
    if BASE:
        b = statistics.median(ratios["base"])
        bench_row("forward: 1 GiB vs direct, this build vs BASE_BIN", f"{o:.2f}", "BASE_BIN",
                  f"{b:.2f}", f"{o / b:.2f}", "-")
        bench_row("forward: CPU per GiB forwarded, this build vs BASE_BIN (s)",
                  f"{statistics.median(cpu['forward']):.2f}", "BASE_BIN",
                  f"{statistics.median(cpu['base']):.2f}", "-", "-")

    # 3. 1-byte round trips on one connection, by a C and a Python client.
    server = listen()
    port = server.getsockname()[1]
    echo_server(server)
    forward_of(port)
    for _, ip, _ in daemons[1:]:
        wait_forwarded(ip, port)
    added = {(name, client): ([], []) for name, _, _ in daemons for client in ("C", "Python")}
    for _ in range(RT_ROUNDS):
        for client, run in (("C", c_round_trips), ("Python", round_trips)):
            d50, d99 = run("127.0.0.1", port)
            for name, ip, _ in daemons:
                f50, f99 = run(ip, port)
                added[(name, client)][0].append(f50 - d50)
                added[(name, client)][1].append(f99 - d99)
    for (name, client), (a50, a99) in added.items():
        print(f"1-byte round trip added to direct, {client} client, {name}, {RT_ROUNDS} rounds: "
              f"p50 +{spread(a50, '{:.1f}')} µs, p99 +{spread(a99, '{:.1f}')} µs")
    for client in ("C", "Python"):
        a50 = statistics.median(added[("forward", client)][0])
        peer = statistics.median(added[("base", client)][0]) if BASE else "-"
        bench_row(f"forward: 1-byte round trip p50 added to direct, {client} client (µs)",
                  f"{a50:.1f}", "BASE_BIN" if BASE else "-",
                  f"{peer:.1f}" if BASE else "-", "-", "<=50")

    if ONLY == "bytes":
        return
    # 4. HELD connections held open through the forward (echo server still up).
    rss0, threads0 = proc_status("VmRSS"), proc_status("Threads")
    held = []
    for _ in range(HELD):
        c = socket.create_connection((FWD, port))
        c.sendall(b"ping")
        held.append(c)
    for c in held:
        assert c.recv(4) == b"ping"
    p99, peer99 = health_p99(PORT), health_p99(OFF_PORT)
    rss, threads = proc_status("VmRSS"), proc_status("Threads")
    print(f"{HELD} forwarded connections held: /health p99 {p99:.1f} ms (the daemon without "
          f"forwarding, same moment: {peer99:.1f} ms), RSS {rss0 / 1024:.1f} -> "
          f"{rss / 1024:.1f} MiB, threads {threads0} -> {threads}")
    bench_row(f"forward: /health p99 with {HELD} forwarded connections held (ms)", f"{p99:.1f}",
              "forwarding off, none held", f"{peer99:.1f}", f"{p99 / peer99:.2f}", "-")
    bench_row(f"forward: RSS with {HELD} forwarded connections held (MiB)", f"{rss / 1024:.1f}",
              "-", "-", "-", "<=16")
    for c in held:
        c.close()
    server.close()
    wait_refused(FWD, port)

    # 5. Idle with 4 forwards held open through each forwarding daemon: servers started through
    # its process service, a connection through each; measured from then (the minute after a
    # Start) and again once that minute is over.
    held = []
    for name, ip, pid in daemons:
        port_, token = (PORT, TOKEN) if name == "forward" else (BASE[2], BASE[3])
        held += hold_servers(port_, token, ip, 4)
    watched = [pid for _, _, pid in daemons] + [OFF_PID]
    changes = forward_changes()
    first = wakeups(watched, IDLE_WINDOW)
    time.sleep(max(0.0, 65 - IDLE_WINDOW))
    later = wakeups(watched, IDLE_WINDOW)
    changes = forward_changes() - changes
    print(f"  forwards opened or closed during the windows (other servers on this machine's "
          f"loopback come and go): {changes}")
    for (name, _, _), (rate, share), (rate2, share2) in zip(daemons, first, later):
        print(f"idle, 4 forwards held, {name}: {rate:.2f} context switches/s, {share:.3f} % CPU "
              f"in the {IDLE_WINDOW:.0f} s after the Starts; {rate2:.2f}/s, {share2:.3f} % a "
              f"minute on; --forward-address off {first[-1][0]:.2f}/s, {later[-1][0]:.2f}/s")
    bench_row("forward: idle wakeups per second, 4 forwards held, the 30 s after their Starts",
              f"{first[0][0]:.2f}", "BASE_BIN" if BASE else "forwarding off",
              f"{first[1][0]:.2f}" if BASE else f"{first[-1][0]:.2f}", "-", "<=1.0")
    bench_row("forward: idle CPU %, 4 forwards held, the 30 s after their Starts",
              f"{first[0][1]:.3f}", "BASE_BIN" if BASE else "forwarding off",
              f"{first[1][1]:.3f}" if BASE else f"{first[-1][1]:.3f}", "-", "<=0.1")
    bench_row("forward: idle wakeups per second, 4 forwards held, a minute after their Starts",
              f"{later[0][0]:.2f}", "forwarding off", f"{later[-1][0]:.2f}", "-", "<=1.0")
    for c in held:
        c.close()

    # 6. listen() to accept when nothing nudged the scanner: the 1 s idle scan.
    idle = [listen_to_accept(False) for _ in range(IDLE_ROUNDS)]
    print(f"listen() to first forwarded accept, idle (no Start), {IDLE_ROUNDS} rounds: "
          f"p50 {p(idle, 0.5) * 1e3:.0f} ms, p99 {p(idle, 0.99) * 1e3:.0f} ms")
    # 7. listen() to accept for a server in a process started long before (its Start's fast
    # minute over), which prints as it listens: the output opens a short fast window.
    late = late_server_rounds(late_files, IDLE_ROUNDS)
    if late:
        print(f"listen() to first forwarded accept, a process started long before prints as it "
              f"listens, {len(late)} rounds: p50 {p(late, 0.5) * 1e3:.0f} ms, "
              f"p99 {p(late, 0.99) * 1e3:.0f} ms")
        bench_row("forward: listen() to accept, a long-running process printing as it listens, p99 (ms)",
                  f"{p(late, 0.99) * 1e3:.0f}", "-", "-", "-", "<=200")
    print(f"(run took {time.perf_counter() - started:.0f} s)")


main()
