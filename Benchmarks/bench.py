"""The helpers of Benchmarks/run (standard library only), imported by it: one request checked
against a fixture (`fetch`), CPU time and memory of processes from /proc (`cpu_ticks`,
`descendants`, `vm_kib`), the counters read around a run (`count_lines`, `refresh_count`), wrk's
output (`parse_wrk`), why a run does not count (`problems_of`) and the medians of one side's runs
(`summarize`, `spread_text`, `fmt_ms`, `mib`). The harness itself (the targets, the peers, the
goals, the rounds and the report) is Benchmarks/run.
"""

import json
import os
import re
import ssl
import statistics
import sys
import urllib.error
import urllib.request


def fetch(args):
    data = None
    if args.data_file:
        with open(args.data_file, "rb") as f:
            data = f.read()
    request = urllib.request.Request(args.url, method=args.method, data=data)
    if data is not None:
        request.add_header("Content-Type", args.content_type)
    for header in args.header:
        name, _, value = header.partition(":")
        request.add_header(name.strip(), value.strip())
    context = ssl.create_default_context(cafile=args.cacert) if args.cacert else None
    what = f"{args.method} {args.url}"
    try:
        with urllib.request.urlopen(request, timeout=args.timeout, context=context) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except OSError as error:
        print(f"{what}: {error}", file=sys.stderr)
        return 1
    problems = []
    if status != args.expect_status:
        problems.append(f"status {status}, expected {args.expect_status}")
    if args.expect_body:
        with open(args.expect_body, "rb") as f:
            expected = f.read()
        if body != expected:
            problems.append(f"body differs from {args.expect_body} ({len(body)} vs {len(expected)} bytes)")
    if problems:
        print(f"{what}: " + "; ".join(problems), file=sys.stderr)
        print(f"  body: {body[:300]!r}", file=sys.stderr)
        return 1
    print(f"{what}: {status}, {len(body)} bytes, body as expected")
    return 0


def fmt_ms(value):
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


# ---- processes: CPU time and memory from /proc ---------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    """utime + stime of a process (all its threads), in clock ticks; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After "pid (comm)": state is field 3; utime and stime are fields 14 and 15.
    return int(fields[11]) + int(fields[12])


def descendants(pid):
    """pid and every process below it (nginx: the master and its workers)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return found


def vm_kib(pid):
    """(VmRSS, VmHWM) in KiB, or (None, None)."""
    rss = hwm = None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def count_lines(path):
    if not path or not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def refresh_count(url):
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(json.load(response).get("refresh_token", 0))
    except (OSError, ValueError):
        return None


# ---- wrk output ----------------------------------------------------------------------

UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def to_ms(text):
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


def problems_of(run):
    """Why a run's numbers do not count (empty: they do)."""
    if run.get("error"):
        return [run["error"]]
    found = []
    if run.get("checked") is None:
        found.append("no body-check line (check.lua did not run)")
    elif run["checked"] == 0:
        found.append("body check: no response checked")
    elif run["check_failed"]:
        found.append(f"body check: {run['check_failed']} of {run['checked']} checked responses wrong"
                     + (f" (first: {run['first_failure']})" if run.get("first_failure") else ""))
    if run.get("non2xx"):
        found.append(f"{run['non2xx']} of {run['requests']} responses not 2xx/3xx")
    return found


# ---- the report ---------------------------------------------------------------------------------

SPREAD_FLAG = 0.10
def context_switches(pid):
    """Voluntary plus involuntary context switches of every thread of `pid` so far, or None."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def summarize(runs):
    """Medians over the valid runs of one side, or None; with the problems of the invalid ones."""
    if not runs:
        return None
    invalid = [(r["round"], problems_of(r)) for r in runs if problems_of(r)]
    numbers = [r for r in runs if r.get("rps") is not None]
    if not numbers:
        return {"runs": len(runs), "valid": False, "invalid": invalid}
    rps = [r["rps"] for r in numbers]
    median_rps = statistics.median(rps)
    cpu = [r["cpu_us_per_req"] for r in numbers if r.get("cpu_us_per_req") is not None]
    return {
        "runs": len(runs),
        "measured": len(numbers),
        "valid": not invalid,
        "invalid": invalid,
        "rps": median_rps,
        "all_rps": rps,
        "spread": (max(rps) - min(rps)) / median_rps if median_rps else 0.0,
        "p50": statistics.median(r["p50"] for r in numbers),
        "p99": statistics.median(r["p99"] for r in numbers),
        "cpu": statistics.median(cpu) if cpu else None,
        "switches": (statistics.median(r["switches_per_req"] for r in numbers if r.get("switches_per_req") is not None)
                     if any(r.get("switches_per_req") is not None for r in numbers) else None),
        "socket": [f"run {r['round']}: {r['socket_detail']}" for r in numbers if r.get("socket_errors")],
        "identity_calls": sum(r.get("identity_calls") or 0 for r in numbers) if any("identity_calls" in r for r in numbers) else None,
        "refresh_grants": (sum(r["refresh_grants"] for r in numbers if r.get("refresh_grants") is not None)
                           if any("refresh_grants" in r for r in numbers) else None),
        "rss_max": max((r["rss_max_kib"] for r in numbers if r.get("rss_max_kib")), default=None),
        "hwm": max((r["hwm_kib"] for r in numbers if r.get("hwm_kib")), default=None),
        "checked": sum(r.get("checked") or 0 for r in numbers),
        "responses": sum(r.get("check_responses") or 0 for r in numbers),
    }


def spread_text(s):
    if s is None or s.get("rps") is None:
        return "-"
    if s["measured"] < 2:
        return "n/a (1 run)"
    text = f"{s['spread'] * 100:.1f} %"
    return f"**{text} > 10 %**" if s["spread"] > SPREAD_FLAG else text


def mib(kib):
    return f"{kib / 1024:.1f} MiB" if kib else "n/a"
