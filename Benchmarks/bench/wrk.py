"""wrk's output: requests/s, the p50 and p99 latencies, the request count, non-2xx answers, socket
errors and check.lua's body-check line of one run (`parse_wrk`)."""

import re


UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def to_ms(text):
    """A wrk duration (250us, 1.5ms, 2s, 1m, 1h) in milliseconds; ValueError on another."""
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError(f"unknown time {text!r}")
    return float(m.group(1)) * UNITS_MS[m.group(2)]


def parse_wrk(text):
    """rps, p50, p99 (ms), requests, non2xx, socket errors and the body check of one wrk output;
    raises ValueError when it has no numbers."""
    rps = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.M)
    p50 = re.search(r"^\s+50%\s+([0-9.]+[a-z]+)", text, re.M)
    p99 = re.search(r"^\s+99%\s+([0-9.]+[a-z]+)", text, re.M)
    if not (rps and p50 and p99):
        first = [line for line in text.strip().splitlines() if line.strip()][:1]
        raise ValueError(first[0].strip() if first else "no wrk output")
    total = re.search(r"^\s+(\d+) requests in", text, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    check = re.search(r"^body-check: checked=(\d+) failed=(\d+) responses=(\d+)", text, re.M)
    first_failure = re.search(r"^body-check first failure: (.*)$", text, re.M)
    return {
        "rps": float(rps.group(1)),
        "p50": to_ms(p50.group(1)),
        "p99": to_ms(p99.group(1)),
        "requests": int(total.group(1)) if total else None,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(int(x) for x in sock.groups()) if sock else 0,
        "socket_detail": sock.group(0) if sock else "",
        "checked": int(check.group(1)) if check else None,
        "check_failed": int(check.group(2)) if check else None,
        "check_responses": int(check.group(3)) if check else None,
        "first_failure": first_failure.group(1) if first_failure else None,
    }
