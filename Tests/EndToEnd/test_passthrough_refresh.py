"""Passthrough refresh that cannot race, and refreshes whose outcome is unknown.

An app with `token_exposure: passthrough` holds the upstream's own tokens. Gatehouse makes
exactly one upstream refresh for any number of concurrent refreshes of one upstream refresh
token, and answers every caller within `sessions.refresh_grace` with the same new pair; after
the window the old token is `invalid_grant`. Each passthrough token is bound to the app it was
issued to.

`upstreams[].refresh_token_policy`: with `single_use` (the default) a refresh that may have
reached the upstream (a read timeout) is never sent again: 503, and the next attempt works;
with `reusable` one that failed quickly (an HTTP 500) is retried twice. A refresh that waited
out the upstream's timeout is never repeated, whatever the policy: the app would wait three.

Gatehouse instances of this module's own (SQLite, in the session's workdir) talk to the real
django-oauth-toolkit through counting proxies (sandbox/tokenproxy.py), one per upstream,
so each test can count the refresh grants that reached the upstream.
"""

import secrets
import sqlite3
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sandbox.nativeapp import APP_REDIRECT, App, InAppBrowser, free_port, query
from processes import run_gatehouse
from sandbox.gatehouse import server_and_store
from sandbox.tokenproxy import CountingTokenProxy


def upstream_entry(name, up, proxy, timeout="5s", extra=""):
    return f"""
  - name: {name}
    authorization_endpoint: {up}/o/authorize/
    token_endpoint: {proxy.url}
    revocation_endpoint: {up}/o/revoke_token/
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]
    timeout: {timeout}{extra}
    identity:
      kind: introspection
      url: {up}/o/introspect/"""


def client_entry(client_id, upstream, exposure="passthrough"):
    return f"""
  - client_id: {client_id}
    upstream: {upstream}
    token_exposure: {exposure}
    redirect_uris: ["com.example.app:/oauth2redirect"]"""


@pytest.fixture(scope="module")
def passthrough(workdir, upstream, relay_doubles, gatehouse, seen):
    """Gatehouse with the default refresh grace (30 s): passthrough apps on `legacy`, on
    `stall` (single_use, timeout 1 s) and on `reusable` (timeout 1 s), a sealed app on `stall`
    with a relay route, each upstream behind its own counting proxy."""
    up = upstream["url"]
    proxies = {name: CountingTokenProxy(up + "/o/token/", seen) for name in ("legacy", "stall", "reusable")}
    port = free_port()
    upstreams = (upstream_entry("legacy", up, proxies["legacy"]) + upstream_entry("stall", up, proxies["stall"], "1s")
                 + upstream_entry("reusable", up, proxies["reusable"], "1s", extra="\n    refresh_token_policy: reusable"))
    clients = (client_entry("com.example.app", "legacy") + client_entry("com.example.other", "legacy")
               + client_entry("com.example.stall", "stall") + client_entry("com.example.stall-sealed", "stall", "sealed")
               + client_entry("com.example.reusable", "reusable"))
    config = server_and_store(port, f"{workdir}/passthrough.sqlite") + f"""
upstreams:{upstreams}
clients:{clients}
routes:
  - prefix: /api/stall
    backend: {relay_doubles["backend"].url}/stall
    upstream: stall
    authorization: passthrough
sessions:
  encryption_keys_file: {workdir / "session-keys"}
"""
    with run_gatehouse(workdir, "passthrough", config, upstream["env"]) as process:
        yield {**process, "url": f"http://127.0.0.1:{port}", "proxies": proxies, "database": workdir / "passthrough.sqlite"}
    for proxy in proxies.values():
        proxy.stop()


@pytest.fixture(scope="module")
def short_grace(workdir, upstream, gatehouse, seen):
    """Gatehouse with `sessions.refresh_grace: 1s`, one passthrough app behind its own proxy."""
    up = upstream["url"]
    proxy = CountingTokenProxy(up + "/o/token/", seen)
    port = free_port()
    config = server_and_store(port, f"{workdir}/passthrough-grace.sqlite") + f"""
upstreams:{upstream_entry("legacy", up, proxy)}
clients:{client_entry("com.example.app", "legacy")}
sessions:
  encryption_keys_file: {workdir / "session-keys"}
  refresh_grace: 1s
"""
    with run_gatehouse(workdir, "passthrough-grace", config, upstream["env"]) as process:
        yield {**process, "url": f"http://127.0.0.1:{port}", "proxy": proxy}
    proxy.stop()


def sign_in(instance, seen, client_id="com.example.app"):
    app = App(instance, seen, client_id=client_id)
    answer = app.redeem(app.sign_in()["code"])
    assert answer.status_code == 200, answer.text
    pair = answer.json()
    assert not pair["access_token"].startswith("gha_") and not pair["refresh_token"].startswith("ghr_")
    return app, pair


def pair_of(answer):
    body = answer.json()
    return body["access_token"], body["refresh_token"]


def introspect(upstream, token):
    return requests.post(upstream["url"] + "/o/introspect/", data={"token": token}, timeout=10,
                         auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"])).json()


def delta(after, before):
    return {key: after[key] - before[key] for key in after}


def assert_try_again_later(response):
    """A clean 503: the app is told to retry, never that its grant is dead."""
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) > 0


# --- A. one upstream refresh, one pair ---------------------------------------------------


def test_fifty_concurrent_refreshes_of_one_token_make_one_upstream_refresh_and_share_one_pair(passthrough, upstream, seen):
    app, pair = sign_in(passthrough, seen)
    proxy = passthrough["proxies"]["legacy"]
    before = proxy.counts()
    barrier = threading.Barrier(50)

    def refresh(_):
        barrier.wait(timeout=30)
        return app.refresh(pair["refresh_token"])

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(refresh, range(50)))
    statuses = Counter(answer.status_code for answer in answers)
    assert statuses == {200: 50}, (statuses, next((a.text for a in answers if a.status_code != 200), ""))
    pairs = {pair_of(answer) for answer in answers}
    assert len(pairs) == 1, f"{len(pairs)} different pairs"
    access, refresh_token = pairs.pop()
    assert refresh_token != pair["refresh_token"] and access != pair["access_token"]
    counted = delta(proxy.counts(), before)
    assert counted["refreshes"] == 1 and counted["succeeded"] == 1, counted
    # The pair is the upstream's own, as it answered it, and it is live there.
    assert proxy.pair_for_access_token(access)["refresh_token"] == refresh_token
    assert introspect(upstream, access)["active"] is True
    # The new refresh token works once more: one more upstream refresh, a new pair.
    again = app.refresh(refresh_token)
    assert again.status_code == 200, again.text
    assert pair_of(again)[1] not in (refresh_token, pair["refresh_token"])
    assert delta(proxy.counts(), before)["refreshes"] == 2


def test_a_replay_within_the_grace_window_gets_the_same_pair_without_an_upstream_call(passthrough, seen):
    app, pair = sign_in(passthrough, seen)
    proxy = passthrough["proxies"]["legacy"]
    before = proxy.counts()
    first = app.refresh(pair["refresh_token"])
    assert first.status_code == 200, first.text
    assert delta(proxy.counts(), before)["refreshes"] == 1
    replays = [app.refresh(pair["refresh_token"]) for _ in range(3)]  # later, one after the other
    assert [replay.status_code for replay in replays] == [200] * 3, replays[0].text
    assert {pair_of(replay) for replay in replays} == {pair_of(first)}
    assert delta(proxy.counts(), before)["refreshes"] == 1  # the upstream was not asked again


def test_a_replay_after_the_grace_window_is_invalid_grant_without_an_upstream_call(short_grace, seen):
    app, pair = sign_in(short_grace, seen)
    proxy = short_grace["proxy"]
    before = proxy.counts()
    first = app.refresh(pair["refresh_token"])
    assert first.status_code == 200, first.text
    rotated_by = time.monotonic()  # the rotation happened before this
    assert delta(proxy.counts(), before)["refreshes"] == 1
    # Wait for the configured 1 s window to pass (with room for a store that counts whole seconds).
    time.sleep(max(0.0, rotated_by + 2.0 - time.monotonic()))
    replay = app.refresh(pair["refresh_token"])
    assert replay.status_code == 400, replay.text
    assert replay.json()["error"] == "invalid_grant"
    assert "access_token" not in replay.json()
    assert delta(proxy.counts(), before)["refreshes"] == 1  # refused by Gatehouse, not by the upstream


def test_a_passthrough_token_is_refused_to_another_app(passthrough, seen):
    app, pair = sign_in(passthrough, seen)
    proxy = passthrough["proxies"]["legacy"]
    before = proxy.counts()
    stranger = app.token(grant_type="refresh_token", refresh_token=pair["refresh_token"], client_id="com.example.other")
    assert stranger.status_code == 400, stranger.text
    assert stranger.json()["error"] == "invalid_grant"
    assert delta(proxy.counts(), before)["refreshes"] == 0  # never shown to the upstream, so not spent
    # Nor may the other app revoke it (RFC 7009 §2.1): 200, and nothing revoked upstream.
    revoked = requests.post(passthrough["url"] + "/oauth/revoke", timeout=30,
                            data={"token": pair["refresh_token"], "client_id": "com.example.other"})
    assert revoked.status_code == 200
    own = app.refresh(pair["refresh_token"])
    assert own.status_code == 200, own.text
    # A token issued by a refresh is bound to the app too.
    _, successor = pair_of(own)
    stranger = app.token(grant_type="refresh_token", refresh_token=successor, client_id="com.example.other")
    assert stranger.status_code == 400 and stranger.json()["error"] == "invalid_grant", stranger.text
    assert delta(proxy.counts(), before)["refreshes"] == 1
    assert app.refresh(successor).status_code == 200


# --- C. refresh_token_policy --------------------------------------------------------------


def test_single_use_refresh_that_timed_out_is_not_retried_answers_503_and_the_next_attempt_works(passthrough, seen):
    app, pair = sign_in(passthrough, seen, "com.example.stall")
    proxy = passthrough["proxies"]["stall"]
    before = proxy.counts()
    # The upstream reads the request and never answers (timeout: 1s).
    stalled, counted = proxy.while_holding(1, lambda: app.refresh(pair["refresh_token"]))
    assert_try_again_later(stalled)
    assert stalled.json()["error"] == "temporarily_unavailable"
    assert stalled.headers.get("Cache-Control") == "no-store"
    assert counted == {"calls": 1, "refreshes": 1, "forwarded": 0, "succeeded": 0, "held": 1}, counted
    # The refresh token was never spent (the held request never reached the real upstream): it still works.
    after = app.refresh(pair["refresh_token"])
    assert after.status_code == 200, after.text
    assert pair_of(after)[1] != pair["refresh_token"]
    counted = delta(proxy.counts(), before)
    assert counted["refreshes"] == 2 and counted["forwarded"] == 1 and counted["succeeded"] == 1, counted


def test_reusable_refresh_is_retried_after_quick_failures_but_not_after_a_timeout(passthrough, seen):
    app, pair = sign_in(passthrough, seen, "com.example.reusable")
    proxy = passthrough["proxies"]["reusable"]
    # A stall: the upstream's timeout (1 s) is waited out once, not three times.
    started = time.monotonic()
    stalled, counted = proxy.while_holding(3, lambda: app.refresh(pair["refresh_token"]))
    elapsed = time.monotonic() - started
    assert_try_again_later(stalled)
    assert stalled.json()["error"] == "temporarily_unavailable"
    assert counted["refreshes"] == 1 and counted["held"] == 1 and counted["forwarded"] == 0, counted
    assert elapsed < 2.5, f"the stalled refresh was answered after {elapsed:.2f} s (one timeout is 1 s)"
    # A quick failure whose outcome is unknown (HTTP 500) is retried twice: the token is reusable.
    before = proxy.counts()
    proxy.fault = (500, b'{"error": "server_error"}')
    try:
        failed = app.refresh(pair["refresh_token"])
    finally:
        proxy.fault = None
    assert_try_again_later(failed)
    counted = delta(proxy.counts(), before)
    assert counted["refreshes"] == 3 and counted["forwarded"] == 0, counted
    # Nothing was spent: the next attempt gets its pair.
    after = app.refresh(pair["refresh_token"])
    assert after.status_code == 200, after.text


def test_single_use_sealed_session_refresh_that_timed_out_answers_503_and_keeps_the_session(passthrough, seen):
    app, pair = sign_in_sealed(passthrough, seen)
    database = sqlite3.connect(passthrough["database"], timeout=10)
    try:
        # No relayed call before this: the instance has no view of the session yet.
        with database:
            database.execute("UPDATE sessions SET upstream_expires_at = 0 WHERE client_id = 'com.example.stall-sealed'")
        proxy = passthrough["proxies"]["stall"]
        before = proxy.counts()
        url = passthrough["url"] + "/api/stall/x"
        headers = {"Authorization": f"Bearer {pair['access_token']}"}
        stalled, counted = proxy.while_holding(1, lambda: requests.get(url, headers=headers, timeout=30))
        assert_try_again_later(stalled)
        assert stalled.headers["Content-Type"].startswith("application/problem+json")
        assert counted["refreshes"] == 1 and counted["held"] == 1 and counted["forwarded"] == 0, counted
        live = database.execute("SELECT count(*) FROM sessions WHERE client_id = 'com.example.stall-sealed' "
                                "AND revoked_at IS NULL").fetchone()[0]
        assert live == 1
        after = requests.get(url, headers=headers, timeout=30)
        assert after.status_code == 200, after.text
        seen.add(after.json()["headers"]["authorization"].removeprefix("Bearer "), kind="upstream access token of a sealed session")
        counted = delta(proxy.counts(), before)
        assert counted["refreshes"] == 2 and counted["succeeded"] == 1, counted
    finally:
        database.close()


def test_a_failed_refresh_does_not_bind_a_token_gatehouse_had_not_seen(passthrough, upstream, seen):
    """A refresh token Gatehouse never handed out (one the app got before Gatehouse stood in
    front of the upstream) is bound to the first app that refreshes it, but not by a refresh
    that failed: here its upstream stalls (503), and another app then refreshes it."""
    unseen = tokens_from_the_upstream_itself(upstream, seen)
    stall, legacy = passthrough["proxies"]["stall"], passthrough["proxies"]["legacy"]
    failed, _ = stall.while_holding(1, lambda: App(passthrough, seen, client_id="com.example.stall").refresh(unseen["refresh_token"]))
    assert_try_again_later(failed)
    before = legacy.counts()
    other = App(passthrough, seen, client_id="com.example.app").refresh(unseen["refresh_token"])
    assert other.status_code == 200, other.text
    assert delta(legacy.counts(), before)["succeeded"] == 1


def tokens_from_the_upstream_itself(upstream, seen):
    """A token response straight from the upstream (Gatehouse's client there, without Gatehouse)."""
    authorize = upstream["url"] + "/o/authorize/?" + requests.compat.urlencode({
        "response_type": "code", "client_id": "gatehouse-legacy", "redirect_uri": APP_REDIRECT,
        "state": secrets.token_urlsafe(16), "scope": "read write"})
    location = InAppBrowser(seen=seen).follow(authorize, APP_REDIRECT)
    assert isinstance(location, str), location
    answer = requests.post(upstream["url"] + "/o/token/", timeout=10, auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"]),
                           data={"grant_type": "authorization_code", "code": query(location)["code"], "redirect_uri": APP_REDIRECT})
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    seen.add(tokens["access_token"], tokens["refresh_token"], kind="upstream token (straight from the upstream)")
    return tokens


def sign_in_sealed(instance, seen):
    app = App(instance, seen, client_id="com.example.stall-sealed")
    answer = app.redeem(app.sign_in()["code"])
    assert answer.status_code == 200, answer.text
    pair = answer.json()
    assert pair["access_token"].startswith("gha_")
    return app, pair


def test_a_429_to_a_made_up_refresh_token_does_not_back_off_everyone(passthrough, seen):
    """The upstream answers 429 to a refresh of a token Gatehouse has no record of: such
    refreshes back off, and every app's real refreshes go on (one client's junk cannot put every
    user into a backoff)."""
    proxy = passthrough["proxies"]["legacy"]
    app, pair = sign_in(passthrough, seen)
    proxy.fault = (429, b'{"error": "slow_down"}')
    try:
        junk = App(passthrough, seen).refresh("made-up-" + secrets.token_urlsafe(24))
        assert junk.status_code == 503 and int(junk.headers["Retry-After"]) > 0, junk.text
    finally:
        proxy.fault = None
    refreshed = app.refresh(pair["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    # Another made-up token meets the backoff its kind started: refused at once, nothing sent.
    before = proxy.refreshes
    again = App(passthrough, seen).refresh("made-up-" + secrets.token_urlsafe(24))
    assert again.status_code == 503 and proxy.refreshes == before, again.text
