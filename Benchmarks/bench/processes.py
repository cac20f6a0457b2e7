"""Starting and stopping what the harness runs: the process list stopped at the end (Children),
free loopback ports, waiting for a port or a log line, configuration templates (`render`), one
checked request (`check`), and the harness's messages (`say`, `warn`, `log_tail`)."""

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

from .proc import descendants


def fetch(args):
    """One request (args: url, method, data_file, content_type, header, cacert, expect_status,
    expect_body, timeout) checked against its expected status and body; 0 when as expected, else 1."""
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


def fail(message, code=2):
    """Stops the run: `run: message` on stderr, exit status `code`."""
    print(f"run: {message}", file=sys.stderr)
    sys.exit(code)


def say(text):
    """A step of the run, in bold on stderr."""
    print(f"\033[1m==> {text}\033[0m", file=sys.stderr, flush=True)


def warn(text):
    """A problem the run goes on after, on stderr."""
    print(f"run: {text}", file=sys.stderr, flush=True)


def log_tail(path, n=30):
    """The last `n` lines of a log, indented, on stderr."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return
    for line in lines:
        print("    " + line[:300], file=sys.stderr)


def last_line(path):
    """The last non-empty line of a log ("" without one), for a failure's reason."""
    try:
        lines = [l.strip() for l in Path(path).read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


class Children:
    """Every process the run starts, stopped at the end (TERM, 3 s grace, KILL with its children)."""

    def __init__(self):
        self.procs = []

    def spawn(self, argv, **kw):
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def adopt(self, p):
        """A process started elsewhere (sandbox.gatehouse), stopped with the others."""
        self.procs.append(p)
        return p

    def stop(self, p):
        if p is None or p.poll() is not None:
            if p in self.procs:
                self.procs.remove(p)
            return
        kids = descendants(p.pid)[1:]
        try:
            p.terminate()
            p.wait(timeout=3)
        except subprocess.TimeoutExpired:
            p.kill()
            for k in kids:
                try:
                    os.kill(k, signal.SIGKILL)
                except OSError:
                    pass
            p.wait()
        except OSError:
            pass
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self):
        for p in list(self.procs):
            if p.poll() is None:
                try:
                    p.terminate()
                except OSError:
                    pass
        for p in list(self.procs):
            self.stop(p)


def free_ports(n):
    """`n` distinct loopback ports free right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port, proc=None, timeout=5.0, interval=0.05):
    """True once 127.0.0.1:port accepts a connection; False when `proc` exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=interval or 0.05):
                return True
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def render(template, out, values):
    """A template with its @NAME@ placeholders filled in from `values`, written to `out`; RuntimeError
    when a placeholder has no value."""
    text = Path(template).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    left = sorted(set(re.findall(r"@[A-Z][A-Z0-9_]*@", text)))
    if left:
        raise RuntimeError(f"{template}: no value for {' '.join(left)}")
    Path(out).write_text(text)


def check(url, expect=None, method="GET", data=None, headers=(), cacert=None, quiet=False):
    """One request; True when it is a 200 with the expected body."""
    ns = types.SimpleNamespace(url=url, method=method, data_file=data, content_type="application/json", cacert=cacert,
                               header=list(headers), expect_status=200, expect_body=expect, timeout=10.0)
    if quiet:
        with open(os.devnull, "w") as sink:
            saved = sys.stdout
            sys.stdout = sink
            try:
                return fetch(ns) == 0
            finally:
                sys.stdout = saved
    saved = sys.stdout
    sys.stdout = sys.stderr
    try:
        return fetch(ns) == 0
    finally:
        sys.stdout = saved


def pause(seconds):
    """The pause between runs (PAUSE)."""
    if seconds > 0:
        time.sleep(seconds)


def wait_for_line(path, pattern, proc, timeout):
    """The first line of the file `path` matching `pattern`, polled every 50 ms; None when `proc`
    exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for line in Path(path).read_text(errors="replace").splitlines():
                if re.search(pattern, line):
                    return line
        except OSError:
            pass
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None
