"""Slow, idle and surplus connections (issue 7, item 5), against Gatehouse processes of their
own: the suite's main instance keeps its defaults, these get short timeouts and small limits.

    server.header_read_timeout   a connection delivers a whole request head within this long
                                 of opening (or of its first byte after an idle keep-alive)
    server.idle_timeout          an idle keep-alive connection is closed after this long
    server.max_connections       beyond it a new connection gets 503 over_capacity and is closed

Every close is observed as an end of file on the client's socket, waited for with a deadline.
"""

import re
import resource
import selectors
import socket
import subprocess
import threading
import time

import pytest

from sandbox.gatelog import LogFollower
from sandbox.nativeapp import free_port, pump, wait_for_line
from rawhttp import RawClient, request

HEADER_READ_TIMEOUT = 2.0
IDLE_TIMEOUT = 4.0
#: How late a close may be: timer granularity, accept latency, a debug build on two busy cores.
MARGIN = 1.5
IDLE_CONNECTIONS = 500
KEEPALIVE_CONNECTIONS = 20
LIMIT = 100


def raise_file_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else min(needed, hard), hard))


def start_instance(gatehouse, upstream, workdir, name, settings):
    """A Gatehouse process with the main instance's configuration on another port and SQLite
    file, plus `settings` in its server block."""
    port = free_port()
    text = gatehouse["config"].read_text()
    old = gatehouse["port"]
    text = text.replace(f"public_base_url: http://127.0.0.1:{old}\n", f"public_base_url: http://127.0.0.1:{port}\n")
    extra = "".join(f"  {key}: {value}\n" for key, value in settings.items())
    assert f"\n  port: {old}\n" in text
    text = text.replace(f"\n  port: {old}\n", f"\n  port: {port}\n{extra}", 1)
    text = re.sub(r"sqlite_path: .*", f"sqlite_path: {workdir}/edge-{name}.sqlite", text)
    path = workdir / f"edge-{name}.yaml"
    path.write_text(text)
    log = open(workdir / f"edge-{name}.log", "w")
    process = subprocess.Popen([str(gatehouse["binary"]), "serve", "--config", str(path), "--log-level", "info"],
                               stdout=log, stderr=subprocess.PIPE, text=True, errors="replace", env=upstream["env"])
    try:
        ready = wait_for_line(process.stderr, r"gatehouse is ready|problems", 30, f"Gatehouse ({name})")
        assert "ready" in ready, f"{name}: {ready}{process.stderr.read() if process.poll() is not None else ''}"
    except BaseException:
        process.kill()
        process.wait(10)
        log.close()
        raise
    lines = LogFollower()
    lines.feed(ready)
    pump(process.stderr, log, lines.feed)
    return {"url": f"http://127.0.0.1:{port}", "port": port, "process": process, "lines": lines, "log_file": log}


def stop_instance(instance):
    instance["process"].terminate()
    instance["process"].wait(10)
    instance["log_file"].close()


@pytest.fixture(scope="module")
def timeouts(gatehouse, upstream, workdir):
    raise_file_limit(4 * (IDLE_CONNECTIONS + KEEPALIVE_CONNECTIONS + LIMIT) + 1024)
    instance = start_instance(gatehouse, upstream, workdir, "timeouts", {
        "header_read_timeout": f"{HEADER_READ_TIMEOUT:g}s", "idle_timeout": f"{IDLE_TIMEOUT:g}s", "max_connections": 600})
    yield instance
    stop_instance(instance)


@pytest.fixture(scope="module")
def limited(gatehouse, upstream, workdir):
    raise_file_limit(4 * (IDLE_CONNECTIONS + KEEPALIVE_CONNECTIONS + LIMIT) + 1024)
    instance = start_instance(gatehouse, upstream, workdir, "limited", {
        "header_read_timeout": "30s", "idle_timeout": "60s", "max_connections": LIMIT})
    yield instance
    stop_instance(instance)


class ServedClient:
    """Another client, served the whole time: alternately a /healthz on a new connection and a
    relayed GET on a keep-alive one, paced every 50 ms, each answer recorded with its time."""

    def __init__(self, port, token):
        self.port = port
        self.auth = [("Authorization", f"Bearer {token}")]
        self.outcomes = []  # (monotonic time, status or error)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        keep = None
        for index in range(100_000):
            if self.stop.is_set():
                break
            try:
                if index % 2 == 0:
                    with RawClient(self.port, timeout=5) as client:
                        answer = client.exchange(request("GET", "/healthz"))
                else:
                    keep = keep or RawClient(self.port, timeout=5)
                    answer = keep.exchange(request("GET", "/api/contracts/served", self.auth))
                    assert answer is not None and answer.json()["path"] == "/contracts/served"
                self.outcomes.append((time.monotonic(), answer.status if answer else "closed"))
            except Exception as error:  # noqa: BLE001 - every failure is an outcome
                self.outcomes.append((time.monotonic(), repr(error)))
                if keep is not None:
                    keep.close()
                    keep = None
            self.stop.wait(0.05)  # pacing, not synchronisation
        if keep is not None:
            keep.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def watch_until_closed(sockets, deadline):
    """Waits (epoll) until every socket in `sockets` (fileno -> socket) reaches end of file or
    a reset, or until `deadline`. Returns fileno -> time of the close (None: still open), and
    fileno -> bytes received before it (Gatehouse may answer 408 first)."""
    selector = selectors.DefaultSelector()
    closed, received = {}, {}
    for fileno, sock in sockets.items():
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        closed[fileno], received[fileno] = None, b""
    open_count = len(sockets)
    while open_count and (remaining := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(remaining):
            sock = key.fileobj
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                received[sock.fileno()] += data
                continue
            closed[sock.fileno()] = time.monotonic()
            selector.unregister(sock)
            open_count -= 1
    selector.close()
    return closed, received


def test_idle_and_slow_connections_are_closed_in_time_while_other_clients_are_served(timeouts, tokens):
    port = timeouts["port"]
    with ServedClient(port, tokens.fresh()) as served:
        # Keep-alive connections that made one request and then sit idle.
        keepalive, answered = [], {}
        for _ in range(KEEPALIVE_CONNECTIONS):
            client = RawClient(port)
            assert client.exchange(request("GET", "/healthz")).status == 200
            answered[client.sock.fileno()] = time.monotonic()
            keepalive.append(client)
        # Connections that never send a byte.
        idle, opened = [], {}
        for _ in range(IDLE_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            opened[sock.fileno()] = time.monotonic()
            idle.append(sock)
        # A slowloris: a request head one header line at a time, every half second.
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        slow_opened = time.monotonic()
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: gatehouse.test\r\n")
        sent_lines = [1]
        slow_done = threading.Event()

        def trickle():
            for index in range(60):
                if slow_done.wait(0.5):  # pacing the sender
                    return
                try:
                    slow.send(b"X-Slow-%d: still typing\r\n" % index)
                except OSError:
                    return
                sent_lines[0] += 1

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()

        sockets = {sock.fileno(): sock for sock in idle}
        sockets[slow.fileno()] = slow
        sockets.update({client.sock.fileno(): client.sock for client in keepalive})
        deadline = time.monotonic() + max(HEADER_READ_TIMEOUT, IDLE_TIMEOUT) + MARGIN + 2
        try:
            closed, received = watch_until_closed(sockets, deadline)
        finally:
            slow_done.set()
            trickler.join(5)
        ended = time.monotonic()
        outcomes = list(served.outcomes)
    try:
        still_open = [fileno for fileno, when in closed.items() if when is None]
        assert still_open == [], f"{len(still_open)} connections were still open {ended - slow_opened:.1f} s after they were opened"

        late = sorted(closed[fileno] - opened[fileno] for fileno in opened if closed[fileno] - opened[fileno] > HEADER_READ_TIMEOUT + MARGIN)
        assert late == [], f"{len(late)} silent connections outlived header_read_timeout ({HEADER_READ_TIMEOUT} s): {late[:5]}"

        slow_lived = closed[slow.fileno()] - slow_opened
        assert slow_lived <= HEADER_READ_TIMEOUT + MARGIN, f"the slowloris lived {slow_lived:.1f} s"
        assert sent_lines[0] >= 3, "the slowloris should have been sending header lines when it was closed"
        assert b"HTTP/1.1 200" not in received[slow.fileno()]

        idle_lived = [closed[fileno] - answered[fileno] for fileno in answered]
        assert all(IDLE_TIMEOUT - 0.5 <= lived <= IDLE_TIMEOUT + MARGIN for lived in idle_lived), \
            f"idle keep-alive connections lived {min(idle_lived):.2f}-{max(idle_lived):.2f} s (idle_timeout {IDLE_TIMEOUT} s)"

        failures = [outcome for outcome in outcomes if outcome[1] != 200]
        assert failures == [], f"the other client was not served: {failures[:5]}"
        times = [when for when, _ in outcomes]
        assert len(times) >= 20 and times[-1] >= max(when for when in closed.values()) - 0.5
        gaps = [later - earlier for earlier, later in zip(times, times[1:])]
        assert max(gaps) < 2.0, f"the other client waited {max(gaps):.1f} s for an answer"
        print(f"{len(closed)} hostile connections closed; the other client got {len(outcomes)} answers, longest gap {max(gaps) * 1000:.0f} ms")
    finally:
        for sock in idle + [slow]:
            sock.close()
        for client in keepalive:
            client.close()


def over_capacity(client):
    """Asserts `client` (a connection beyond the limit) got 503 over_capacity, or no answer, and was closed."""
    try:
        answer = client.read_response(timeout=10)
    except (EOFError, OSError):
        answer = None
    if answer is not None:
        assert answer.status == 503, answer
        assert answer.header("Content-Type", "").startswith("application/problem+json")
        assert answer.json()["code"] == "over_capacity"
        assert int(answer.header("Retry-After")) > 0
    assert client.wait_closed(5), "a connection beyond the limit stayed open"


def test_connections_beyond_the_limit_get_503_and_established_ones_are_still_served(limited, tokens):
    port = limited["port"]
    auth = [("Authorization", f"Bearer {tokens.fresh()}")]
    established = RawClient(port)
    assert established.exchange(request("GET", "/api/contracts/established", auth)).status == 200
    held = []
    try:
        # With `established`, exactly the limit. Each is answered once, so Gatehouse has counted
        # it before the next connection opens (accepts are spread over event loops).
        for _ in range(LIMIT - 1):
            client = RawClient(port)
            held.append(client)
            answer = client.exchange(request("GET", "/healthz"))
            assert answer is not None and answer.status == 200, f"connection {len(held) + 1} of {LIMIT}: {answer}"
        extra = RawClient(port)
        over_capacity(extra)
        extra.close()

        # Established connections are still served, on both relay paths and off the relay.
        for target in ("/api/contracts/established", "/api/contracts/again", "/healthz"):
            answer = established.exchange(request("GET", target, auth if target != "/healthz" else []))
            assert answer is not None and answer.status == 200, (target, answer)
        answer = held[0].exchange(request("GET", "/api/contracts/held", auth))
        assert answer is not None and answer.status == 200, answer
        # No connection within the limit was closed to make room.
        selector = selectors.DefaultSelector()
        for client in held[1:]:
            selector.register(client.sock, selectors.EVENT_READ)
        disturbed = selector.select(0)  # a poll: nothing is owed to these connections
        selector.close()
        assert disturbed == [], f"{len(disturbed)} established connections were closed or written to"

        # Once some close, a new connection is accepted (Gatehouse sees the closes as they come).
        for client in held[-10:]:
            client.close()
        del held[-10:]
        deadline = time.monotonic() + 10
        for _ in range(50):
            with RawClient(port) as client:
                client.send(request("GET", "/healthz"))
                try:
                    answer = client.read_response(timeout=5)
                except (EOFError, OSError):
                    answer = None
                if answer is not None and answer.status == 200:
                    break
                client.wait_closed(5)
            assert time.monotonic() < deadline, "no new connection was accepted after others closed"
        else:
            pytest.fail("no new connection was accepted after others closed")
    finally:
        established.close()
        for client in held:
            client.close()
