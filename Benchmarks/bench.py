#!/usr/bin/env python3
"""Small helpers for Benchmarks/run (standard library only).

    bench.py free-ports N                     N distinct free loopback TCP ports, one per line
    bench.py wait-port PORT [--pid PID]       exit 0 once 127.0.0.1:PORT accepts a connection
    bench.py wait-line FILE REGEX [--pid PID] print the first line of FILE matching REGEX once it is there
    bench.py render TEMPLATE OUT KEY=VALUE…   replace @KEY@ placeholders; unknown ones are an error
    bench.py fetch URL [--header H] [--expect-status N] [--expect-body FILE]
    bench.py token                            a random bearer token
    bench.py table --direct F --proxy F [--gatehouse F | --gatehouse-failed REASON]
                   [--baseline F | --baseline-failed REASON]
                                              the Markdown result table from wrk outputs; with a
                                              baseline, a "gatehouse (baseline)" row and a line
                                              comparing the two binaries
    bench.py sealed-table --passthrough F|--passthrough-failed R --sealed F|--sealed-failed R
                                              the second table: sealed on PostgreSQL vs passthrough on SQLite
"""

import argparse
import os
import re
import secrets
import socket
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
    request = urllib.request.Request(args.url, method="GET")
    for header in args.header:
        name, _, value = header.partition(":")
        request.add_header(name.strip(), value.strip())
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except OSError as error:
        print(f"GET {args.url}: {error}", file=sys.stderr)
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
        print(f"GET {args.url}: " + "; ".join(problems), file=sys.stderr)
        print(f"  body: {body[:300]!r}", file=sys.stderr)
        return 1
    print(f"GET {args.url}: {status}, {len(body)} bytes, body as expected")
    return 0


def token(_args):
    print(secrets.token_urlsafe(24))


# ---- wrk output ----------------------------------------------------------------------

UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def to_ms(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError(f"unknown time {text!r}")
    return float(m.group(1)) * UNITS_MS[m.group(2)]


def parse_wrk(path):
    """Returns a dict with rps, p50, p99 (ms), requests, non2xx, socket_errors; or raises ValueError."""
    with open(path, errors="replace") as f:
        text = f.read()
    rps = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.M)
    p50 = re.search(r"^\s+50%\s+([0-9.]+[a-z]+)", text, re.M)
    p99 = re.search(r"^\s+99%\s+([0-9.]+[a-z]+)", text, re.M)
    if not (rps and p50 and p99):
        first = text.strip().splitlines()[:1]
        raise ValueError(first[0] if first else "no wrk output")
    total = re.search(r"^\s+(\d+) requests in", text, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {
        "rps": float(rps.group(1)),
        "p50": to_ms(p50.group(1)),
        "p99": to_ms(p99.group(1)),
        "requests": int(total.group(1)) if total else None,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": sum(int(x) for x in sock.groups()) if sock else 0,
        "socket_detail": sock.group(0) if sock else "",
    }


def fmt_ms(value):
    return f"{value:.3f}" if value < 10 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def table(args):
    baseline_name = "gatehouse (baseline)"
    # (name, wrk output or None, why it failed); the baseline ran before the current binary.
    rows = [("nginx direct", args.direct, None), ("nginx proxy", args.proxy, None)]
    if args.baseline or args.baseline_failed:
        rows.append((baseline_name, args.baseline, args.baseline_failed))
    if args.gatehouse or args.gatehouse_failed:
        rows.append(("gatehouse", args.gatehouse, args.gatehouse_failed))

    results, notes = {}, []
    for name, path, failed in rows:
        if path is None:
            results[name] = None
            notes.append(f"- {name}: FAILED ({failed})")
            continue
        try:
            results[name] = parse_wrk(path)
        except (OSError, ValueError) as error:
            results[name] = None
            notes.append(f"- {name}: FAILED (wrk: {error})")
            continue
        r = results[name]
        if r["non2xx"]:
            notes.append(f"- {name}: {r['non2xx']} of {r['requests']} responses were not 2xx/3xx "
                         "- its numbers are NOT valid")
        if r["socket_errors"]:
            notes.append(f"- {name}: {r['socket_detail']}")

    direct, proxy = results.get("nginx direct"), results.get("nginx proxy")

    def ratio(r, base):
        return f"{r['rps'] / base['rps']:.2f}x" if r and base and base["rps"] else "n/a"

    out = ["| target | requests/s | p50 ms | p99 ms | vs nginx proxy | vs direct |",
           "|---|---:|---:|---:|---:|---:|"]
    for name, _, _ in rows:
        r = results[name]
        if r is None:
            out.append(f"| {name} | failed | - | - | - | - |")
        else:
            label = f"{name} (INVALID: non-2xx)" if r["non2xx"] else name
            out.append(f"| {label} | {r['rps']:,.0f} | {fmt_ms(r['p50'])} | {fmt_ms(r['p99'])} "
                       f"| {ratio(r, proxy)} | {ratio(r, direct)} |")
    out.append("")
    gate = results.get("gatehouse")
    if gate and proxy:
        delta = gate["p99"] - proxy["p99"]
        out.append(f"p99 delta vs nginx proxy: {delta:+.2f} ms")
    elif "gatehouse" in results:
        out.append("p99 delta vs nginx proxy: n/a (gatehouse failed)")
    else:
        out.append("p99 delta vs nginx proxy: n/a (gatehouse not run)")
    if baseline_name in results:
        base = results[baseline_name]
        if base and proxy:
            out.append(f"p99 delta vs nginx proxy, baseline: {base['p99'] - proxy['p99']:+.2f} ms")
        else:
            out.append("p99 delta vs nginx proxy, baseline: n/a (baseline failed)")
        if gate and base and base["rps"]:
            out.append(f"current vs baseline: requests/s {gate['rps'] / base['rps']:.2f}x "
                       f"({gate['rps']:,.0f} / {base['rps']:,.0f}), "
                       f"p50 {gate['p50'] - base['p50']:+.3f} ms, p99 {gate['p99'] - base['p99']:+.2f} ms"
                       + (" (INVALID: non-2xx responses, see below)" if gate["non2xx"] or base["non2xx"] else ""))
        else:
            out.append("current vs baseline: n/a (" + ("baseline" if not base else "gatehouse") + " failed)")
    if notes:
        out.append("")
        out.extend(notes)
    print("\n".join(out))
    return 0


def sealed_table(args):
    rows, notes = [], []

    def load(name, path, failed):
        if path is None:
            notes.append(f"- {name}: FAILED ({failed or 'not run'})")
            return None
        try:
            r = parse_wrk(path)
        except (OSError, ValueError) as error:
            notes.append(f"- {name}: FAILED (wrk: {error})")
            return None
        if r["non2xx"]:
            notes.append(f"- {name}: {r['non2xx']} of {r['requests']} responses were not 2xx/3xx "
                         "- its numbers are NOT valid")
        if r["socket_errors"]:
            notes.append(f"- {name}: {r['socket_detail']}")
        return r

    base_name, sealed_name = "gatehouse passthrough (SQLite)", "gatehouse sealed (PostgreSQL)"
    base = load(base_name, args.passthrough, args.passthrough_failed)
    sealed = load(sealed_name, args.sealed, args.sealed_failed)
    out = ["| target | requests/s | p50 ms | p99 ms | vs passthrough (SQLite) |",
           "|---|---:|---:|---:|---:|"]
    for name, r in ((base_name, base), (sealed_name, sealed)):
        if r is None:
            out.append(f"| {name} | failed | - | - | - |")
            continue
        label = f"{name} (INVALID: non-2xx)" if r["non2xx"] else name
        ratio = f"{r['rps'] / base['rps']:.2f}x" if base and base["rps"] else "n/a"
        out.append(f"| {label} | {r['rps']:,.0f} | {fmt_ms(r['p50'])} | {fmt_ms(r['p99'])} | {ratio} |")
    out.append("")
    if base and sealed:
        out.append(f"p99 delta sealed vs passthrough: {sealed['p99'] - base['p99']:+.2f} ms")
    else:
        out.append("p99 delta sealed vs passthrough: n/a")
    if notes:
        out.append("")
        out.extend(notes)
    print("\n".join(out))
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
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--expect-status", type=int, default=200)
    p.add_argument("--expect-body")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(func=fetch)

    p = sub.add_parser("token")
    p.set_defaults(func=token)

    p = sub.add_parser("table")
    p.add_argument("--direct", required=True)
    p.add_argument("--proxy", required=True)
    p.add_argument("--gatehouse")
    p.add_argument("--gatehouse-failed")
    p.add_argument("--baseline")
    p.add_argument("--baseline-failed")
    p.set_defaults(func=table)

    p = sub.add_parser("sealed-table")
    p.add_argument("--passthrough")
    p.add_argument("--passthrough-failed")
    p.add_argument("--sealed")
    p.add_argument("--sealed-failed")
    p.set_defaults(func=sealed_table)

    args = parser.parse_args()
    sys.exit(args.func(args) or 0)


if __name__ == "__main__":
    main()
