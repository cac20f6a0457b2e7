"""An upstream outage and its end, timed from outside.

The upstream (UpstreamDouble) is also the identity service the relay asks who a token belongs
to, at one address: Gatehouse reaches both through one connection pool. It listens on a fixed
loopback port; the test stops it (its listening socket closed: connections are refused, its
open connections cut) and starts it again on the same port.

During the outage a relayed call and a refresh each get one 503 with `Retry-After` (problem+json
on the relay, OAuth JSON on /oauth/token), sooner than the connect timeout: a refused connection
is an answer, not something to wait out, and no attempt is repeated after one that waited.
After it, the very first relayed call and the very first refresh succeed, at once: nothing of
the outage (a connection pool still backing off from its failed attempts) outlives it.
"""

import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sandbox.backends import EchoBackend
from sandbox.nativeapp import App, free_port
from operations import UpstreamDouble, gateway, gateway_config

#: Gatehouse's `upstream_connect_timeout` here: how long a connection attempt may take.
CONNECT_TIMEOUT = 3.0
#: An answer during the outage comes sooner than one connect timeout: the refusal is not waited
#: out (a pool that retries connections in the background holds requests for the whole connect
#: timeout, and a refresh retried after each would take three).
OUTAGE_ANSWER_WITHIN = CONNECT_TIMEOUT - 1.0
#: The first answers after the outage come well within one connect timeout (the double answers
#: in milliseconds): a pool still backing off from the outage's failed attempts would hold them,
#: or fail them at the connect timeout.
RECOVERED_ANSWER_WITHIN = CONNECT_TIMEOUT / 2
#: Relayed calls made at once during the outage: a few apps, not one.
CONCURRENT_CALLS = 8


@pytest.fixture(scope="module")
def outage(workdir, seen):
    """A Gatehouse whose upstream `legacy` (token endpoint and identity service) is an
    UpstreamDouble on a fixed port, relaying /api/ops to an echo backend."""
    upstream = UpstreamDouble(port=free_port())
    backend = EchoBackend()
    port = free_port()
    secret = secrets.token_urlsafe(24)
    seen.add(secret, kind="upstream client secret")
    config = gateway_config(port, workdir, "outage", upstream.url, upstream.url_for_config, backend.url, seen,
                            server_extra={"upstream_connect_timeout": f"{CONNECT_TIMEOUT:g}s"})
    env = dict(os.environ, UPSTREAM_SECRET_LEGACY=secret)
    try:
        with gateway(workdir, "outage", config, env) as instance:
            yield {"gatehouse": instance, "upstream": upstream, "backend": backend}
    finally:
        upstream.stop()
        backend.stop()


def timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def relayed_call(setup, seen):
    """A relayed GET with a token the identity service knows and Gatehouse has never seen (so
    the identity service is asked); (response, seconds)."""
    token = "outage-" + secrets.token_urlsafe(24)
    seen.add(token, kind="upstream access token (outage test)")
    setup["upstream"].register(token, "alice", bpid="1000123")
    url = setup["gatehouse"]["url"] + "/api/ops/contracts"
    return timed(lambda: requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30))


def refresh(setup, seen):
    """A passthrough refresh with a refresh token Gatehouse has never seen; (response, seconds)."""
    token = "outage-refresh-" + secrets.token_urlsafe(24)
    seen.add(token, kind="upstream refresh token (outage test)")
    app = App(setup["gatehouse"], seen, client_id="com.example.relay")
    return timed(lambda: app.refresh(token))


def refused(port):
    """Whether a connection to 127.0.0.1:PORT is refused right now."""
    with socket.socket() as probe:
        probe.settimeout(2)
        try:
            probe.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        return False


def assert_relayed(response, seconds, within):
    assert response.status_code == 200, (response.status_code, response.text[:300])
    assert response.json()["headers"].get("x-bpid") == "1000123", response.text[:300]
    assert seconds < within, f"the relayed call took {seconds:.3f} s (expected under {within} s)"


def assert_refreshed(response, seconds, within):
    assert response.status_code == 200, (response.status_code, response.text[:300])
    assert response.json()["access_token"], response.text[:300]
    assert seconds < within, f"the refresh took {seconds:.3f} s (expected under {within} s)"


def retry_after(response):
    value = response.headers.get("Retry-After", "")
    assert value.isdigit() and int(value) >= 1, f"Retry-After {value!r}"


def assert_relay_unavailable(response, seconds):
    assert response.status_code == 503, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/problem+json"), response.headers["Content-Type"]
    assert response.json()["status"] == 503
    retry_after(response)
    assert seconds < OUTAGE_ANSWER_WITHIN, (
        f"the relayed call's 503 took {seconds:.3f} s (expected under {OUTAGE_ANSWER_WITHIN} s; connect timeout {CONNECT_TIMEOUT} s)")


def assert_refresh_unavailable(response, seconds):
    assert response.status_code == 503, (response.status_code, response.text[:300])
    assert response.headers["Content-Type"].startswith("application/json"), response.headers["Content-Type"]
    assert response.json()["error"] == "temporarily_unavailable", response.text[:300]
    retry_after(response)
    assert seconds < OUTAGE_ANSWER_WITHIN, (
        f"the refresh's 503 took {seconds:.3f} s (expected under {OUTAGE_ANSWER_WITHIN} s; "
        f"three attempts of a connect timeout would take {3 * CONNECT_TIMEOUT} s)")


def test_an_outage_fails_each_request_once_and_promptly_and_the_first_request_after_it_succeeds(outage, seen):
    upstream = outage["upstream"]

    # Before: both work.
    assert_relayed(*relayed_call(outage, seen), within=10)
    assert_refreshed(*refresh(outage, seen), within=10)

    # The outage: the upstream's listening socket is closed, its connections cut.
    upstream.stop()
    assert refused(upstream.port), "the upstream's port still accepts connections"
    response, seconds = relayed_call(outage, seen)
    assert_relay_unavailable(response, seconds)
    response, seconds = refresh(outage, seen)
    assert_refresh_unavailable(response, seconds)
    # Several apps at once: each gets its own prompt 503, none waits behind another's attempts.
    with ThreadPoolExecutor(CONCURRENT_CALLS) as pool:
        answers = list(pool.map(lambda _: relayed_call(outage, seen), range(CONCURRENT_CALLS)))
    for response, seconds in answers:
        assert_relay_unavailable(response, seconds)
    response, seconds = refresh(outage, seen)
    assert_refresh_unavailable(response, seconds)

    # The upstream is back, at the same address: the very first requests succeed, at once.
    identity_calls, token_calls = upstream.snapshot()["known"], upstream.token_calls
    upstream.restart()
    assert not refused(upstream.port), "the upstream did not come back on its port"
    assert_relayed(*relayed_call(outage, seen), within=RECOVERED_ANSWER_WITHIN)
    assert_refreshed(*refresh(outage, seen), within=RECOVERED_ANSWER_WITHIN)
    # One identity call and one token request, no more: nothing was retried.
    assert upstream.token_calls == token_calls + 1
    assert upstream.snapshot()["known"] == identity_calls + 1
