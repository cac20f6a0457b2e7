"""Graceful shutdown and reload (issue 11, item 5), against Gatehouse processes of their own.

- SIGTERM during a 200-connection relay load (keep-alive connections, many requests each, the
  fast path: GETs of a cached identity, some of them slower than the drain; and the general
  path: POSTs with a body): `/readyz` turns 503 at once while `/healthz` stays 200, requests are
  still served for `server.shutdown_drain`, no request fully sent before the signal fails, the
  slow ones in flight when the listener closes finish, and the process exits 0.
- SIGHUP with a route appended: the route answers without a restart, on a keep-alive
  connection opened before the signal (the same socket before and after).
- SIGHUP with a broken file: the old configuration is kept and the problem is logged with its
  YAML path. SIGHUP changing `server.port`: refused, logged, the old configuration kept.
"""

import http.client
import os
import secrets
import signal
import subprocess
import re
import socket
import threading
import time
from collections import Counter

import pytest
import requests

from sandbox.gatelog import served_by
from sandbox.nativeapp import free_port
from processes import session_keys  # noqa: E402
from sandbox.gatehouse import gatehouse_binary  # noqa: E402
from operations import identity, gateway, gateway_config, poll, route_yaml
from rawhttp import RawClient, request

CONNECTIONS = 200
SLOW_CONNECTIONS = 10  # of the 200: GETs the backend answers after SLOW_SECONDS (fast path, in flight at the close)
DRAIN = 2.0
SLOW_SECONDS = 3.5
TIMEOUT = 10.0


@pytest.fixture(scope="module")
def relay_token(identity, seen):
    token = "life-" + secrets.token_urlsafe(32)
    seen.add(token, kind="relayed access token (lifecycle test)")
    identity.register(token, "alice")
    return token


def raise_file_limit(needed):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else min(needed, hard), hard))


class LoadWorker(threading.Thread):
    """One keep-alive connection sending requests back to back until `stop`, recording for each
    when it was fully sent (None: it was not), the outcome (status or error name) and its
    X-Request-Id. Ends at the first failure after the signal (the listener may be closed).
    Slow connections send their first request once `slow_go` is set, just before the signal, so
    it is still in flight when the drain ends."""

    def __init__(self, port, index, token, barrier, stop, signalled, slow_go):
        super().__init__(daemon=True)
        self.port, self.index, self.token = port, index, token
        self.barrier, self.stop, self.signalled, self.slow_go = barrier, stop, signalled, slow_go
        self.kind = "slow" if index < SLOW_CONNECTIONS else ("fast" if index % 2 else "general")
        self.results = []  # (sent_at or None, answered_at, outcome, request_id)
        self.in_flight_since = None

    def run(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            connection.connect()
        except OSError as error:
            self.results.append((None, time.monotonic(), type(error).__name__, None))
            return
        self.barrier.wait(timeout=60)
        if self.kind == "slow":
            self.slow_go.wait(60)
        number = 0
        while not self.stop.is_set():
            number += 1
            sent_at = None
            try:
                if self.kind == "general":
                    # Chunked: a small Content-Length body could take the fast path (issue 12).
                    body = secrets.token_bytes(512)
                    connection.request("POST", f"/api/life/post/{self.index}/{number}", body=[body], encode_chunked=True,
                                       headers={**headers, "Content-Type": "application/octet-stream",
                                                "Transfer-Encoding": "chunked"})
                elif self.kind == "slow":
                    connection.request("GET", f"/api/life/slow?seconds={SLOW_SECONDS}", headers=headers)
                else:
                    connection.request("GET", f"/api/life/get/{self.index}/{number}", headers=headers)
                sent_at = time.monotonic()
                self.in_flight_since = sent_at
                response = connection.getresponse()
                response.read()
                outcome, request_id = response.status, response.getheader("X-Request-Id")
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            except (OSError, http.client.HTTPException) as error:
                outcome, request_id = type(error).__name__, None
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self.in_flight_since = None
            self.results.append((sent_at, time.monotonic(), outcome, request_id))
            if outcome != 200 and self.signalled.is_set():
                break
        connection.close()


@pytest.fixture
def draining(workdir, upstream, relay_doubles, seen, identity):
    raise_file_limit(4 * CONNECTIONS + 1024)
    port = free_port()
    backend = relay_doubles["backend"].url
    config = gateway_config(port, workdir, "lifecycle-drain", upstream["url"], identity.url_for_config, backend, seen,
                            server_extra={"shutdown_drain": f"{DRAIN:g}s", "shutdown_timeout": f"{TIMEOUT:g}s"},
                            routes=route_yaml("/api/life", backend + "/life", "legacy"))
    with gateway(workdir, "lifecycle-drain", config, upstream["env"]) as instance:
        yield instance


def test_sigterm_under_200_connections_drains_serves_everything_accepted_and_exits_0(draining, relay_token):
    port, process = draining["port"], draining["process"]
    base = draining["url"]
    warm = requests.get(base + "/api/life/warm", headers={"Authorization": f"Bearer {relay_token}"}, timeout=10)
    assert warm.status_code == 200, warm.text  # the identity is cached: GETs take the fast path

    barrier, stop, signalled, slow_go = threading.Barrier(CONNECTIONS), threading.Event(), threading.Event(), threading.Event()
    workers = [LoadWorker(port, index, relay_token, barrier, stop, signalled, slow_go) for index in range(CONNECTIONS)]
    for worker in workers:
        worker.start()
    try:
        # Every connection is busy: quick ones have had answers, then slow ones send a request.
        poll(lambda: all(len(w.results) >= 2 for w in workers if w.kind != "slow"), 60, "every quick connection under load")
        slow_go.set()
        poll(lambda: all(w.in_flight_since is not None for w in workers if w.kind == "slow"), 10,
             "a request in flight on every slow connection")
        sample = {kind: next(w.results[-1][3] for w in workers if w.kind == kind) for kind in ("fast", "general")}

        asked = time.monotonic()
        assert _status(base + "/readyz") == 200
        readyz_latency = time.monotonic() - asked  # under this load, before the signal

        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        signalled.set()
        # /readyz turns 503 at once; /healthz stays 200, during the drain.
        (ready,) = poll(lambda: _answer_if(base + "/readyz", 503), DRAIN - 0.5, "/readyz 503 after SIGTERM", interval=0.01)
        readyz_at = time.monotonic()
        assert ready.headers["Content-Type"].startswith("application/problem+json")
        assert "shutting down" in ready.text
        assert _status(base + "/healthz") == 200
        healthz_at = time.monotonic()
        assert healthz_at - signalled_at < DRAIN, "the drain ended before /healthz was asked"

        poll(lambda: time.monotonic() > signalled_at + DRAIN + 1.0, DRAIN + 5, "the end of the drain", interval=0.1)
        stop.set()
        status = process.wait(DRAIN + TIMEOUT + 10)
        exited_at = time.monotonic()
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)

    results = [(worker.kind, *result) for worker in workers for result in worker.results]
    before = [r for r in results if r[1] is not None and r[1] < signalled_at]
    during = [r for r in results if r[1] is not None and signalled_at <= r[1] < signalled_at + DRAIN - 0.5]
    late = [r for r in results if r[1] is None or r[1] >= signalled_at + DRAIN - 0.5]
    failed_before = Counter((kind, outcome) for kind, _, _, outcome, _ in before if outcome != 200)
    failed_during = Counter((kind, outcome) for kind, _, _, outcome, _ in during if outcome != 200)
    summary = (f"{len(before)} requests sent before SIGTERM, {len(during)} during the drain, {len(late)} later "
               f"({Counter(outcome for *_, outcome, _ in late)}); readyz 503 after {readyz_at - signalled_at:.3f}s "
               f"(a /readyz took {readyz_latency:.3f}s under load before the signal), "
               f"exit after {exited_at - signalled_at:.2f}s")
    print("\n" + summary)
    assert status == 0, f"exit status {status}; {summary}"
    assert failed_before == Counter(), f"requests accepted before SIGTERM failed: {failed_before}; {summary}"
    assert failed_during == Counter(), f"requests sent during the drain failed: {failed_during}; {summary}"
    assert readyz_at - signalled_at < 1.0, "/readyz turned 503 late (the client's own latency under load included)"
    kinds = Counter(kind for kind, sent, _, outcome, _ in before if outcome == 200)
    connections = Counter(worker.kind for worker in workers)
    assert kinds["fast"] >= 2 * connections["fast"] and kinds["general"] >= 2 * connections["general"], kinds
    assert len(during) > 0, "nothing was served during the drain"
    # The slow GETs in flight when the listener closed (after the drain) were answered, not cut.
    slow_late = [r for r in before if r[0] == "slow" and r[2] > signalled_at + DRAIN]
    assert slow_late and all(r[3] == 200 for r in slow_late), slow_late
    assert exited_at - signalled_at >= DRAIN
    # Both relay paths were under load.
    assert served_by(draining["lines"], sample["fast"]) == "fast"
    assert served_by(draining["lines"], sample["general"]) == "general"


def _answer_if(url, status):
    """[the answer to GET `url`] when its status is `status`, else None (a list: a
    requests.Response is falsy when its status is an error)."""
    try:
        answer = requests.get(url, timeout=2)
    except requests.RequestException:
        return None
    return [answer] if answer.status_code == status else None


def _status(url):
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException as error:
        return type(error).__name__


# --------------------------------------------------------------------------- SIGHUP

@pytest.fixture(scope="module")
def reloading(workdir, upstream, relay_doubles, seen, identity):
    port = free_port()
    backend = relay_doubles["backend"].url

    def config(routes, server_extra=None, port_override=None):
        text = gateway_config(port, workdir, "lifecycle-reload", upstream["url"], identity.url_for_config, backend, seen,
                              routes="".join(route_yaml(prefix, backend + prefix.removeprefix("/api"), "legacy")
                                             for prefix in routes),
                              server_extra=server_extra)
        if port_override is not None:
            text = text.replace(f"\n  port: {port}\n", f"\n  port: {port_override}\n", 1)
        return text

    with gateway(workdir, "lifecycle-reload", config(["/api/reload-a"]), upstream["env"]) as instance:
        instance["make_config"] = config
        yield instance


def reload(instance, text, expect, timeout=10):
    """Writes `text` as the configuration file, sends SIGHUP; the lines logged since, once one
    matches `expect` (a regex)."""
    mark = instance["lines"].mark()
    instance["config"].write_text(text)
    os.kill(instance["process"].pid, signal.SIGHUP)
    instance["lines"].wait_for(expect, timeout=timeout, since=mark)
    return instance["lines"].lines_since(mark)


def get(client, path, token):
    answer = client.exchange(request("GET", path, [("Authorization", f"Bearer {token}")]))
    assert answer is not None, f"GET {path}: the connection was closed"
    return answer


def test_sighup_adds_a_route_without_a_restart_or_a_dropped_connection(reloading, relay_token):
    pid = reloading["process"].pid
    with RawClient(reloading["port"]) as client:
        local = client.sock.getsockname()
        assert get(client, "/api/reload-a/x", relay_token).status == 200
        assert get(client, "/api/reload-b/x", relay_token).status == 404
        reload(reloading, reloading["make_config"](["/api/reload-a", "/api/reload-b"]), r"configuration reloaded")
        answer = poll(lambda: (lambda a: a if a.status == 200 else None)(get(client, "/api/reload-b/x", relay_token)), 5,
                      "the new route answering on the connection opened before SIGHUP")
        assert answer.json()["path"] == "/reload-b/x"
        assert get(client, "/api/reload-a/y", relay_token).status == 200
        assert client.sock.getsockname() == local and not client.eof  # the same connection throughout
    assert reloading["process"].poll() is None and reloading["process"].pid == pid


def test_sighup_with_a_broken_file_keeps_the_old_configuration_and_logs_the_problem(reloading, relay_token):
    text = reloading["make_config"](["/api/reload-a", "/api/reload-b", "/api/reload-c"])
    # The third route names an upstream that does not exist.
    broken = text.replace("/reload-c\n    methods: [GET, HEAD, POST]\n    upstream: legacy",
                          "/reload-c\n    methods: [GET, HEAD, POST]\n    upstream: nowhere")
    assert broken != text
    mark = reloading["lines"].mark()
    reload(reloading, broken, r"(?i)reload")
    try:
        reloading["lines"].wait_for(r"routes\[2\]\.upstream", timeout=5, since=mark)
    except AssertionError:
        pass  # the assertion below shows what was logged
    logged = "\n".join(reloading["lines"].lines_since(mark))
    assert "reload" in logged
    assert "routes[2].upstream" in logged, logged[-2000:]
    assert "configuration reloaded" not in logged
    with RawClient(reloading["port"]) as client:
        assert get(client, "/api/reload-a/x", relay_token).status == 200
        assert get(client, "/api/reload-c/x", relay_token).status == 404  # nothing of the broken file applied
    assert reloading["process"].poll() is None


def test_sighup_changing_the_server_section_is_refused_and_the_old_configuration_kept(reloading, relay_token):
    other_port = free_port()
    text = reloading["make_config"](["/api/reload-a", "/api/reload-b", "/api/reload-d"], port_override=other_port)
    logged = "\n".join(reload(reloading, text, r"configuration reload refused"))
    assert "server" in logged and "restart" in logged, logged[-2000:]
    assert "configuration reloaded" not in logged
    with RawClient(reloading["port"]) as client:
        assert get(client, "/api/reload-a/x", relay_token).status == 200
        assert get(client, "/api/reload-d/x", relay_token).status == 404  # the routes of the refused file are not applied
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", other_port), timeout=2).close()
    assert reloading["process"].poll() is None


def test_sighup_after_a_secret_file_changed_is_refused_until_a_restart(workdir, upstream, relay_doubles, seen, identity, relay_token):
    """A file the configuration reads (here the session key ring) is read at start: a reload
    whose document is unchanged but whose key file changed must say so, not claim success
    with the old keys still in force."""
    keys = session_keys(workdir, "lifecycle-reload-keys", seen)
    port = free_port()
    text = gateway_config(port, workdir, "lifecycle-reload-keys", upstream["url"], identity.url_for_config,
                          relay_doubles["backend"].url, seen, sealed=True)
    text = re.sub(r"encryption_keys_file: .*", f"encryption_keys_file: {keys}", text)
    with gateway(workdir, "lifecycle-reload-keys", text, upstream["env"]) as instance:
        subprocess.run([str(gatehouse_binary()), "keys", "rotate", "--file", str(keys)], check=True, capture_output=True, timeout=30)
        seen.add_key_ring(keys)
        logged = "\n".join(reload(instance, text, r"configuration reload refused"))
        assert "changed" in logged and "restart" in logged and str(keys.name) in logged, logged[-2000:]
        assert "configuration reloaded" not in logged
        assert instance["process"].poll() is None
        with RawClient(instance["port"]) as client:
            assert get(client, "/api/ops/x", relay_token).status == 200
