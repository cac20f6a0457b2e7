"""Gatehouse's log, followed while it is written: tests wait for a line (with a deadline)
instead of sleeping, and ask which relay path served a response.

Gatehouse logs with swift-log's StreamLogHandler, one line per request:

    2026-11-23T02:05:00+0000 info gatehouse: method=GET ms=0.4 path=/api/contracts/1 relay=fast request_id=Ab3-1x status=200 [GatehouseServer] request

(metadata `key=value`, sorted by key, between `gatehouse:` and `[module]`, then the message).
The process's stderr pump calls `LogFollower.feed` with every line.
"""

import re
import threading
import time

_LINE = re.compile(r"^\S+ (?P<level>\w+) (?P<label>[^:\s]+):(?P<meta>.*?) \[(?P<source>[^\]]+)\] (?P<message>.*)$")


def fields(line):
    """The metadata of one log line, as a dict (values never contain spaces here)."""
    match = _LINE.match(line.rstrip("\n"))
    if not match:
        return {}
    return dict(token.split("=", 1) for token in match.group("meta").split(" ") if "=" in token)


def message(line):
    match = _LINE.match(line.rstrip("\n"))
    return match.group("message") if match else None


class LogFollower:
    """Every line the process wrote so far, and a condition to wait for more."""

    def __init__(self):
        self.lines = []
        self.condition = threading.Condition()
        self.requests = {}  # request_id -> metadata of its "request" line

    def feed(self, line):
        line = line.rstrip("\n")
        with self.condition:
            self.lines.append(line)
            if message(line) == "request":
                meta = fields(line)
                if "request_id" in meta:
                    self.requests[meta["request_id"]] = meta
            self.condition.notify_all()

    def mark(self):
        """The position after the lines written so far (for `since=`)."""
        with self.condition:
            return len(self.lines)

    def lines_since(self, mark):
        with self.condition:
            return list(self.lines[mark:])

    def wait_for(self, pattern, timeout=10.0, since=0):
        """The first line from `since` on matching `pattern` (a regex), waiting for it to be
        written; AssertionError after `timeout` seconds."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        scanned = since
        with self.condition:
            while True:
                for line in self.lines[scanned:]:
                    if regex.search(line):
                        return line
                scanned = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no log line matching {pattern!r} within {timeout}s")
                self.condition.wait(remaining)

    def request(self, request_id, timeout=10.0):
        """The metadata of the request line of `request_id` (the response's X-Request-Id)."""
        deadline = time.monotonic() + timeout
        with self.condition:
            while request_id not in self.requests:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no request line with request_id={request_id} within {timeout}s")
                self.condition.wait(remaining)
            return self.requests[request_id]


def request_id_of(response):
    """X-Request-Id of a requests / http.client / RawResponse answer, or a header dict."""
    if isinstance(response, str):
        return response
    headers = getattr(response, "headers", response)
    if hasattr(response, "header") and callable(response.header):
        value = response.header("X-Request-Id")
    elif hasattr(headers, "get"):
        value = headers.get("X-Request-Id") or headers.get("x-request-id")
    else:
        value = dict((k.lower(), v) for k, v in headers).get("x-request-id")
    assert value, "the answer carries no X-Request-Id"
    return value


def served_by(gatehouse, response, timeout=10.0):
    """Which relay path served `response`: "fast" or "general" (from the `relay=` metadata of
    its request line; None when the line has none, as before the relay logged it)."""
    follower = gatehouse["lines"] if isinstance(gatehouse, dict) else gatehouse
    return follower.request(request_id_of(response), timeout).get("relay")
