"""The share of a server's CPU that is loopback's receive path run for its peer (download,
forward; docs/performance.md, "Downloads").

On loopback a sent segment is queued on the sending CPU's backlog and delivered to the receiving
socket by the NET_RX softirq that runs when the sender re-enables bottom halves: in the sender's
context, charged to the sender (utime + stime, task-clock). In production the client is outside
the VM and that delivery runs on its machine, so a loopback benchmark charges a sender with work
it would not do there, and more of it the less it blocks.

`peer_rx_share` measures it exactly rather than by sampling (a cpu-clock profile in this guest
has no PMU and books the softirq's time to wherever interrupts come back on, often
`handle_softirqs` itself): it records the `irq:softirq_entry`/`softirq_exit` and
`net:netif_receive_skb` tracepoints of the server's threads (events of a task fire only while it
is current, so a softirq run by ksoftirqd or by the client is not counted) and, around that,
`perf stat`'s task-clock of the same threads. Each NET_RX softirq's time is split between the
data segments it delivered (longer than DATA_MIN bytes: the server's bytes reaching the peer's
socket, or, in a forwarder, either hop's) and the bare ACKs (the peer's acknowledgements reaching
the server's own socket, which production does run on the server's CPUs), in proportion to their
counts. That undercounts the data part (a data segment costs more to deliver than an ACK), so
the share is a floor. The tracepoints cost something per event (about three per segment) on
both sides of the ratio, which is why the share is applied to the CPU of untraced runs rather
than the traced time itself used.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

# A bare ACK on loopback is 52 bytes of IP and TCP header (with timestamps), a little more
# with SACK blocks; a bulk transfer's data segments carry tens of KiB. A data segment of under
# 150 bytes (an HTTP head, a stream's tail) counts as an ACK here: a few per transfer.
DATA_MIN = 200


def peer_rx_share(pids, command):
    """Runs `command` while tracing the server threads `pids` (`start`, `stop`)."""
    tracing = start(pids)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return stop(tracing)


def start(pids):
    """Starts tracing the threads of `pids` (every thread, as `perf -p` does); None without
    perf."""
    if not shutil.which("perf"):
        return None
    tmp = tempfile.mkdtemp(prefix="sandboxd-rxshare.")
    target = ",".join(map(str, pids))
    procs = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for args in (
        ["perf", "stat", "-x,", "-e", "task-clock", "-p", target, "-o", os.path.join(tmp, "stat")],
        ["perf", "record", "-q", "-e", "irq:softirq_entry", "-e", "irq:softirq_exit",
         "-e", "net:netif_receive_skb", "-p", target, "-o", os.path.join(tmp, "perf.data")])]
    time.sleep(0.3)  # attached
    return tmp, procs


def stop(tracing):
    """(share of the threads' task-clock spent delivering data segments in NET_RX softirqs,
    the same for ACKs, the data bytes delivered in their context) since `start`; None without
    perf."""
    if tracing is None:
        return None
    tmp, procs = tracing
    try:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
            proc.wait()
        task_ms = None
        with open(os.path.join(tmp, "stat")) as f:
            for line in f:
                fields = line.split(",")
                if len(fields) > 2 and fields[2].startswith("task-clock"):
                    task_ms = float(fields[0])
        script = subprocess.run(
            ["perf", "script", "-i", os.path.join(tmp, "perf.data"), "-F", "cpu,time,event,trace"],
            check=True, capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not task_ms:
        return None
    data_s, ack_s, data_bytes = split_net_rx(script.splitlines())
    return data_s * 1e3 / task_ms, ack_s * 1e3 / task_ms, data_bytes


def split_net_rx(lines):
    """From `perf script -F cpu,time,event,trace` lines: (seconds of NET_RX softirq delivering
    data segments, the same for ACKs, data bytes delivered in these softirqs)."""
    open_at, counts = {}, {}
    data_s = ack_s = 0.0
    data_bytes = 0
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        cpu, event = fields[0], fields[2]
        if event == "irq:softirq_entry:":
            if "[action=NET_RX]" in line:
                open_at[cpu] = float(fields[1].rstrip(":"))
                counts[cpu] = [0, 0]
        elif event == "net:netif_receive_skb:" and cpu in counts:
            length = int(fields[-1].split("=")[1])
            counts[cpu][0 if length > DATA_MIN else 1] += 1
            if length > DATA_MIN:
                data_bytes += length
        elif event == "irq:softirq_exit:" and cpu in open_at:
            took = float(fields[1].rstrip(":")) - open_at.pop(cpu)
            segs, acks = counts.pop(cpu)
            if segs + acks:
                data_s += took * segs / (segs + acks)
                ack_s += took * acks / (segs + acks)
    return data_s, ack_s, data_bytes
