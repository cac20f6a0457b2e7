#!/usr/bin/env python3
"""The counting token proxy: a pass-through proxy in front of an authorization server's endpoint
(a token, revocation or introspection endpoint) that counts what Gatehouse sends it and can
misbehave on command. The end-to-end tests use it in-process; the benchmark runs it as a process.

In-process (tests):

    with CountingTokenProxy(upstream_url + "/o/token/", seen=seen) as proxy:   # proxy.url: …/token
        ...  # proxy.counts(), proxy.hold(n), proxy.fault = (status, body), proxy.pause() …

As a process (the benchmark), with the repository's venv:

    python -m sandbox.tokenproxy --target http://127.0.0.1:PORT/o/token/     # from the repository root
    python sandbox/tokenproxy.py --target …                                    # or by its path

prints one line once listening, {"ready": true, "url": "http://127.0.0.1:PORT/o/token/"}, and
stops on SIGTERM. `GET /_counts` (both ways) answers the requests counted by their grant_type,
e.g. {"total": 3, "authorization_code": 2, "refresh_token": 1}.

The proxy forwards every POST to one target URL and answers with what the target answered
(status, body, Content-Type, Cache-Control). It can instead:

- answer refresh grants with a fixed fault (`fault = (status, JSON bytes)`);
- *hold* the next N refresh grants (`hold(N)`): such a request is read, counted, never
  forwarded and never answered, until `release_held()` (or `stop()`) closes its connection
  without an answer. That is an upstream that stalls longer than any timeout, and, for the
  request that was held, an upstream that never saw it. `wait_held(n)` waits until n are held;
- *pause* forwarding (`pause()`, `resume()`): every request that would be forwarded waits
  until the test resumes, then goes on (an upstream that answers as late as a test needs).

Everything is counted under one lock (`calls`, `grants`, `refreshes`, `forwarded_refreshes`,
`successful_refreshes`, `held_count`) and every refresh grant is kept in `refresh_events`
(monotonic and wall-clock time, outcome), so a test can ask how many refreshes reached the real
upstream and when. Every token the target answered goes into the suite's `seen` secrets.
"""

import argparse
import json
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs

import requests

if __package__ in (None, ""):  # run by its path: the package is the repository root's
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox.stubserver import StubHandler, StubServer  # noqa: E402

PASSED_ON = ("Cache-Control", "Pragma")  # response headers of the target's answer passed on besides Content-Type


class CountingTokenProxy(StubServer):
    """Forwards POSTs to `target`, counting refresh grants; can fault or hold them."""

    def __init__(self, target, seen=None, path="/token"):
        self.target = target
        self.seen = seen
        self.fault = None  # None: forward; or (status, JSON body) to answer refresh grants with
        self.calls = 0  # every POST received
        self.grants = Counter()  # POSTs received by their grant_type ("(none)" without one)
        self.refreshes = 0  # refresh grants received (held, faulted or forwarded)
        self.forwarded_refreshes = 0  # refresh grants forwarded to the target
        self.successful_refreshes = 0  # forwarded refresh grants the target answered 200
        self.held_count = 0  # refresh grants held so far
        self.refresh_events = []  # {"at": monotonic, "wall": epoch seconds, "outcome": "held" | "fault 500" | "forwarded 200" …}
        self.responses = []  # token responses (JSON objects) the target answered 200
        self._to_hold = 0
        self._release = threading.Event()
        self._gate = threading.Event()  # cleared by pause(): requests to forward wait for resume()
        self._gate.set()
        self._session = threading.local()
        proxy = self

        class Handler(StubHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: Gatehouse's HTTP client pools its connections

            def do_GET(self):
                if self.path != "/_counts":
                    return self.reply(404, b'{"error": "not found"}')
                with proxy.condition:
                    body = json.dumps({"total": proxy.calls, **proxy.grants}).encode()
                self.reply(200, body)

            def do_POST(self):
                body = self.read_body()
                form = parse_qs(body.decode(errors="replace"))
                refresh = form.get("grant_type") == ["refresh_token"]
                if proxy.seen is not None:
                    proxy.seen.add(*(form.get("refresh_token", []) + form.get("token", []) + form.get("code", [])),
                                   kind="token presented to the upstream (counting proxy)")
                with proxy.condition:
                    proxy.calls += 1
                    proxy.grants[form.get("grant_type", ["(none)"])[0]] += 1
                    action = "forward"
                    if refresh:
                        proxy.refreshes += 1
                        if proxy._to_hold > 0:
                            proxy._to_hold -= 1
                            proxy.held_count += 1
                            action = "hold"
                        elif proxy.fault:
                            action = "fault"
                        else:
                            proxy.forwarded_refreshes += 1
                        event = {"at": time.monotonic(), "wall": time.time(), "outcome": {"hold": "held", "forward": "forwarded"}.get(action, "fault")}
                        proxy.refresh_events.append(event)
                    proxy.condition.notify_all()
                if action == "hold":
                    proxy._release.wait()  # never forwarded, never answered
                    self.close_connection = True
                    return
                if action == "forward" and not proxy._gate.is_set():
                    proxy._gate.wait(30)  # paused: forwarded once resumed
                if action == "fault":
                    status, payload = proxy.fault
                    event["outcome"] = f"fault {status}"
                    return self.reply(status, payload, "application/json")
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
                try:
                    answer = proxy.http().post(proxy.target, data=body, headers=headers, timeout=30)
                except requests.RequestException:
                    self.close_connection = True
                    return
                if answer.status_code == 200 and answer.headers.get("Content-Type", "").startswith("application/json"):
                    try:
                        tokens = answer.json()
                    except ValueError:
                        tokens = None
                    if isinstance(tokens, dict):
                        if proxy.seen is not None:
                            proxy.seen.add(tokens.get("access_token"), tokens.get("refresh_token"), tokens.get("id_token"),
                                           kind="token issued by the upstream (counting proxy)")
                        with proxy.condition:
                            if "access_token" in tokens:
                                proxy.responses.append(tokens)
                            if refresh:
                                proxy.successful_refreshes += 1
                if refresh:
                    with proxy.condition:
                        event["outcome"] = f"forwarded {answer.status_code}"
                        proxy.condition.notify_all()
                passed_on = [(name, answer.headers[name]) for name in PASSED_ON if name in answer.headers]
                self.reply(answer.status_code, answer.content, answer.headers.get("Content-Type", "application/json"), passed_on)

        super().__init__(Handler, path=path)  # counted under self.condition, StubServer's

    def http(self):
        """A keep-alive session per proxy thread toward the target."""
        if not hasattr(self._session, "value"):
            self._session.value = requests.Session()
        return self._session.value

    def hold(self, count=1):
        """Hold the next `count` refresh grants (never forwarded, never answered)."""
        with self.condition:
            self._release.clear()
            self._to_hold = count

    def wait_held(self, count, timeout=30.0):
        """Waits until `count` refresh grants have been held in all; AssertionError after `timeout`."""
        self.wait_until(lambda: self.held_count >= count, timeout, f"{count} held refresh grant(s)")

    def wait_until(self, predicate, timeout, what):
        self.wait_received(lambda _: predicate(), timeout, f"the proxy did not see {what} within {timeout}s")

    def pause(self):
        """Requests that would be forwarded wait (at most 30 s) until `resume()`, then go on:
        an upstream that takes as long as the test needs to act meanwhile."""
        self._gate.clear()

    def resume(self):
        self._gate.set()

    def release_held(self):
        """Closes every held request's connection, still without an answer; stops holding."""
        with self.condition:
            self._to_hold = 0
        self._release.set()

    def counts(self):
        with self.condition:
            return {"calls": self.calls, "refreshes": self.refreshes, "forwarded": self.forwarded_refreshes,
                    "succeeded": self.successful_refreshes, "held": self.held_count}

    def while_holding(self, count, action):
        """Runs `action()` while the next `count` refreshes are held (read, never forwarded, never
        answered); returns its result and what this proxy counted meanwhile."""
        before = self.counts()
        self.hold(count)
        try:
            result = action()
            after = self.counts()
        finally:
            self.release_held()
        return result, {key: after[key] - before[key] for key in after}

    def pair_for_access_token(self, access_token):
        """The token response (as the target answered it) that carried `access_token`."""
        with self.condition:
            return next((tokens for tokens in self.responses if tokens.get("access_token") == access_token), None)

    def stop(self):
        self.resume()
        self.release_held()
        super().stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the upstream's endpoint every POST is forwarded to")
    parser.add_argument("--path", default="/o/token/", help="the path of the proxy's URL (default /o/token/)")
    options = parser.parse_args()
    proxy = CountingTokenProxy(options.target, path=options.path)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    print(json.dumps({"ready": True, "url": proxy.url}), flush=True)
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
