"""Bounded refresh skew for sealed sessions: the effective skew is
min(`sessions.upstream_refresh_skew` (60 s by default), the token's lifetime / 2), so a freshly
refreshed upstream access token is never due at once.

Before this bound, a 60-second upstream token with the default 60-second skew was due the moment
it was issued, and nearly every relayed request refreshed it (300 relayed calls made 26 refresh
grants). Here a django-oauth-toolkit of this module's own issues 60-second, then 10-second access
tokens; a Gatehouse of its own (SQLite, default skew) relays a sealed session's requests under
continuous load, and counting proxies in front of the token and introspection endpoints count
the refresh grants and identity calls that reach the upstream.
"""

import threading
import time
from collections import Counter
from contextlib import contextmanager

import pytest
import requests

from sandbox.nativeapp import App, free_port
from processes import run_gatehouse, run_upstream
from sandbox.gatehouse import server_and_store
from sandbox.tokenproxy import CountingTokenProxy

#: What each test measured, printed as one table at the end of the module.
MEASURED = []


@contextmanager
def sealed_gatehouse(workdir, relay_doubles, gatehouse, seen, lifetime):
    port = free_port()
    name = f"skew-{lifetime}s"
    with run_upstream(workdir, f"upstream-{name}", seen, [f"http://127.0.0.1:{port}/oauth/callback"],
                      access_token_expire_seconds=lifetime) as up:
        tokens = CountingTokenProxy(up["url"] + "/o/token/", seen)
        identity = CountingTokenProxy(up["url"] + "/o/introspect/", seen)
        config = server_and_store(port, f"{workdir}/{name}.sqlite") + f"""
upstreams:
  - name: legacy
    authorization_endpoint: {up["url"]}/o/authorize/
    token_endpoint: {tokens.url}
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]
    identity:
      kind: introspection
      url: {identity.url}
clients:
  - client_id: com.example.sealed
    upstream: legacy
    redirect_uris: ["com.example.app:/oauth2redirect"]
routes:
  - prefix: /api/skew
    backend: {relay_doubles["backend"].url}/skew
    upstream: legacy
    authorization: passthrough
sessions:
  encryption_keys_file: {workdir / "session-keys"}
"""
        try:
            with run_gatehouse(workdir, name, config, up["env"]) as process:
                yield {**process, "url": f"http://127.0.0.1:{port}", "tokens": tokens, "identity": identity, "lifetime": lifetime}
        finally:
            tokens.stop()
            identity.stop()


@pytest.fixture(scope="module")
def sixty_second_tokens(workdir, relay_doubles, gatehouse, seen):
    with sealed_gatehouse(workdir, relay_doubles, gatehouse, seen, 60) as instance:
        yield instance


@pytest.fixture(scope="module")
def ten_second_tokens(workdir, relay_doubles, gatehouse, seen):
    with sealed_gatehouse(workdir, relay_doubles, gatehouse, seen, 10) as instance:
        yield instance


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if MEASURED:
        print("\n\n| upstream token lifetime | load | relayed calls | non-200 | refresh grants | identity calls "
              "| refreshes at (s after sign-in) |\n|---:|---:|---:|---:|---:|---:|---|")
        for row in MEASURED:
            print("| {lifetime} s | {duration:.1f} s | {calls} | {failed} | {refreshes} | {identity} | {at} |".format(**row))


def load(instance, seen, duration, threads=4):
    """Signs in (sealed), then relays continuously from `threads` threads for `duration`
    seconds. Returns what was measured."""
    app = App(instance, seen, client_id="com.example.sealed")
    answer = app.redeem(app.sign_in()["code"])
    assert answer.status_code == 200, answer.text
    signed_in = time.monotonic()
    access = answer.json()["access_token"]
    assert access.startswith("gha_")
    tokens, identity = instance["tokens"], instance["identity"]
    before_tokens, before_identity = tokens.counts(), identity.counts()
    events_before = len(tokens.refresh_events)
    barrier = threading.Barrier(threads)
    statuses = [Counter() for _ in range(threads)]
    upstream_tokens = [set() for _ in range(threads)]

    def run(index):
        session = requests.Session()
        barrier.wait(timeout=30)
        end = time.monotonic() + duration
        while time.monotonic() < end:
            try:
                response = session.get(instance["url"] + "/api/skew/x", headers={"Authorization": f"Bearer {access}"}, timeout=30)
            except requests.RequestException as error:
                statuses[index][type(error).__name__] += 1
                continue
            statuses[index][response.status_code] += 1
            if response.status_code == 200:
                upstream_tokens[index].add(response.json()["headers"]["authorization"].removeprefix("Bearer "))

    workers = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(duration + 120)
    elapsed = time.monotonic() - started
    total = sum(statuses, Counter())
    for values in upstream_tokens:
        seen.add(*values, kind="upstream access token of a sealed session")
    refresh_times = [event["at"] - signed_in for event in tokens.refresh_events[events_before:]]
    measured = {
        "lifetime": instance["lifetime"], "duration": elapsed, "calls": sum(total.values()),
        "failed": sum(count for status, count in total.items() if status != 200), "statuses": dict(total),
        "refreshes": tokens.counts()["refreshes"] - before_tokens["refreshes"],
        "succeeded": tokens.counts()["succeeded"] - before_tokens["succeeded"],
        "identity": identity.counts()["calls"] - before_identity["calls"],
        "refresh_times": refresh_times, "at": (", ".join(f"{t:.1f}" for t in refresh_times) if len(refresh_times) <= 8 else
               ", ".join(f"{t:.1f}" for t in refresh_times[:4]) + f", … ({len(refresh_times)} in all)") or "-",
        "upstream_tokens": len(set().union(*upstream_tokens)),
    }
    MEASURED.append(measured)
    print(f"\n{measured}")
    return measured


def test_a_sixty_second_upstream_token_is_not_refreshed_in_its_first_half(sixty_second_tokens, seen):
    measured = load(sixty_second_tokens, seen, duration=10)
    assert measured["statuses"] == {200: measured["calls"]}, measured["statuses"]
    assert measured["calls"] >= 300, measured
    # Not due before 30 s (min(60 s, 60 s / 2)): ten seconds of load refresh nothing.
    assert measured["refreshes"] == 0, measured
    assert measured["upstream_tokens"] == 1
    assert measured["identity"] <= 1  # the one upstream token is resolved once, then cached


def test_a_ten_second_upstream_token_is_refreshed_once_per_half_lifetime(ten_second_tokens, seen):
    measured = load(ten_second_tokens, seen, duration=16)
    assert measured["statuses"] == {200: measured["calls"]}, measured["statuses"]
    assert measured["calls"] >= 300, measured
    # Due 5 s (10 s / 2) after each issue: about three refreshes in 16 s, never back to back.
    assert 2 <= measured["refreshes"] <= 4, measured
    assert measured["succeeded"] == measured["refreshes"], measured
    times = measured["refresh_times"]
    assert times[0] >= 4.0, measured  # the token issued at sign-in was not due at once
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    assert all(gap >= 4.0 for gap in gaps), gaps
