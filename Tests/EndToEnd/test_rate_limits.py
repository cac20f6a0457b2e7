"""Rate limits (issue 11, item 4), against Gatehouse processes of their own (each starts in a
fraction of a second), each with the one limit its tests are about and a metrics listener.

- `/oauth/*` per client_id: a burst over the limit gets 429 + Retry-After + the OAuth JSON
  error (the browser's /oauth/authorize an HTML page); another client_id is unaffected.
- `/oauth/*` per client address: X-Forwarded-For / Forwarded from a trusted proxy (loopback)
  names the client (two forwarded addresses, two buckets); from an untrusted peer they are
  ignored (every variation shares the peer's bucket).
- The relay per subject: 429 problem+json on the fast path (cached GET) and the general path
  (POST), the backend never reached past the burst; another subject unaffected.
- Identity look-ups per client address: 300 random junk bearer tokens make at most `burst`
  identity calls, the rest get 429, and a good cached token is served meanwhile.
- Identity concurrency: toward a slow identity service, never more calls in flight than the
  cap; the excess gets 503 + Retry-After: 1 at once.
- An upstream answering 429 + Retry-After: the app gets 503 + Retry-After and the upstream no
  further call before the deadline (counted at a token-endpoint double), then calls again.

Each refusal is also counted in gatehouse_rate_limited_total{limit=…} (the instance's /metrics).
"""

import math
import re
import secrets
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sandbox.gatelog import served_by
from sandbox.nativeapp import free_port
from operations import (IdentityDouble, identity, TokenEndpointDouble, client_yaml, gateway, gateway_config, metric_sum,
                        parse_exposition, poll, route_yaml, scrape, upstream_yaml)

def limits_section(trusted=None, metrics_port=None, **limits):
    """`rate_limits:` (and an `observability.metrics.listen` when metrics_port) as YAML."""
    lines = ["rate_limits:"] if trusted is not None or limits else []
    if trusted is not None:
        lines.append(f"  trusted_proxies: [{', '.join(trusted)}]")
    for key, value in limits.items():
        if isinstance(value, dict):
            lines.append(f"  {key}: {{per_second: {value['per_second']}, burst: {value['burst']}}}")
        else:
            lines.append(f"  {key}: {value}")
    if metrics_port:
        lines += ["observability:", "  metrics:", f"    listen: 127.0.0.1:{metrics_port}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def limited(workdir, upstream, relay_doubles, seen, identity):
    """`limited(name, limits, identity_double=…, upstreams=…, clients=…)`: a Gatehouse with the
    rate limits `limits` (limits_section's keywords) and a metrics listener, started once per
    module under `name`; returns its dict with `metrics_url`."""
    import contextlib
    stack = contextlib.ExitStack()
    started = {}

    def start(name, limits, identity_double=None, upstreams="", clients="", routes=None):
        if name in started:
            return started[name]
        port, metrics_port = free_port(), free_port()
        double = identity_double or identity
        backend = relay_doubles["backend"].url
        config = gateway_config(port, workdir, f"ratelimit-{name}", upstream["url"], double.url_for_config, backend, seen,
                                sections=limits_section(metrics_port=metrics_port, **limits), upstreams=upstreams,
                                clients=clients + client_yaml("com.example.other", "legacy"),
                                routes=routes if routes is not None else route_yaml("/api/limited", backend + "/limited", "legacy"))
        instance = stack.enter_context(gateway(workdir, f"ratelimit-{name}", config, upstream["env"]))
        instance["metrics_url"] = f"http://127.0.0.1:{metrics_port}/metrics"
        started[name] = instance
        return instance

    with stack:
        yield start


def token_request(base, client_id, headers=None):
    """A token request Gatehouse refuses by itself (an unknown code and state): 400 unless limited."""
    return requests.post(base + "/oauth/token", headers=headers or {}, timeout=10, data={
        "grant_type": "authorization_code", "client_id": client_id, "code": "unknown-" + secrets.token_hex(4),
        "state": "unknown-" + secrets.token_hex(4), "redirect_uri": "com.example.app:/oauth2redirect",
        "code_verifier": "v" * 43})


def retry_after(answer, at_most):
    value = answer.headers.get("Retry-After")
    assert value is not None and value.isdigit(), f"Retry-After {value!r}"
    assert 1 <= int(value) <= at_most, f"Retry-After {value} not within 1..{at_most}"
    return int(value)


def assert_oauth_429(answer, at_most):
    assert answer.status_code == 429, (answer.status_code, answer.text[:300])
    assert answer.headers["Content-Type"].startswith("application/json")
    body = answer.json()
    assert body["error"] == "temporarily_unavailable", body
    seconds = retry_after(answer, at_most)
    assert f"retry after {seconds} s" in body.get("error_description", ""), body


def assert_problem(answer, status, slug, title, at_most):
    assert answer.status_code == status, (answer.status_code, answer.text[:300])
    assert answer.headers["Content-Type"].startswith("application/problem+json"), answer.headers["Content-Type"]
    body = answer.json()
    if slug:  # the contract's "…/rate-limited": Gatehouse's problem types end with their code
        assert re.search(slug.replace("-", "[-_]") + "$", body["type"]), body
    if title:
        assert body["title"] == title, body
    assert body["status"] == status
    return retry_after(answer, at_most)


def assert_counted(instance, limit):
    """gatehouse_rate_limited_total{limit=…} of `instance` counts the refusals."""
    def counted():
        samples = parse_exposition(scrape(instance["metrics_url"]))
        return metric_sum(samples, "gatehouse_rate_limited_total", limit=limit) >= 1
    poll(counted, 5, f'gatehouse_rate_limited_total{{limit="{limit}"}} counting the refusals')


# --------------------------------------------------------------------------- /oauth/* per client

def test_oauth_per_client_burst_gets_429_and_another_client_is_unaffected(limited):
    instance = limited("client", {"oauth_per_client": {"per_second": 0.2, "burst": 5}})
    base = instance["url"]
    statuses = [token_request(base, "com.example.relay").status_code for _ in range(5)]
    assert statuses == [400] * 5, statuses
    over = token_request(base, "com.example.relay")
    assert_oauth_429(over, at_most=5)
    assert_oauth_429(token_request(base, "com.example.relay"), at_most=5)
    # Another client_id has its own bucket.
    assert [token_request(base, "com.example.other").status_code for _ in range(5)] == [400] * 5
    # The browser's entry point: an HTML page, with Retry-After.
    page = requests.get(base + "/oauth/authorize", allow_redirects=False, timeout=10, headers={"Accept": "text/html"},
                        params={"response_type": "code", "client_id": "com.example.relay", "redirect_uri": "com.example.app:/oauth2redirect",
                                "state": "s" * 16, "code_challenge": "c" * 43, "code_challenge_method": "S256"})
    assert page.status_code == 429, page.status_code
    assert page.headers["Content-Type"].startswith("text/html")
    retry_after(page, at_most=5)
    assert_counted(instance, "oauth_client")


# --------------------------------------------------------------------------- /oauth/* per address

def test_oauth_per_address_counts_the_forwarded_address_from_a_trusted_proxy(limited):
    instance = limited("trusted", {"trusted": ["127.0.0.1", "'::1'"], "oauth_per_address": {"per_second": 0.2, "burst": 3}})
    base = instance["url"]

    def from_(address):
        return token_request(base, "com.example.relay", {"X-Forwarded-For": address})

    assert [from_("203.0.113.7").status_code for _ in range(3)] == [400] * 3
    assert_oauth_429(from_("203.0.113.7"), at_most=5)
    # Another forwarded address: a bucket of its own.
    assert [from_("203.0.113.8").status_code for _ in range(3)] == [400] * 3
    assert_oauth_429(from_("203.0.113.8"), at_most=5)
    # The rightmost address not trusted names the client.
    assert_oauth_429(from_("198.51.100.1, 203.0.113.7"), at_most=5)
    # Only X-Forwarded-For (forwarded_header's default) is read: a client's own Forwarded, which such
    # proxies pass through untouched, never chooses its bucket.
    assert_oauth_429(token_request(base, "com.example.relay", {"X-Forwarded-For": "203.0.113.7", "Forwarded": "for=198.51.100.50"}),
                     at_most=5)
    # A port some proxies write is not part of the address.
    assert_oauth_429(from_("203.0.113.7:51234"), at_most=5)
    # The router's form of the path is limited as the path: //oauth//token/ reaches /oauth/token.
    for doubled in ("//oauth/token", "/oauth//token", "/oauth/token/"):
        answer = requests.post(base + doubled, headers={"X-Forwarded-For": "203.0.113.7"}, timeout=10,
                               data={"grant_type": "authorization_code", "client_id": "com.example.relay", "code": "x"})
        assert_oauth_429(answer, at_most=5)
    # IPv6 addresses count by their /64: a client rotating within its /64 shares one bucket.
    assert [from_(f"2001:db8:1:2::{n}").status_code for n in (1, 2, 3)] == [400] * 3
    assert_oauth_429(from_("2001:db8:1:2::ffff"), at_most=5)
    assert from_("2001:db8:1:3::1").status_code == 400
    assert from_("198.51.100.2").status_code == 400
    # The proxy itself (no X-Forwarded-For; a lone Forwarded is not read) is yet another client.
    assert token_request(base, "com.example.relay", {"Forwarded": 'for="203.0.113.7"'}).status_code == 400
    assert token_request(base, "com.example.relay").status_code == 400
    assert_counted(instance, "oauth_address")


def test_forwarded_is_read_only_when_configured(limited):
    instance = limited("forwarded", {"trusted": ["127.0.0.1", "'::1'"], "forwarded_header": "forwarded",
                                     "oauth_per_address": {"per_second": 0.2, "burst": 2}})
    base = instance["url"]

    def from_(forwarded, forwarded_for=None):
        headers = {"Forwarded": forwarded}
        if forwarded_for:
            headers["X-Forwarded-For"] = forwarded_for
        return token_request(base, "com.example.relay", headers)

    assert [from_('for="[2001:db8::7]:4711";proto=https').status_code for _ in range(2)] == [400] * 2
    assert_oauth_429(from_("for=\"[2001:db8::8]\""), at_most=5)  # the same /64
    # Now X-Forwarded-For is the header not read.
    assert from_("for=192.0.2.60", forwarded_for="2001:db8::7").status_code == 400


def test_oauth_per_address_ignores_x_forwarded_for_from_an_untrusted_peer(limited):
    instance = limited("untrusted", {"trusted": ["10.0.0.0/8"], "oauth_per_address": {"per_second": 0.2, "burst": 3}})
    base = instance["url"]
    statuses = [token_request(base, "com.example.relay", {"X-Forwarded-For": f"203.0.113.{n}"}).status_code for n in (1, 2, 3)]
    assert statuses == [400] * 3
    assert_oauth_429(token_request(base, "com.example.relay", {"X-Forwarded-For": "203.0.113.4"}), at_most=5)
    assert_oauth_429(token_request(base, "com.example.relay", {"Forwarded": "for=198.51.100.9"}), at_most=5)
    assert_oauth_429(token_request(base, "com.example.relay"), at_most=5)


# --------------------------------------------------------------------------- relay per subject

def subject_token(identity, seen, login):
    token = f"{login}-" + secrets.token_urlsafe(32)
    seen.add(token, kind="relayed access token (rate-limit test)")
    identity.register(token, login)
    return token


def test_relay_per_subject_429_on_the_fast_and_the_general_path(limited, identity, seen, relay_doubles):
    instance = limited("relay", {"relay_per_subject": {"per_second": 0.2, "burst": 5}})
    base, backend = instance["url"], relay_doubles["backend"]
    carol, dave, erin = (subject_token(identity, seen, login) for login in ("carol", "dave", "erin"))

    with requests.Session() as session:
        mark = backend.mark()
        # carol: the first GET resolves her identity (general path), the next ones take the fast path.
        answers = [session.get(base + f"/api/limited/carol/{n}", headers={"Authorization": f"Bearer {carol}"}, timeout=10)
                   for n in range(5)]
        assert [a.status_code for a in answers] == [200] * 5
        assert [served_by(instance["lines"], a) for a in answers] == ["general"] + ["fast"] * 4
        over = session.get(base + "/api/limited/carol/over", headers={"Authorization": f"Bearer {carol}"}, timeout=10)
        assert_problem(over, 429, "rate-limited", "Too Many Requests", at_most=5)
        carol_lines = [target for _, target in backend.request_lines_since(mark) if b"/carol/" in target]
        assert len(carol_lines) == 5, "a request over the limit reached the backend"

        # dave: POSTs with a chunked body (a generator: always the general path).
        posts = [session.post(base + f"/api/limited/dave/{n}", data=iter([b"x" * 64]), headers={"Authorization": f"Bearer {dave}"},
                              timeout=10) for n in range(5)]
        assert [p.status_code for p in posts] == [200] * 5
        assert [served_by(instance["lines"], p) for p in posts] == ["general"] * 5
        over = session.post(base + "/api/limited/dave/over", data=iter([b"x" * 64]), headers={"Authorization": f"Bearer {dave}"},
                            timeout=10)
        assert_problem(over, 429, "rate-limited", "Too Many Requests", at_most=5)
        # carol's GETs are still refused, dave's GETs too (one bucket per subject, both paths).
        assert session.get(base + "/api/limited/dave/get", headers={"Authorization": f"Bearer {dave}"}, timeout=10).status_code == 429

        # erin is another subject.
        assert session.get(base + "/api/limited/erin/1", headers={"Authorization": f"Bearer {erin}"}, timeout=10).status_code == 200
    assert_counted(instance, "relay_subject")


# --------------------------------------------------------------------------- identity look-ups per address

def test_junk_tokens_make_at_most_burst_identity_calls_and_a_cached_token_still_works(limited, identity, seen):
    burst = 20
    instance = limited("lookups", {"identity_lookups_per_address": {"per_second": 0.01, "burst": burst}})
    base = instance["url"]
    good = subject_token(identity, seen, "frank")
    assert requests.get(base + "/api/limited/warm", headers={"Authorization": f"Bearer {good}"}, timeout=10).status_code == 200
    before = identity.snapshot()
    junk = ["junk-" + secrets.token_urlsafe(24) for _ in range(300)]
    seen.add(*junk, kind="junk bearer token (rate-limit test)")
    barrier = threading.Barrier(17)
    flood_over = threading.Event()
    good_statuses = Counter()

    def flood(chunk):
        barrier.wait(timeout=30)
        results = []
        with requests.Session() as session:
            for token in chunk:
                answer = session.get(base + "/api/limited/x", headers={"Authorization": f"Bearer {token}"}, timeout=30)
                results.append((answer.status_code, answer))
        return results

    def good_client():
        barrier.wait(timeout=30)
        with requests.Session() as session:
            while not flood_over.is_set():
                answer = session.get(base + "/api/limited/good", headers={"Authorization": f"Bearer {good}"}, timeout=30)
                good_statuses[answer.status_code] += 1

    watcher = threading.Thread(target=good_client, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(16) as pool:
        chunks = [junk[index::16] for index in range(16)]
        results = [item for chunk in pool.map(flood, chunks) for item in chunk]
    flood_over.set()
    watcher.join(30)

    after = identity.snapshot()
    identity_calls = after["calls"] - before["calls"]
    statuses = Counter(status for status, _ in results)
    # The warm-up used one look-up of the address's burst.
    assert 1 <= identity_calls <= burst - 1, (identity_calls, statuses)
    assert statuses[401] == identity_calls, statuses
    assert statuses[429] == 300 - identity_calls, statuses
    for status, answer in results:
        if status == 429:
            assert_problem(answer, 429, None, None, at_most=math.ceil(1 / 0.01))
    assert set(good_statuses) == {200} and sum(good_statuses.values()) >= 3, good_statuses
    assert_counted(instance, "identity_address")


# --------------------------------------------------------------------------- identity concurrency

@pytest.fixture(scope="module")
def slow_identity():
    double = IdentityDouble()
    yield double
    double.gate.set()
    double.stop()


def test_identity_concurrency_is_capped_and_the_excess_gets_503(limited, slow_identity, seen):
    cap, callers = 4, 12
    instance = limited("concurrency", {"identity_concurrency": cap}, identity_double=slow_identity)
    base = instance["url"]
    tokens = [subject_token(slow_identity, seen, f"user{n}") for n in range(callers)]
    slow_identity.gate.clear()
    barrier = threading.Barrier(callers)
    answers = [None] * callers
    answered = threading.Condition()

    def call(index):
        barrier.wait(timeout=30)
        answer = requests.get(base + f"/api/limited/{index}", headers={"Authorization": f"Bearer {tokens[index]}"}, timeout=30)
        with answered:
            answers[index] = answer
            answered.notify_all()

    threads = [threading.Thread(target=call, args=(index,), daemon=True) for index in range(callers)]
    for thread in threads:
        thread.start()
    try:
        slow_identity.wait_until(lambda s: s["waiting"] >= cap, 10, f"{cap} calls held at the identity service")
        # `cap` running and `cap` waiting in Gatehouse: the rest are refused at once, while the others are held.
        with answered:
            done = answered.wait_for(lambda: sum(a is not None for a in answers) >= callers - 2 * cap, 10)
        refused = [a for a in answers if a is not None]
        assert done, f"only {len(refused)} answers while the identity service holds {cap} calls"
        held = slow_identity.snapshot()
        assert held["in_flight"] == cap and held["max_in_flight"] == cap, held
    finally:
        slow_identity.gate.set()
        for thread in threads:
            thread.join(30)
    statuses = Counter(a.status_code for a in answers)
    assert statuses == Counter({200: 2 * cap, 503: callers - 2 * cap}), statuses
    for answer in answers:
        if answer.status_code == 503:
            assert answer.headers.get("Retry-After") == "1"
            assert answer.headers["Content-Type"].startswith("application/problem+json")
    final = slow_identity.snapshot()
    assert final["max_in_flight"] == cap and final["calls"] == 2 * cap, final
    assert_counted(instance, "identity_concurrency")


# --------------------------------------------------------------------------- upstream 429

@pytest.fixture(scope="module")
def busy_token_endpoint():
    double = TokenEndpointDouble(status=429, retry_after=2)
    yield double
    double.stop()


def test_an_upstream_429_backs_off_until_its_retry_after(limited, busy_token_endpoint, upstream, seen):
    endpoint = busy_token_endpoint
    instance = limited("upstream", {}, upstreams=upstream_yaml("busy", upstream["url"], token_endpoint=endpoint.token_url),
                       clients=client_yaml("com.example.busy", "busy"))
    base = instance["url"]

    def refresh():
        token = "busy-refresh-" + secrets.token_urlsafe(24)
        seen.add(token, kind="refresh token (upstream 429 test)")
        return requests.post(base + "/oauth/token", timeout=10,
                             data={"grant_type": "refresh_token", "refresh_token": token, "client_id": "com.example.busy"})

    first = refresh()
    assert first.status_code == 503, (first.status_code, first.text)
    assert first.json()["error"] == "temporarily_unavailable"
    retry_after(first, at_most=2)
    assert endpoint.count == 1
    first_call = endpoint.call_times[0]
    # Until the upstream's Retry-After has passed, nothing reaches it; the app is told when to come back.
    refusals = 0
    while time.monotonic() < first_call + 2 - 0.3:
        answer = refresh()
        assert answer.status_code == 503 and answer.json()["error"] == "temporarily_unavailable", answer.text
        retry_after(answer, at_most=2)
        assert endpoint.count == 1, "a call reached the upstream before its Retry-After"
        refusals += 1
        time.sleep(0.1)  # pacing the attempts, not synchronisation
    assert refusals >= 5
    # Then Gatehouse calls it again.
    poll(lambda: refresh() is not None and endpoint.count >= 2, 5, "a call to the upstream after its Retry-After", interval=0.1)
    assert endpoint.call_times[1] - first_call >= 2 - 0.05
    assert_counted(instance, "upstream_backoff")
