"""The open-file budget under a local user's exhaustion (scripts/bench/forward-exhaust runs
this; see there). Loopback only. Stdlib only.

Arguments: NOFILE PORT TOKEN FORWARD_IP LOG PEER_PORT PEER_TOKEN. A sandboxd under `ulimit -n
NOFILE` on 127.0.0.1:PORT forwards localhost ports to FORWARD_IP and logs to LOG; another, idle,
with forwarding off, is on 127.0.0.1:PEER_PORT.

1. A server on 127.0.0.1 holds every connection it accepts.
2. Connections to FORWARD_IP at its port, 32 at a time, until the daemon logs a refusal for the
   port or the server stops seeing new ones: "forwarded" is what the server holds then.
3. Three connections to the daemon send the start of a head and stop.
4. HEALTH_ROUNDS `GET /health`, each on a fresh connection (timed from connect to the end of the
   answer, 5 s timeout: a timeout counts as 5 s), then one `GET /envs` with the token; then the
   same rounds on the idle peer. p50 and p99 of each.
"""
import os, socket, sys, threading, time

from benchrow import bench_row
from forwardlib import wait_forwarded

NOFILE, PORT, TOKEN, FWD, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
PEER_PORT, PEER_TOKEN = int(sys.argv[6]), sys.argv[7]
ROUNDS = int(os.environ.get("HEALTH_ROUNDS", "500"))
TIMEOUT = 5.0


def p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def log_has(text):
    with open(LOG, errors="replace") as f:
        return any(text in line for line in f)


def hold_all(server, held):
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        held.append(conn)


def fill(port, inside):
    """Connections through the forward until it takes no more; the clients."""
    clients = []
    refused = f"forward :{port}: refused"
    while len(clients) < 4 * NOFILE:
        for _ in range(32):
            clients.append(socket.create_connection((FWD, port), timeout=TIMEOUT))
        deadline = time.monotonic() + 3
        while len(inside) < len(clients) + 1 and time.monotonic() < deadline:
            if log_has(refused):
                time.sleep(0.2)
                return clients
            time.sleep(0.002)
        if len(inside) < len(clients) + 1:
            return clients
    raise RuntimeError(f"the forwarder took {len(clients)} connections under ulimit -n {NOFILE}")


def request(port, target, token=None):
    """Seconds from connect to the end of the answer, and its status (None: no answer)."""
    t = time.perf_counter()
    status = None
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
            auth = f"X-Access-Token: {token}\r\n" if token else ""
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: b\r\n{auth}Connection: close\r\n\r\n".encode())
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
            status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    except OSError:
        return TIMEOUT, None
    return time.perf_counter() - t, status


def health_rounds(port):
    times, failed = [], 0
    for _ in range(ROUNDS):
        took, status = request(port, "/health")
        times.append(took)
        failed += status != 204
        time.sleep(0.002)
    return p(times, 0.5) * 1e3, p(times, 0.99) * 1e3, failed


def main():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    port = server.getsockname()[1]
    inside = []
    threading.Thread(target=hold_all, args=(server, inside), daemon=True).start()
    wait_forwarded(FWD, port)   # one connection, closed: the server holds it (counted below, + 1)
    clients = fill(port, inside)
    forwarded = len(inside) - 1
    heads = []
    for _ in range(3):
        h = socket.create_connection(("127.0.0.1", PORT), timeout=TIMEOUT)
        h.sendall(b"GET /health HTTP/1.1\r\nHo")
        heads.append(h)
    time.sleep(0.1)
    p50, p99, failed = health_rounds(PORT)
    _, envs = request(PORT, "/envs", TOKEN)
    peer50, peer99, peer_failed = health_rounds(PEER_PORT)
    why = "refused (log)" if log_has(f"forward :{port}: refused") else "no refusal logged"
    print(f"ulimit -n {NOFILE}: {forwarded} forwarded connections ({len(clients)} made, {why}), "
          f"3 unfinished heads: /health p50 {p50:.2f} ms, p99 {p99:.2f} ms, {failed} of {ROUNDS} "
          f"failed; GET /envs {envs}; idle daemon: p50 {peer50:.2f} ms, p99 {peer99:.2f} ms, "
          f"{peer_failed} failed")
    bench_row(f"forward-exhaust: /health p99, every forward taken + 3 unfinished heads, ulimit -n {NOFILE} (ms)",
              f"{p99:.1f}", "idle daemon", f"{peer99:.1f}", "-", "<=20")
    bench_row(f"forward-exhaust: /health answered, every forward taken + 3 unfinished heads, ulimit -n {NOFILE}",
              f"{ROUNDS - failed}/{ROUNDS}", "idle daemon", f"{ROUNDS - peer_failed}/{ROUNDS}", "-", "all")
    bench_row(f"forward-exhaust: forwarded connections taken under ulimit -n {NOFILE}", str(forwarded),
              "-", "-", "-", "-")
    for s in clients + heads:
        s.close()


if __name__ == "__main__":
    main()
