#!/usr/bin/env python3
"""The scanner's two candidates, timed in one run: a sock_diag netlink dump of the TCP sockets
in LISTEN (the kernel filters by state) against reading /proc/net/tcp and tcp6 (every socket,
as text) and picking the LISTEN lines. Both from Python, so the interpreter's share is alike;
what differs is the kernel's work. Run with N established loopback connections held open
(argument; default 0 and 2000). Loopback only."""
import socket, struct, sys, time, statistics

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20

def diag(sock, family, seq):
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << 10) + bytes(48)
    msg = struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, 0x301, seq, 0) + body
    sock.send(msg)
    found = []
    while True:
        data = sock.recv(32768)
        off = 0
        while off + 16 <= len(data):
            ln, kind = struct.unpack_from("=IH", data, off)
            if kind == 3:
                return found
            if kind == 2:
                raise OSError("netlink error")
            found.append(struct.unpack_from(">H", data, off + 16 + 4)[0])
            off += (ln + 3) & ~3

def netlink_scan(sock):
    return diag(sock, socket.AF_INET, 1) + diag(sock, socket.AF_INET6, 2)

def proc_scan():
    ports = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A":
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports

def timed(fn, rounds=300):
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6

def run(connections):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    held = []
    for _ in range(connections):
        c = socket.create_connection(server.getsockname())
        s, _ = server.accept()
        held += [c, s]
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    nl, proc = timed(lambda: netlink_scan(sock)), timed(proc_scan)
    print(f"| {connections} | {nl:.0f} µs | {proc:.0f} µs | {proc / nl:.1f} × |")
    for s in held:
        s.close()

print("| established connections | sock_diag dump | /proc/net/tcp{,6} | ratio |")
print("|---|---|---|---|")
for n in [int(a) for a in sys.argv[1:]] or [0, 2000]:
    run(n)
