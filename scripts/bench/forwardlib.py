"""Helpers shared by the forwarding benchmarks (forward.py, forward-exhaust.py). Stdlib only."""
import socket, time


def wait_forwarded(ip, port):
    """Returns once a connection to IP:PORT is accepted (the forward is in place; that
    connection is closed at once), retried every 5 ms for 10 s."""
    for _ in range(2000):
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.005)
    raise RuntimeError(f"port {port} not forwarded")
