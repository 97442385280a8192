"""`bench_row` for the Python benchmarks: one row of `make bench`'s summary table (see lib.sh)."""
import os


def bench_row(metric, sandboxd, peer="-", peer_value="-", ratio="-", target="-"):
    """Appends a row to $BENCH_RESULTS when set; TARGET (">=1.0", "<=2.0") applies to RATIO, or to
    SANDBOXD when PEER is "-"."""
    path = os.environ.get("BENCH_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write("\t".join(str(v) for v in (metric, sandboxd, peer, peer_value, ratio, target)) + "\n")
