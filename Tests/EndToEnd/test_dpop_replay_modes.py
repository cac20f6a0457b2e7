"""DPoP replay protection in each mode (`dpop.replay_protection`), from outside: a proof is
accepted at most once, by any instance, across restarts, within its lifetime.

- `store` (the default): every proof id is written to the store before the request goes on
  (its other cases, replays to the same instance, to another one and after a restart, are in
  test_dpop.py); here, a proof raced against itself.
- `instance_nonce`: every proof carries a nonce of the instance it reaches, issued in this life of
  that process; memory alone answers. Replayed to the same instance (both relay paths), to another
  instance on the same PostgreSQL, after a restart and a reload, raced against itself; with another
  instance's nonce, a forged one, one whose epoch rolled over; and a client that follows
  `use_dpop_nonce` behind a round-robin balancer of two instances.

Proofs are made with PyJWT + cryptography (sandbox/dpop.py), never with Gatehouse's code; what
reached the backend is read from the backend's own request log."""

import os
import signal
import threading
import time

import pytest
import requests

from sandbox.balancer import RoundRobinBalancer
from sandbox.dpop import Key
from sandbox.gatelog import served_by
from sandbox.nativeapp import APP_REDIRECT, App
from processes import with_suite_limits
from sandbox.secretsrecord import stop
from trusted import postgres_store, trusted_gatehouse

CLIENT = "com.example.dpop"
CLIENTS = f"""
  - client_id: {CLIENT}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]
    dpop: required"""
ROUTES = """
  - prefix: /api/dpop
    backend: {backend}/dpop
    methods: [GET, POST]
    upstream: legacy
    authorization: passthrough"""
INSTANCE = "dpop:\n  replay_protection: instance_nonce"
PATH = "/api/dpop/x"


class BoundApp:
    """An app holding a DPoP key and a bound token, following `use_dpop_nonce` as RFC 9449 §8
    asks (once per request) and taking the newest `DPoP-Nonce` of every answer (§8.2). `public`:
    the URL its proofs name (`server.public_base_url`); `via`: where it sends them."""

    def __init__(self, public, via=None, key=None, session=None):
        self.public, self.via = public, via or public
        self.key = key or Key()
        self.nonce = None
        self.token = None
        self.retries = 0
        self.http = session or requests.Session()

    def _send(self, method, path, headers, data=None, url=None):
        for attempt in range(2):
            proof = self.key.proof(method, self.public + path, access_token=headers.get("_token"), nonce=self.nonce)
            sent = {k: v for k, v in headers.items() if k != "_token"}
            answer = self.http.request(method, (url or self.via) + path, headers={**sent, "DPoP": proof}, data=data, timeout=10)
            if answer.headers.get("DPoP-Nonce"):
                self.nonce = answer.headers["DPoP-Nonce"]
            use_nonce = 'error="use_dpop_nonce"' in answer.headers.get("WWW-Authenticate", "") or (
                answer.status_code == 400 and answer.headers.get("content-type", "").startswith("application/json")
                and answer.json().get("error") == "use_dpop_nonce")
            if not use_nonce or attempt:
                return answer, proof
            self.retries += 1
        raise AssertionError("unreachable")

    def sign_in(self, gatehouse, seen):
        app = App(gatehouse, seen, client_id=CLIENT)
        code = app.sign_in()["code"]
        answer, _ = self._send("POST", "/oauth/token", {}, data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": APP_REDIRECT, "client_id": CLIENT,
            "code_verifier": app.verifier}, url=gatehouse["url"])
        assert answer.status_code == 200, answer.text
        self.token = answer.json()["access_token"]
        assert self.token.startswith("ghd_")
        return self

    def get(self, path=PATH, url=None):
        """(answer, the proof it finally carried)."""
        return self._send("GET", path, {"Authorization": f"DPoP {self.token}", "_token": self.token}, url=url)


def send(url, token, proof, path=PATH):
    return requests.get(url + path, headers={"Authorization": f"DPoP {token}", "DPoP": proof}, timeout=10)


def challenge(answer):
    return answer.headers.get("WWW-Authenticate", "")


@pytest.fixture(scope="module")
def instance_gatehouse(workdir, seen):
    with trusted_gatehouse(workdir, seen, "dpop-instance", CLIENTS, ROUTES, INSTANCE) as running:
        yield running


def warm(app):
    """Two calls: the first fills the caches the fast path reads; the second takes it."""
    assert app.get()[0].status_code == 200
    answer, _ = app.get()
    assert answer.status_code == 200, answer.text
    return answer


def test_every_proof_needs_this_instances_nonce_and_a_replay_is_refused_on_both_paths(instance_gatehouse, seen):
    gatehouse = instance_gatehouse
    app = BoundApp(gatehouse["url"]).sign_in(gatehouse, seen)
    assert app.retries == 1, "the token request was asked for a nonce first"
    mark = gatehouse["backend"].mark()
    first, proof = app.get()
    assert first.status_code == 200 and served_by(gatehouse, first) == "general"
    replayed = send(gatehouse["url"], app.token, proof)
    assert replayed.status_code == 401 and "used before" in replayed.json()["detail"], replayed.text
    assert len(gatehouse["backend"].request_lines_since(mark)) == 1
    # The fast path: memory alone answers, the replay never reaches the backend.
    assert served_by(gatehouse, warm(app)) == "fast"
    mark = gatehouse["backend"].mark()
    fast, proof = app.get()
    assert fast.status_code == 200 and served_by(gatehouse, fast) == "fast"
    replayed = send(gatehouse["url"], app.token, proof)
    assert replayed.status_code == 401 and 'error="invalid_dpop_proof"' in challenge(replayed), replayed.text
    assert len(gatehouse["backend"].request_lines_since(mark)) == 1
    # Without a nonce, with a forged one, with a well-formed one of the right epoch under another key.
    for nonce in [None, "A" * 32, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"]:
        refused = send(gatehouse["url"], app.token, app.key.proof("GET", gatehouse["url"] + PATH, access_token=app.token, nonce=nonce))
        assert refused.status_code == 401 and 'error="use_dpop_nonce"' in challenge(refused), (nonce, refused.text)
        assert refused.headers.get("DPoP-Nonce")
    assert len(gatehouse["backend"].request_lines_since(mark)) == 1


@pytest.mark.parametrize("mode", ["store", "instance_nonce"])
def test_a_proof_raced_against_itself_is_accepted_once(workdir, seen, mode):
    """Sixteen copies of one proof, released together behind a barrier, on a warm token (both
    relay paths take part): one answer 200, the rest 401, one request at the backend."""
    with trusted_gatehouse(workdir, seen, f"dpop-race-{mode}", CLIENTS, ROUTES, f"dpop:\n  replay_protection: {mode}") as gatehouse:
        app = BoundApp(gatehouse["url"]).sign_in(gatehouse, seen)
        warm(app)
        proof = app.key.proof("GET", gatehouse["url"] + PATH, access_token=app.token, nonce=app.nonce)
        mark = gatehouse["backend"].mark()
        barrier, statuses = threading.Barrier(16), []

        def one():
            session = requests.Session()
            session.get(gatehouse["url"] + "/health", timeout=10)  # connected before the barrier
            barrier.wait()
            statuses.append(session.get(gatehouse["url"] + PATH, timeout=10,
                                        headers={"Authorization": f"DPoP {app.token}", "DPoP": proof}).status_code)

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(statuses) == [200] + [401] * 15, statuses
        assert len(gatehouse["backend"].request_lines_since(mark)) == 1


def test_after_a_restart_a_proof_meets_a_nonce_the_instance_never_gave(workdir, seen):
    with trusted_gatehouse(workdir, seen, "dpop-instance-restart", CLIENTS, ROUTES, INSTANCE) as gatehouse:
        app = BoundApp(gatehouse["url"]).sign_in(gatehouse, seen)
        warm(app)
        answer, proof = app.get()
        assert answer.status_code == 200 and served_by(gatehouse, answer) == "fast"
        stop(gatehouse["process"])
        with gatehouse["relaunch"]("again") as again:
            mark = gatehouse["backend"].mark()
            replayed = send(gatehouse["url"], app.token, proof)
            assert replayed.status_code == 401 and 'error="use_dpop_nonce"' in challenge(replayed), replayed.text
            assert gatehouse["backend"].request_lines_since(mark) == []
            # The app follows the new nonce and goes on: the session is in the store.
            retries = app.retries
            assert app.get()[0].status_code == 200 and app.retries == retries + 1
            assert served_by(again, warm(app)) == "fast"


def test_an_aged_nonce_is_answered_with_the_next_and_refused_two_epochs_on(workdir, seen):
    """Epochs of 2 s: a nonce stays good in the next epoch (the general path relays it and
    announces the current nonce), and is refused once that epoch is over."""
    with trusted_gatehouse(workdir, seen, "dpop-instance-epochs", CLIENTS, ROUTES, INSTANCE + "\n  nonce_epoch: 2s") as gatehouse:
        app = BoundApp(gatehouse["url"]).sign_in(gatehouse, seen)
        first, _ = app.get()
        assert first.status_code == 200
        old = app.nonce
        # Wait for the epoch to roll over, as the answers tell (each carries the current nonce).
        deadline = time.monotonic() + 10
        while app.nonce == old:
            assert time.monotonic() < deadline, "the nonce never changed"
            probe = send(gatehouse["url"], app.token, app.key.proof("GET", gatehouse["url"] + PATH, access_token=app.token, nonce=old))
            assert probe.status_code == 200, probe.text
            app.nonce = probe.headers.get("DPoP-Nonce", old)
            time.sleep(0.05)  # polling the clock's epoch, at about 20 requests a second
        newer = app.nonce
        # Once the epoch after `old`'s is over too, `old` is refused with the current nonce.
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "the old nonce was never refused"
            answer = send(gatehouse["url"], app.token, app.key.proof("GET", gatehouse["url"] + PATH, access_token=app.token, nonce=old))
            if answer.status_code == 401:
                assert 'error="use_dpop_nonce"' in challenge(answer) and answer.headers["DPoP-Nonce"] not in (old,)
                break
            assert answer.status_code == 200 and answer.headers["DPoP-Nonce"] != old
            time.sleep(0.05)
        # The nonce the answers gave meanwhile works.
        app.nonce = answer.headers["DPoP-Nonce"]
        assert app.get()[0].status_code == 200 and newer != old


def test_a_reload_keeps_the_nonces_and_the_proofs_spent_under_them(workdir, seen):
    """SIGHUP with a route added: the nonce the app holds stays good (the process and its key are
    the same), and a proof spent before the reload is still refused after it, on both paths."""
    with trusted_gatehouse(workdir, seen, "dpop-instance-reload", CLIENTS, ROUTES, INSTANCE) as gatehouse:
        app = BoundApp(gatehouse["url"]).sign_in(gatehouse, seen)
        general, general_proof = app.get()
        fast = warm(app)
        assert served_by(gatehouse, fast) == "fast"
        _, fast_proof = app.get()
        mark = gatehouse["lines"].mark()
        extra = "\n  - prefix: /api/more\n    backend: " + gatehouse["backend"].url + "/more\n    methods: [GET]\n    upstream: legacy"
        text = gatehouse["text"].replace("    authorization: passthrough", "    authorization: passthrough" + extra, 1)
        assert text != gatehouse["text"]
        gatehouse["config"].write_text(with_suite_limits(text))
        os.kill(gatehouse["process"].pid, signal.SIGHUP)
        gatehouse["lines"].wait_for(r"configuration reloaded", timeout=15, since=mark)
        before = gatehouse["backend"].mark()
        for proof in (general_proof, fast_proof):
            replayed = send(gatehouse["url"], app.token, proof)
            assert replayed.status_code == 401 and "used before" in replayed.json()["detail"], replayed.text
        assert gatehouse["backend"].request_lines_since(before) == []
        retries = app.retries
        assert app.get()[0].status_code == 200 and app.retries == retries, "the nonce held before the reload still works"
        assert general.status_code == 200


@pytest.fixture(scope="module")
def two_instances(workdir, seen):
    """Two instances with instance nonces on one PostgreSQL database, one public URL."""
    store = postgres_store("dpopnonce")
    with trusted_gatehouse(workdir, seen, "dpop-instance-shared", CLIENTS, ROUTES, INSTANCE, store=store, replicas=2) as running:
        yield running


def test_a_proof_used_on_one_instance_is_refused_by_another(two_instances, seen):
    gatehouse, other = two_instances, two_instances["replicas"][0]
    app = BoundApp(gatehouse["url"]).sign_in(gatehouse, seen)
    for path in ("general", "fast"):
        answer, proof = app.get()
        assert answer.status_code == 200 and served_by(gatehouse, answer) == path
        mark = gatehouse["backend"].mark()
        replayed = send(other["url"], app.token, proof)
        assert replayed.status_code == 401 and 'error="use_dpop_nonce"' in challenge(replayed), replayed.text
        assert gatehouse["backend"].request_lines_since(mark) == []
    # A fresh proof with the first instance's nonce: the other instance does not take it either.
    fresh = send(other["url"], app.token, app.key.proof("GET", gatehouse["url"] + PATH, access_token=app.token, nonce=app.nonce))
    assert fresh.status_code == 401 and 'error="use_dpop_nonce"' in challenge(fresh)
    # With the other instance's own nonce it does: the session is shared, the nonce is not.
    theirs = BoundApp(gatehouse["url"], via=other["url"], key=app.key)
    theirs.token, theirs.nonce = app.token, fresh.headers["DPoP-Nonce"]
    answer, proof = theirs.get()
    assert answer.status_code == 200 and theirs.retries == 0
    assert send(gatehouse["url"], app.token, proof).status_code == 401


def test_behind_a_round_robin_balancer_a_client_that_keeps_its_connection_completes_every_request(two_instances, seen):
    """A TCP balancer hands each new connection to the next instance. Apps keep their
    connection (as URLSession and OkHttp do) and now and then open a new one: every request
    completes, at the price of one `use_dpop_nonce` retry when a new connection lands elsewhere."""
    gatehouse, other = two_instances, two_instances["replicas"][0]
    backends = [("127.0.0.1", int(gatehouse["url"].rsplit(":", 1)[1])), ("127.0.0.1", int(other["url"].rsplit(":", 1)[1]))]
    with RoundRobinBalancer(backends) as balancer:
        apps = [BoundApp(gatehouse["url"], via=balancer.url).sign_in(gatehouse, seen) for _ in range(3)]
        statuses = []
        for turn in range(30):
            for app in apps:
                if turn % 10 == 9:  # a new connection, as after the app was in the background
                    app.http.close()
                    app.http = requests.Session()
                statuses.append(app.get()[0].status_code)
        assert statuses == [200] * 90
        assert all(count > 0 for count in balancer.connections), balancer.connections
        retries = sum(app.retries for app in apps)
        # At most one retry per new connection (3 sign-ins and 3 × 3 reconnections, and the first calls).
        assert retries <= 3 + 3 + 9, retries


def test_a_balancer_that_spreads_single_requests_costs_a_retry_each_and_a_one_retry_client_fails(two_instances, seen):
    """The price, measured: with a connection per request, a round robin sends each request to the
    other instance than the last answer's nonce came from: the app's one retry lands on the
    other instance again, and no request completes. Such a deployment routes by token (hash of
    `Authorization`) or uses `replay_protection: store` (docs/instances.md)."""
    gatehouse, other = two_instances, two_instances["replicas"][0]
    backends = [("127.0.0.1", int(gatehouse["url"].rsplit(":", 1)[1])), ("127.0.0.1", int(other["url"].rsplit(":", 1)[1]))]
    app = BoundApp(gatehouse["url"]).sign_in(gatehouse, seen)
    assert app.get()[0].status_code == 200
    with RoundRobinBalancer(backends) as balancer:
        # `requests.request`: a new connection for each request, the retry included.
        spread = BoundApp(gatehouse["url"], via=balancer.url, key=app.key, session=requests)
        spread.token, spread.nonce = app.token, app.nonce
        statuses = [spread.get()[0].status_code for _ in range(10)]
        assert statuses.count(200) <= 1, statuses
        assert balancer.connections[0] >= 9 and balancer.connections[1] >= 9
