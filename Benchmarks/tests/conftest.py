"""The harness's unit tests (no processes, no network): Benchmarks/ (the `bench` package) and the
repository root (the `sandbox` package it imports) on sys.path, and the run dictionaries they build."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]


def wrk_run(rps, p50=1.0, p99=2.0, round_=1, cpu=None, **extra):
    """One measured run as bench.rounds.measure records it: valid (body checked, all 2xx) unless
    `extra` says otherwise."""
    run = {"round": round_, "rps": rps, "p50": p50, "p99": p99, "requests": int(rps * 10), "non2xx": 0,
           "socket_errors": 0, "socket_detail": "", "checked": 10, "check_failed": 0, "check_responses": int(rps * 10),
           "error": None}
    if cpu is not None:
        run["cpu_us_per_req"] = cpu
    run.update(extra)
    return run
