"""A health checker's view of a server: `GET /health` on one kept-alive connection, one request
every INTERVAL_MS, for SECONDS; prints "count p50 p99 max" in ms (and "failed N" when any
request failed). Helper of scripts/bench/busy (not a benchmark of its own).

Why not `wrk -t1 -c1 --latency`: wrk corrects its histogram for coordinated omission, adding a
synthetic sample for every expected request a slow one held back, so a closed loop's p99 there
is the share of the run spent in stalls (a 20 ms stall of a 50 µs loop weighs 400 samples), not
what a probe sent at its own pace sees. Here each request is sent on schedule whatever the last
one took (a late one is not made up for), and its own time is what is recorded.

Usage: probe.py PORT INTERVAL_MS SECONDS
"""

import socket
import sys
import time

REQUEST = b"GET /health HTTP/1.1\r\nHost: probe\r\n\r\n"
TIMEOUT = 2.0


def connect(port):
    conn = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def one(conn):
    """One request; True when the answer is a whole 204 head (no body follows a 204)."""
    conn.sendall(REQUEST)
    answer = b""
    while b"\r\n\r\n" not in answer:
        piece = conn.recv(4096)
        if not piece:
            return False
        answer += piece
    return answer.startswith(b"HTTP/1.1 204")


def main():
    port, interval, seconds = int(sys.argv[1]), float(sys.argv[2]) / 1000, float(sys.argv[3])
    conn = connect(port)
    times, failed = [], 0
    start = time.perf_counter()
    due = start
    while due - start < seconds:
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        t = time.perf_counter()
        try:
            ok = one(conn)
        except OSError:
            ok = False
        took = (time.perf_counter() - t) * 1000
        if ok:
            times.append(took)
        else:
            failed += 1
            times.append(TIMEOUT * 1000)
            conn.close()
            conn = connect(port)
        due += interval
        while due < time.perf_counter():  # a late probe is not made up for
            due += interval
    times.sort()
    p = lambda q: times[min(len(times) - 1, int(len(times) * q))]  # noqa: E731
    print(f"{len(times)} {p(0.5):.3f} {p(0.99):.3f} {times[-1]:.3f}" + (f" failed {failed}" if failed else ""))


if __name__ == "__main__":
    main()
