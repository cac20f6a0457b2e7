#!/usr/bin/env python3
"""Small helpers for Benchmarks/run (standard library only).

    bench.py free-ports N                     N distinct free loopback TCP ports, one per line
    bench.py wait-port PORT [--pid PID]       exit 0 once 127.0.0.1:PORT accepts a connection
    bench.py wait-line FILE REGEX [--pid PID] print the first line of FILE matching REGEX once it is there
    bench.py render TEMPLATE OUT KEY=VALUE…   replace @KEY@ placeholders; unknown ones are an error
    bench.py fetch URL [--method M] [--data-file F] [--header H] [--cacert PEM]
                   [--expect-status N] [--expect-body FILE]
    bench.py token                            a random bearer token
    bench.py rss PID                          "VmRSS VmHWM" of a process, in KiB
    bench.py measure --out RUN.json --wrk-out RUN.txt --target T --side S --round N
                     [--cpu-pid PID…] [--cpu-tree PID…] [--rss-pid PID] [--instance NAME]
                     [--count-lines FILE] [--counts-url URL] --expect FILE [--method M]
                     [--body-file F] -- wrk ARGS…
                                              one wrk run with Benchmarks/check.lua: CPU time of the
                                              measured processes over the run, their RSS sampled
                                              during it, the body check's summary line, the
                                              identity calls / refresh grants during it; one JSON
    bench.py note MANIFEST KEY=VALUE…         append one JSON record to the run's manifest
                                              (failed sides, Gatehouse instances, notes)
    bench.py report --runs DIR --manifest F --targets T,T… [--nginx-only]
                                              the report's tables: per target the medians of the
                                              interleaved runs, spread, ratio, p99 delta, CPU per
                                              request, goal and met/missed; Gatehouse's memory
"""

import argparse
import json
import os
import re
import secrets
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_ports(args):
    sockets = []
    try:
        for _ in range(args.count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        for s in sockets:
            print(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()


def alive(pid):
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_port(args):
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", args.port), timeout=args.interval):
                return 0
        except OSError:
            pass
        if not alive(args.pid):
            print(f"process {args.pid} exited before port {args.port} opened", file=sys.stderr)
            return 2
        if time.monotonic() >= deadline:
            print(f"port {args.port} did not open within {args.timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(args.interval)


def wait_line(args):
    pattern = re.compile(args.pattern)
    deadline = time.monotonic() + args.timeout
    offset, partial = 0, b""
    while True:
        try:
            with open(args.file, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        offset += len(chunk)
        *complete, partial = (partial + chunk).split(b"\n")
        for line in complete:
            text = line.decode(errors="replace")
            if pattern.search(text):
                print(text)
                return 0
        if not alive(args.pid):
            print(f"process {args.pid} exited before {args.file} showed /{args.pattern}/", file=sys.stderr)
            return 2
        if time.monotonic() >= deadline:
            print(f"no line matching /{args.pattern}/ in {args.file} within {args.timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(args.interval)


def render(args):
    with open(args.template) as f:
        text = f.read()
    for pair in args.values:
        key, _, value = pair.partition("=")
        text = text.replace(f"@{key}@", value)
    left = sorted(set(re.findall(r"@[A-Z][A-Z0-9_]*@", text)))
    if left:
        print(f"{args.template}: no value for {' '.join(left)}", file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        f.write(text)
    return 0


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


def token(_args):
    print(secrets.token_urlsafe(24))


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


def rss(args):
    current, peak = vm_kib(args.pid)
    if current is None:
        return 1
    print(current, peak)
    return 0


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


# ---- one measured wrk run -----------------------------------------------------------------------

def measure(args):
    wrk = list(args.wrk)
    if wrk and wrk[0] == "--":
        wrk = wrk[1:]
    if not wrk:
        print("measure: no wrk command after --", file=sys.stderr)
        return 2
    env = dict(os.environ, BENCH_EXPECT_FILE=args.expect, BENCH_CHECK_EVERY=str(args.check_every))
    if args.method:
        env["BENCH_METHOD"] = args.method
    if args.body_file:
        env["BENCH_BODY_FILE"] = args.body_file
        env["BENCH_CONTENT_TYPE"] = args.content_type
    pids = list(args.cpu_pid)
    for root in args.cpu_tree:
        pids.extend(descendants(root))

    def total_ticks():
        if not pids:
            return None
        values = [cpu_ticks(p) for p in pids]
        return None if any(v is None for v in values) else sum(values)

    identity_before = count_lines(args.count_lines)
    refresh_before = refresh_count(args.counts_url)
    ticks_before = total_ticks()
    rss_max = None
    started = time.monotonic()
    with open(args.wrk_out, "wb") as out:
        child = subprocess.Popen(wrk, stdout=out, stderr=subprocess.STDOUT, env=env)

        def stop(signum, _frame):
            child.kill()
            sys.exit(128 + signum)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        limit = args.time_limit
        while child.poll() is None:
            if args.rss_pid:
                current, _ = vm_kib(args.rss_pid)
                if current is not None:
                    rss_max = current if rss_max is None else max(rss_max, current)
            if time.monotonic() - started > limit:
                child.kill()
                break
            time.sleep(args.sample_interval)
        rc = child.wait()
    elapsed = time.monotonic() - started
    ticks_after = total_ticks()
    identity_after = count_lines(args.count_lines)
    refresh_after = refresh_count(args.counts_url)

    with open(args.wrk_out, errors="replace") as f:
        text = f.read()
    run = {"target": args.target, "side": args.side, "round": args.round, "instance": args.instance,
           "wrk_rc": rc, "elapsed_s": round(elapsed, 3), "pids": pids, "error": None}
    try:
        run.update(parse_wrk(text))
    except ValueError as error:
        run["error"] = f"wrk: {error}"
    if rc != 0 and not run["error"]:
        run["error"] = f"wrk exited with status {rc}"
    if ticks_before is not None and ticks_after is not None:
        run["cpu_ticks"] = ticks_after - ticks_before
        run["clk_tck"] = CLK_TCK
        if run.get("requests"):
            run["cpu_us_per_req"] = run["cpu_ticks"] / CLK_TCK * 1e6 / run["requests"]
    elif pids:
        run["cpu_note"] = "a measured process exited during the run"
    if args.rss_pid:
        run["rss_max_kib"] = rss_max
        run["hwm_kib"] = vm_kib(args.rss_pid)[1]
    if args.count_lines:
        run["identity_calls"] = identity_after - identity_before
    if args.counts_url:
        run["refresh_grants"] = (None if refresh_before is None or refresh_after is None
                                 else refresh_after - refresh_before)
    with open(args.out, "w") as f:
        json.dump(run, f, indent=1)

    for line in text.rstrip().splitlines():
        print("    " + line, file=sys.stderr)
    summary = "; ".join(problems_of(run)) or "valid"
    if run.get("rps") is not None:
        cpu = f", CPU {run['cpu_us_per_req']:.1f} µs/request" if run.get("cpu_us_per_req") is not None else ""
        print(f"    -> {run['rps']:,.0f} requests/s, p50 {fmt_ms(run['p50'])} ms, p99 {fmt_ms(run['p99'])} ms"
              f"{cpu}; {summary}", file=sys.stderr)
    else:
        print(f"    -> {summary}", file=sys.stderr)
    return 0


def note(args):
    record = {}
    for pair in args.values:
        key, _, value = pair.partition("=")
        record[key] = value
    with open(args.manifest, "a") as f:
        f.write(json.dumps(record) + "\n")
    return 0


# ---- the report ---------------------------------------------------------------------------------

# The performance goals (docs/performance.md), in the order the harness measures them.
TARGETS = {
    "passthrough": {"label": "passthrough GET", "ratio": 0.80, "p99_ms": 1.0,
                    "what": "`GET /api/data`, passthrough token, warm identity cache, SQLite store",
                    "reference": "nginx proxy → nginx backend (http)"},
    "post": {"label": "POST 2 KiB JSON", "ratio": 0.70,
             "what": "`POST /api/post` with a 2,048-byte JSON body, passthrough token",
             "reference": "the same POST through the nginx proxy"},
    "tls": {"label": "https backend", "ratio": 0.70,
            "what": "`GET /tls/data` → `https://127.0.0.1:…/api/data` (self-signed, `backend_ca_file`)",
            "reference": "nginx proxy → the same https backend (verify on, session reuse, keepalive)"},
    "sealed-sqlite": {"label": "sealed, SQLite", "ratio": 0.75,
                      "what": "`GET /api/data`, sealed `gha_` token, `store: sqlite`",
                      "reference": "nginx proxy → nginx backend (http)"},
    "sealed-pg": {"label": "sealed, PostgreSQL", "ratio": 0.75,
                  "what": "`GET /api/data`, sealed `gha_` token, `store: postgres`",
                  "reference": "nginx proxy → nginx backend (http)"},
    # Trusted app instances (DPoP): no goal, reported next to the bearer token of the same store (sealed, SQLite).
    "dpop": {"label": "DPoP-bound, SQLite", "ratio": None,
             "what": "`GET /api/data`, `ghd_` token bound to an ES256 key, a fresh proof per request, `store: sqlite`",
             "reference": "nginx proxy → nginx backend (http)"},
}
CPU_GOAL = 1.5
SPREAD_FLAG = 0.10
SIDE_NAMES = {"gatehouse": "Gatehouse", "baseline": "Gatehouse baseline binary"}


def load_runs(directory):
    runs = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                run = json.load(f)
        except (OSError, ValueError):
            continue
        runs.setdefault((run["target"], run["side"]), []).append(run)
    for key in runs:
        runs[key].sort(key=lambda r: int(r["round"]))
    return runs


def load_manifest(path):
    records = []
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    records.append(json.loads(line))
    return records


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


def report(args):
    runs = load_runs(args.runs)
    manifest = load_manifest(args.manifest)
    failed = {(m["target"], m["side"]): m["reason"] for m in manifest if m.get("kind") == "failed"}
    extra_notes = [m for m in manifest if m.get("kind") == "note"]
    targets = [t for t in args.targets.split(",") if t in TARGETS]

    out = ["| target | goal | nginx req/s | Gatehouse req/s | spread nginx / GH | ratio | p50 ms nginx / GH "
           "| p99 ms nginx / GH | p99 Δ ms | CPU µs/req nginx / GH | CPU ratio (≤ 1.5) | result |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    notes = []
    summaries = {}
    for target in targets:
        spec = TARGETS.get(target)
        if spec is None:
            continue
        ref = summarize(runs.get((target, "nginx")))
        goal = ("none" if spec["ratio"] is None else f"≥ {spec['ratio']:.2f}×") \
            + (f", p99 ≤ nginx + {spec['p99_ms']:g} ms" if "p99_ms" in spec else "")
        sides = ["gatehouse"] + (["baseline"] if (target, "baseline") in runs or (target, "baseline") in failed else [])
        for side in sides:
            label = spec["label"] + ("" if side == "gatehouse" else " (baseline binary)")
            gh = summarize(runs.get((target, side)))
            summaries[(target, side)] = gh
            ref_failed = failed.get((target, "nginx"))
            gh_failed = failed.get((target, side))
            cells = {"ref": "-", "gh": "-", "ratio": "-", "p50": "-", "p99": "-", "delta": "-", "cpu": "-",
                     "cpu_ratio": "-"}
            if ref and ref.get("rps") is not None:
                cells["ref"] = f"{ref['rps']:,.0f}" + ("" if ref["valid"] else " (INVALID)")
            elif ref_failed:
                cells["ref"] = "FAILED"
            if gh and gh.get("rps") is not None:
                cells["gh"] = f"{gh['rps']:,.0f}" + ("" if gh["valid"] else " (INVALID)")
            elif gh_failed:
                cells["gh"] = "FAILED"
            elif args.nginx_only:
                cells["gh"] = "not run"
            both = ref and gh and ref.get("rps") is not None and gh.get("rps") is not None
            ratio = delta = cpu_ratio = None
            if ref and ref.get("rps") is not None:
                cells["p50"] = f"{fmt_ms(ref['p50'])} / " + (fmt_ms(gh["p50"]) if gh and gh.get("rps") is not None else "-")
                cells["p99"] = f"{fmt_ms(ref['p99'])} / " + (fmt_ms(gh["p99"]) if gh and gh.get("rps") is not None else "-")
            if both:
                ratio = gh["rps"] / ref["rps"] if ref["rps"] else None
                delta = gh["p99"] - ref["p99"]
                cells["ratio"] = f"{ratio:.2f}×" if ratio is not None else "n/a"
                cells["delta"] = f"{delta:+.2f}"
            ref_cpu = ref.get("cpu") if ref else None
            gh_cpu = gh.get("cpu") if gh else None
            if ref_cpu is not None or gh_cpu is not None:
                cells["cpu"] = (f"{ref_cpu:.1f}" if ref_cpu is not None else "-") + " / " + \
                               (f"{gh_cpu:.1f}" if gh_cpu is not None else "-")
            if ref_cpu and gh_cpu is not None:
                cpu_ratio = gh_cpu / ref_cpu
                cells["cpu_ratio"] = f"{cpu_ratio:.2f}× " + ("met" if cpu_ratio <= CPU_GOAL else "missed")

            # The verdict.
            if gh_failed:
                result = "FAILED"
                notes.append(f"- {label}: Gatehouse FAILED ({gh_failed})")
            elif ref_failed and not both:
                result = "FAILED (nginx)"
                notes.append(f"- {label}: the nginx reference FAILED ({ref_failed})")
            elif args.nginx_only and side == "gatehouse":
                result = "not run (nginx only)"
            elif not both:
                result = "no result"
            elif not gh["valid"] or not ref["valid"]:
                result = "INVALID (see below)"
            elif spec["ratio"] is None:
                result = "reported"
            else:
                missed = []
                if ratio is None or ratio < spec["ratio"]:
                    missed.append(f"ratio {ratio:.2f} < {spec['ratio']:.2f}" if ratio is not None else "ratio n/a")
                if "p99_ms" in spec and delta > spec["p99_ms"]:
                    missed.append(f"p99 {delta:+.2f} ms > +{spec['p99_ms']:g} ms")
                result = "met" if not missed else "missed (" + "; ".join(missed) + ")"
                if gh["spread"] > SPREAD_FLAG or ref["spread"] > SPREAD_FLAG:
                    result += ", noisy (spread > 10 %)"
            out.append(f"| {label} | {goal} | {cells['ref']} | {cells['gh']} | {spread_text(ref)} / {spread_text(gh)} "
                       f"| {cells['ratio']} | {cells['p50']} | {cells['p99']} | {cells['delta']} | {cells['cpu']} "
                       f"| {cells['cpu_ratio']} | {result} |")
            for who, s in (("nginx", ref), (SIDE_NAMES[side], gh)):
                if who == "nginx" and side != "gatehouse":
                    continue  # said on the first row of the target
                if not s:
                    continue
                for round_, problems in s["invalid"]:
                    notes.append(f"- {label}, {who}, run {round_}: INVALID: " + "; ".join(problems))
                for line in s.get("socket") or []:
                    notes.append(f"- {label}, {who}, {line}")
            if gh and gh.get("rps") is not None:
                extra = []
                if gh.get("identity_calls") is not None:
                    flag = "" if gh["identity_calls"] == 0 else " (expected 0: the identity cache did not absorb the look-ups)"
                    extra.append(f"identity-service calls during its loads {gh['identity_calls']}{flag}")
                if gh.get("refresh_grants") is not None:
                    flag = "" if gh["refresh_grants"] == 0 else " (expected 0)"
                    extra.append(f"upstream refresh grants during its loads {gh['refresh_grants']}{flag}")
                extra.append(f"body checks {gh['checked']} of {gh['responses']:,} responses"
                             + (f", nginx {ref['checked']} of {ref['responses']:,}" if ref and ref.get("rps") is not None else ""))
                extra.append("req/s per run nginx " + " / ".join(f"{x:,.0f}" for x in (ref or {}).get("all_rps", []))
                             + ", " + SIDE_NAMES[side] + " " + " / ".join(f"{x:,.0f}" for x in gh["all_rps"]))
                notes.append(f"- {label}: " + "; ".join(extra))
            elif ref and ref.get("rps") is not None and side == "gatehouse":
                notes.append(f"- {label}: req/s per run nginx " + " / ".join(f"{x:,.0f}" for x in ref["all_rps"])
                             + f"; body checks {ref['checked']} of {ref['responses']:,} responses")
    if targets:
        print("\n".join(out))
        print()

    # Comparisons between Gatehouse rows.
    lines = []
    current, base = summaries.get(("passthrough", "gatehouse")), summaries.get(("passthrough", "baseline"))
    if ("passthrough", "baseline") in summaries:
        if current and base and current.get("rps") and base.get("rps"):
            lines.append(f"- current vs baseline binary (passthrough GET): requests/s {current['rps'] / base['rps']:.2f}× "
                         f"({current['rps']:,.0f} / {base['rps']:,.0f}), p50 {current['p50'] - base['p50']:+.3f} ms, "
                         f"p99 {current['p99'] - base['p99']:+.2f} ms")
        else:
            lines.append("- current vs baseline binary: n/a (a row failed)")
    for sealed in ("sealed-sqlite", "sealed-pg"):
        s = summaries.get((sealed, "gatehouse"))
        if s and s.get("rps") and current and current.get("rps"):
            lines.append(f"- {TARGETS[sealed]['label']} vs passthrough GET (Gatehouse): requests/s "
                         f"{s['rps'] / current['rps']:.2f}×, p99 {s['p99'] - current['p99']:+.2f} ms")
    bound, bearer = summaries.get(("dpop", "gatehouse")), summaries.get(("sealed-sqlite", "gatehouse"))
    if bound and bearer and bound.get("rps") and bearer.get("rps"):
        cpu = (f", CPU {bound['cpu'] - bearer['cpu']:+.1f} µs/request" if bound.get("cpu") is not None and bearer.get("cpu") is not None
               else "")
        lines.append(f"- DPoP-bound vs bearer (sealed, SQLite; the same store): requests/s {bound['rps'] / bearer['rps']:.2f}× "
                     f"({bound['rps']:,.0f} / {bearer['rps']:,.0f}), p50 {bound['p50'] - bearer['p50']:+.3f} ms, "
                     f"p99 {bound['p99'] - bearer['p99']:+.2f} ms{cpu}")
    direct = summarize(runs.get(("direct", "nginx")))
    if direct and direct.get("rps") is not None:
        lines.append(f"- nginx direct (wrk → backend, no proxy; the ceiling): {direct['rps']:,.0f} requests/s, "
                     f"p50 {fmt_ms(direct['p50'])} ms, p99 {fmt_ms(direct['p99'])} ms"
                     + (f", backend CPU {direct['cpu']:.1f} µs/request" if direct.get("cpu") is not None else "")
                     + ("" if direct["valid"] else " (INVALID: " + "; ".join(p for _, ps in direct["invalid"] for p in ps) + ")"))
    elif ("direct", "nginx") in failed:
        lines.append(f"- nginx direct: FAILED ({failed[('direct', 'nginx')]})")
    for m in extra_notes:
        lines.append(f"- {m.get('text', '')}")
    if lines or notes:
        print("\n".join(lines + notes))
        print()

    # Gatehouse's memory, per instance.
    instances = [m for m in manifest if m.get("kind") == "instance"]
    if instances:
        print("| Gatehouse instance | targets | start to ready | VmRSS at ready (idle) | VmRSS under load (max sampled) | VmHWM after its loads |")
        print("|---|---|---:|---:|---:|---:|")
        for inst in instances:
            mine = [r for key, rs in runs.items() for r in rs if r.get("instance") == inst["name"]]
            rss_max = max((r["rss_max_kib"] for r in mine if r.get("rss_max_kib")), default=None)
            hwm = max((r["hwm_kib"] for r in mine if r.get("hwm_kib")), default=None)
            ready = f"{inst['ready_ms']} ms" if inst.get("ready_ms") else "n/a"
            at_ready = int(inst["rss_ready_kib"]) if inst.get("rss_ready_kib") else None
            print(f"| {inst['name']} | {inst.get('targets', '')} | {ready} | {mib(at_ready)} | {mib(rss_max)} | {mib(hwm)} |")
        print()
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("free-ports")
    p.add_argument("count", type=int)
    p.set_defaults(func=free_ports)

    p = sub.add_parser("wait-port")
    p.add_argument("port", type=int)
    p.add_argument("--pid", type=int)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--interval", type=float, default=0.05)
    p.set_defaults(func=wait_port)

    p = sub.add_parser("wait-line")
    p.add_argument("file")
    p.add_argument("pattern")
    p.add_argument("--pid", type=int)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--interval", type=float, default=0.05)
    p.set_defaults(func=wait_line)

    p = sub.add_parser("render")
    p.add_argument("template")
    p.add_argument("out")
    p.add_argument("values", nargs="*")
    p.set_defaults(func=render)

    p = sub.add_parser("fetch")
    p.add_argument("url")
    p.add_argument("--method", default="GET")
    p.add_argument("--data-file")
    p.add_argument("--content-type", default="application/json")
    p.add_argument("--cacert", help="PEM file: the CA certificates an https URL is checked against")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--expect-status", type=int, default=200)
    p.add_argument("--expect-body")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(func=fetch)

    p = sub.add_parser("token")
    p.set_defaults(func=token)

    p = sub.add_parser("rss")
    p.add_argument("pid", type=int)
    p.set_defaults(func=rss)

    p = sub.add_parser("measure")
    p.add_argument("--out", required=True)
    p.add_argument("--wrk-out", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--side", required=True)
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--instance")
    p.add_argument("--cpu-pid", type=int, action="append", default=[], help="a process whose CPU time counts")
    p.add_argument("--cpu-tree", type=int, action="append", default=[], help="a process whose CPU time and its descendants' count")
    p.add_argument("--rss-pid", type=int, help="a process whose VmRSS is sampled during the run")
    p.add_argument("--sample-interval", type=float, default=0.2)
    p.add_argument("--count-lines", help="a log whose new lines during the run are counted (identity calls)")
    p.add_argument("--counts-url", help="the token proxy's /_counts: refresh grants during the run")
    p.add_argument("--expect", required=True, help="the body every checked response must have")
    p.add_argument("--check-every", type=int, default=1000)
    p.add_argument("--method")
    p.add_argument("--body-file")
    p.add_argument("--content-type", default="application/json")
    p.add_argument("--time-limit", type=float, default=3600.0, help="kill wrk after this many seconds")
    p.add_argument("wrk", nargs=argparse.REMAINDER)
    p.set_defaults(func=measure)

    p = sub.add_parser("note")
    p.add_argument("manifest")
    p.add_argument("values", nargs="*")
    p.set_defaults(func=note)

    p = sub.add_parser("report")
    p.add_argument("--runs", required=True)
    p.add_argument("--manifest")
    p.add_argument("--targets", required=True)
    p.add_argument("--nginx-only", action="store_true")
    p.set_defaults(func=report)

    args = parser.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
