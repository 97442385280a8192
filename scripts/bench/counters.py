"""Counters for the Python benchmarks: a process's CPU time, system calls counted by `perf`, a
peer pipeline's CPU, and the median of per-round ratios with their range (docs/performance.md,
"Method"); and the C peers and clients they compile at run time."""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a running process (all its threads; not its children) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu():
    """utime + stime of this script's waited-for children so far."""
    usage = os.times()
    return usage.children_user + usage.children_system


def timed_pipeline(first, second, cpu_of_second=False):
    """Runs `first | second` (argument lists), second's output to /dev/null: wall seconds, and
    the CPU seconds of `first` alone (or of `second`, with `cpu_of_second`), from its rusage."""
    started = time.perf_counter()
    a = subprocess.Popen(first, stdout=subprocess.PIPE)
    b = subprocess.Popen(second, stdin=a.stdout, stdout=subprocess.DEVNULL)
    a.stdout.close()
    codes, cpu = [], 0.0
    for proc, counted in ((a, not cpu_of_second), (b, cpu_of_second)):
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        codes.append(proc.returncode)
        if counted:
            cpu = usage.ru_utime + usage.ru_stime
    took = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"{first[0]} | {second[0]} failed")
    return took, cpu


def timed_daemon(pid, run):
    """Runs `run()` (a client against the daemon `pid`): wall seconds and the daemon's CPU."""
    cpu = cpu_seconds(pid)
    started = time.perf_counter()
    run()
    return time.perf_counter() - started, cpu_seconds(pid) - cpu


def perf_available():
    return shutil.which("perf") is not None


def syscalls_of_pid(pid, run):
    """System calls the threads of `pid` make while `run()` runs (`perf stat -e
    raw_syscalls:sys_enter`, children not counted), or None without perf."""
    if not perf_available():
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".csv") as out:
        perf = subprocess.Popen(["perf", "stat", "--no-inherit", "-x,", "-o", out.name, "-e",
                                 "raw_syscalls:sys_enter", "-p", str(pid)],
                                stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        run()
        perf.send_signal(2)
        perf.wait()
        return _count(out.read())


def syscalls_of_command(first, second):
    """System calls of `first` (argument list) in `first | second`, or None without perf."""
    if not perf_available():
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".csv") as out:
        timed_pipeline(["perf", "stat", "-x,", "-o", out.name, "-e", "raw_syscalls:sys_enter",
                        "--"] + first, second)
        return _count(out.read())


def _count(text):
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and "raw_syscalls:sys_enter" in fields[2]:
            try:
                return int(fields[0])
            except ValueError:
                return None
    return None


def median_range(values):
    """'median (min-max)' of per-round values, two decimals."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def per(value, units, scale=1.0, digits=2):
    """value / units * scale as text; '-' when unknown."""
    if value is None or not units:
        return "-"
    return f"{value / units * scale:.{digits}f}"


def compile_c(work, name, source, what):
    """Compiles the C `source` with gcc into `work`/`name`: its path. `what` (the peer or client
    it is) names it when gcc is missing."""
    if shutil.which("gcc") is None:
        sys.exit(f"{what} needs gcc (apt-get install gcc)")
    binary = os.path.join(work, name)
    with open(binary + ".c", "w") as f:
        f.write(source)
    subprocess.run(["gcc", "-O2", "-Wall", "-o", binary, binary + ".c"], check=True)
    return binary
