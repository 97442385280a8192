import multiprocessing, os, socket, sys, time, statistics
rounds, gib = int(sys.argv[1]), float(sys.argv[2])
targets = [(a.split("=")[0], int(a.split("=")[1])) for a in sys.argv[3:]]  # ip=pid
N = int(gib * (1 << 30))
def sink(server, q):
    buf = bytearray(1 << 20)
    while True:
        c, _ = server.accept(); total = 0
        while True:
            n = c.recv_into(buf)
            if not n: break
            total += n
        c.close(); q.put(total)
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(16)
port = server.getsockname()[1]
q = multiprocessing.Queue()
p = multiprocessing.Process(target=sink, args=(server, q), daemon=True); p.start()
for ip, _ in targets:
    for _ in range(4000):
        try: socket.create_connection((ip, port), timeout=1).close(); break
        except OSError: time.sleep(0.005)
    q.get()
chunk = memoryview(bytearray(1 << 20))
def one(ip):
    t = time.perf_counter()
    with socket.create_connection((ip, port)) as s:
        for _ in range(N >> 20): s.sendall(chunk)
        s.shutdown(socket.SHUT_WR); s.recv(1)
    assert q.get(timeout=120) == N
    return N / (time.perf_counter() - t) / 1e6
res = {ip: [] for ip, _ in targets}
for r in range(rounds):
    d = one("127.0.0.1")
    for ip, pid in targets:
        c0 = cpu(pid); mb = one(ip); c = (cpu(pid) - c0) / (N / (1 << 30))
        res[ip].append((mb / d, c))
for ip, _ in targets:
    rs = sorted(x for x, _ in res[ip]); cs = sorted(c for _, c in res[ip])
    print(f"{ip}: ratio median {statistics.median(rs):.2f} ({rs[0]:.2f}-{rs[-1]:.2f}) cpu s/GiB median {statistics.median(cs):.3f} ({cs[0]:.3f}-{cs[-1]:.3f})")
