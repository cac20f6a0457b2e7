"""The resource relay (myVOO steps 1a-1c and 6a-6b), end to end: tokens issued by the real
authorization server through Gatehouse, identity from the personal-information service
(XML and JSON), RFC 7662 introspection, OIDC userinfo and JWT validation, relayed to a
backend that echoes what reached it.

Tests that take `relay_path` run twice, once per relay path, for real: `relay_token` gives a
fresh token for "general" (its first request is an identity-cache miss) and a warm one for
"fast" (its identity is cached), and `served_by` checks, from the request's log line, which
path answered."""

import hashlib
import http.client
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import requests
from jwcrypto import jwk, jwt

from sandbox.gatelog import served_by
from sandbox.nativeapp import App, InAppBrowser
from rawhttp import RawClient, request


@pytest.fixture(scope="module")
def alice(gatehouse, seen):
    """A fresh access token for alice, obtained through Gatehouse from the real upstream."""
    return issue_token(gatehouse, seen)


def issue_token(gatehouse, seen, client_id="com.example.app", browser=None, scope="read write"):
    app = App(gatehouse, seen, client_id=client_id)
    location = (browser or InAppBrowser()).follow(app.authorize_url(scope=scope), app.redirect_uri)
    code = dict(pair.split("=", 1) for pair in urlsplit(location).query.split("&"))["code"]
    tokens = app.redeem(code)
    assert tokens.status_code == 200, tokens.text
    return tokens.json()["access_token"]


def get(gatehouse, path, token=None, **kwargs):
    headers = kwargs.pop("headers", {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return requests.get(gatehouse["url"] + path, headers=headers, timeout=30, **kwargs)


def test_relay_sends_identity_headers_and_the_rest_of_the_path(gatehouse, relay_path, relay_token, relay_doubles):
    response = get(gatehouse, "/api/contracts/42/lines?from=2026-01", relay_token("/api/contracts"))
    assert response.status_code == 200, response.text
    assert served_by(gatehouse, response) == relay_path
    echoed = response.json()
    assert echoed["path"] == "/contracts/42/lines?from=2026-01"
    assert echoed["headers"]["x-bpid"] == "1000123"
    assert echoed["headers"]["x-subject"] == "alice"
    assert echoed["headers"]["x-bpid-status"] == "active"
    assert "authorization" not in echoed["headers"]  # route default: removed
    assert echoed["headers"]["x-request-id"] == response.headers["X-Request-Id"]
    assert echoed["headers"]["x-forwarded-for"] == "127.0.0.1"
    assert echoed["headers"]["x-forwarded-proto"] == "http"
    assert "for=127.0.0.1" in echoed["headers"]["forwarded"]


def test_client_sent_identity_and_hop_by_hop_headers_never_reach_the_backend(gatehouse, relay_path, relay_token):
    response = get(gatehouse, "/api/contracts/1", relay_token("/api/contracts"), headers={
        "X-BPId": "9999999", "x-subject": "mallory", "X-Email": "spoof@example.test", "X-Forwarded-For": "6.6.6.6",
        "Connection": "keep-alive, X-Private-Hop", "X-Private-Hop": "secret", "Keep-Alive": "timeout=1",
        "TE": "trailers", "Proxy-Authorization": "Basic Zm9vOmJhcg==", "X-Custom": "kept"})
    assert served_by(gatehouse, response) == relay_path
    headers = response.json()["headers"]
    assert headers["x-bpid"] == "1000123"
    assert headers["x-subject"] == "alice"
    assert "x-email" not in headers  # an identity header of another route is stripped too
    assert headers["x-forwarded-for"] == "127.0.0.1"
    for hop in ("x-private-hop", "keep-alive", "te", "proxy-authorization"):
        assert hop not in headers, hop
    assert headers["x-custom"] == "kept"
    # and the backend's own hop-by-hop headers do not come back
    assert "Keep-Alive" not in response.headers
    assert response.headers["X-Backend"] == "echo"


def test_no_token_is_401_with_where_to_sign_in(gatehouse):
    response = get(gatehouse, "/api/contracts/1")
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
    body = response.json()
    assert body["sign_in"]["authorization_endpoint"] == gatehouse["url"] + "/oauth/authorize"
    assert "client_id=com.example.app" in body["sign_in"]["url"]


def test_unknown_and_revoked_tokens_are_401(gatehouse, seen, upstream):
    assert get(gatehouse, "/api/contracts/1", "not-a-real-token").status_code == 401
    token = issue_token(gatehouse, seen)
    revoked = requests.post(upstream["url"] + "/o/revoke_token/", data={"token": token},
                            auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"]), timeout=10)
    assert revoked.status_code == 200
    response = get(gatehouse, "/api/contracts/1", token)
    assert response.status_code == 401
    assert "sign_in" in response.json()


def test_expired_jwt_is_401(gatehouse, relay_doubles):
    token = relay_doubles["jwt"].mint("carol", expires_in=-30)
    assert get(gatehouse, "/api/jwt/x", token).status_code == 401


def test_blocked_business_partner_is_403_naming_the_rule(gatehouse, relay_path, relay_token, relay_doubles):
    """Fresh token: the rule is checked after the identity call, on the general path. Warm token
    (warmed on a route of the same upstream without a rule): the identity is cached, so the fast
    path's planner checks the rule itself; it must not relay, and hands the refusal over."""
    token = relay_token("/api/sealed", username="bob")
    personal, backend = relay_doubles["personal"], relay_doubles["backend"]
    calls, mark = personal.calls_for(token), backend.mark()
    response = get(gatehouse, "/api/contracts/1", token)
    assert response.status_code == 403
    assert response.headers["Content-Type"] == "application/problem+json"
    assert "bpid_status" in response.json()["detail"]
    assert token not in response.text
    assert backend.request_lines_since(mark) == []
    assert personal.calls_for(token) == calls + (1 if relay_path == "general" else 0)
    assert served_by(gatehouse, response) == "general"  # refusals are written by the general path only


def test_missing_scope_is_403(gatehouse, relay_path, relay_token, relay_doubles):
    token = relay_token("/api/admin")  # warm: through /api/introspected, same upstream, scope read
    mark = relay_doubles["backend"].mark()
    response = get(gatehouse, "/api/admin/x", token)
    assert response.status_code == 403
    assert "'admin'" in response.json()["detail"]
    assert relay_doubles["backend"].request_lines_since(mark) == []
    assert served_by(gatehouse, response) == "general"


def test_identity_through_json_personal_information(gatehouse, relay_path, relay_token):
    response = get(gatehouse, "/api/json/x", relay_token("/api/json"))
    assert served_by(gatehouse, response) == relay_path
    headers = response.json()["headers"]
    assert (headers["x-bpid"], headers["x-subject"]) == ("1000123", "alice")


def test_identity_through_introspection_with_scope(gatehouse, relay_path, relay_token):
    response = get(gatehouse, "/api/introspected/x", relay_token("/api/introspected"))
    assert response.status_code == 200, response.text
    assert served_by(gatehouse, response) == relay_path
    assert response.json()["headers"]["x-subject"] == "alice"


def test_identity_through_oidc_userinfo(gatehouse, relay_path, relay_token):
    token = relay_token("/api/userinfo", client_id="com.example.oidc", scope="openid email")
    response = get(gatehouse, "/api/userinfo/x", token)
    assert response.status_code == 200, response.text
    assert served_by(gatehouse, response) == relay_path
    assert response.json()["headers"]["x-email"] == "alice@example.test"


def test_jwt_access_token_checked_locally_and_replaced_by_a_gatehouse_assertion(gatehouse, relay_doubles):
    issuer = relay_doubles["jwt"]
    token = issuer.mint("carol", scope="read", extra_claims={"bpid": "1000777"})
    response = get(gatehouse, "/api/jwt/x", token)
    assert response.status_code == 200, response.text
    headers = response.json()["headers"]
    assert headers["x-bpid"] == "1000777"
    assertion = headers["authorization"].removeprefix("Bearer ")
    assert assertion != token
    keys = jwk.JWKSet.from_json(requests.get(gatehouse["url"] + "/.well-known/jwks.json", timeout=5).text)
    claims = json.loads(jwt.JWT(jwt=assertion, key=keys, algs=["ES256"]).claims)
    assert claims["sub"] == "carol" and claims["bpid"] == "1000777"
    assert claims["iss"] == gatehouse["url"]
    assert claims["exp"] - claims["iat"] <= 60


def test_jwt_with_an_unknown_key_is_never_relayed(gatehouse, relay_doubles):
    """An unknown kid is refused (401) right after a JWKS fetch; while refetching is throttled it
    may be a key rotation upstream, so Gatehouse answers 503 rather than sign anyone out."""
    before = relay_doubles["backend"].calls
    response = get(gatehouse, "/api/jwt/x", relay_doubles["jwt"].mint_with_unknown_key("carol"))
    assert response.status_code in (401, 503)
    if response.status_code == 503:
        assert int(response.headers["Retry-After"]) > 0
    assert relay_doubles["backend"].calls == before


@pytest.mark.parametrize("forge", ["none", "hs256", "wrong_audience", "wrong_issuer"])
def test_forged_jwts_are_401(gatehouse, relay_doubles, forge):
    issuer = relay_doubles["jwt"]
    token = {
        "none": lambda: issuer.mint_unsigned("carol", algorithm="none"),
        "hs256": lambda: issuer.mint_unsigned("carol", algorithm="HS256"),
        "wrong_audience": lambda: issuer.mint("carol", audience="another-api"),
        "wrong_issuer": lambda: issuer.mint("carol", issuer="https://evil.example"),
    }[forge]()
    assert get(gatehouse, "/api/jwt/x", token).status_code == 401


def test_passthrough_route_sends_the_apps_token(gatehouse, relay_path, relay_token):
    token = relay_token("/api/passthrough")
    response = get(gatehouse, "/api/passthrough/x", token)
    assert served_by(gatehouse, response) == relay_path
    assert response.json()["headers"]["authorization"] == f"Bearer {token}"


def test_500_concurrent_first_calls_make_one_identity_call(gatehouse, seen, relay_doubles):
    personal = relay_doubles["personal"]
    token = issue_token(gatehouse, seen)
    personal.delay_seconds = 1.0
    barrier = threading.Barrier(500)
    payload = request("GET", "/api/contracts/1", [("Authorization", f"Bearer {token}")])

    def call(_):
        # Connected and the request built before the barrier: after it, each thread only sends
        # and waits. (500 threads building requests with `requests` after the barrier held the
        # GIL long enough to starve the identity double, in this same process, past its timeout.)
        with RawClient(gatehouse["port"], timeout=30) as client:
            barrier.wait()
            answer = client.exchange(payload)
            return answer.status if answer is not None else None

    try:
        with ThreadPoolExecutor(max_workers=500) as pool:
            statuses = list(pool.map(call, range(500)))
    finally:
        personal.delay_seconds = 0
    assert statuses == [200] * 500
    assert personal.calls_for(token) == 1


def test_rejected_token_is_remembered_so_retries_do_not_hammer_the_service(gatehouse, relay_doubles):
    personal = relay_doubles["personal"]
    token = "rejected-" + os.urandom(8).hex()
    statuses = [get(gatehouse, "/api/contracts/1", token).status_code for _ in range(100)]
    assert statuses == [401] * 100
    assert personal.calls_for(token) == 1


def test_identity_service_down_is_503_and_signs_nobody_out(gatehouse, alice):
    response = get(gatehouse, "/api/identity-down/x", alice)
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) > 0
    assert response.json()["code"] == "identity_unavailable"


def test_backend_down_is_502(gatehouse, relay_path, relay_token):
    down = get(gatehouse, "/api/down/x", relay_token("/api/down"))
    assert down.status_code == 502 and down.json()["code"] == "backend_unavailable"
    assert served_by(gatehouse, down) == relay_path


def test_backend_slower_than_the_routes_timeout_is_504(gatehouse, relay_path, relay_token):
    slow = get(gatehouse, "/api/slow?seconds=3", relay_token("/api/slow"))
    assert slow.status_code == 504 and slow.json()["code"] == "backend_timeout"
    assert served_by(gatehouse, slow) == relay_path


def test_unconfigured_paths_and_methods_are_refused(gatehouse, alice):
    assert get(gatehouse, "/api/nothing-here", alice).status_code == 404
    assert get(gatehouse, "/api/contractsX", alice).status_code == 404
    deleted = requests.delete(gatehouse["url"] + "/api/contracts/1", headers={"Authorization": f"Bearer {alice}"}, timeout=10)
    assert deleted.status_code == 405
    assert "GET" in deleted.headers["Allow"]


@pytest.mark.parametrize("path", ["/api/contracts/../admin", "/api/contracts/%2e%2e/admin", "/api/contracts//x",
                                  "/api/contracts/%61dmin", "/api/contracts;x/1", "/api/contracts;jsessionid=1/../admin"])
def test_paths_that_climb_out_of_the_prefix_are_400(gatehouse, relay_path, relay_token, relay_doubles, path):
    """Refused before the token is looked at, whether or not its identity is cached. A needlessly
    encoded letter (`%61dmin`: a backend may decode it to another path) and path parameters
    within the prefix (matched as `/api/contracts/…`, as a servlet container reads them, but not
    its bytes) are refused too, never a 404 nor relayed."""
    backend = relay_doubles["backend"]
    mark = backend.mark()
    host = urlsplit(gatehouse["url"])
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    connection.request("GET", path, headers={"Authorization": f"Bearer {relay_token('/api/contracts')}"})
    assert connection.getresponse().status == 400
    assert backend.request_lines_since(mark) == []


def test_body_over_the_routes_limit_is_413(gatehouse, alice, relay_doubles):
    before = relay_doubles["backend"].calls
    response = requests.post(gatehouse["url"] + "/api/small/x", data=b"x" * 2048,
                             headers={"Authorization": f"Bearer {alice}"}, timeout=10)
    assert response.status_code == 413
    assert relay_doubles["backend"].calls == before


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))


def test_large_download_and_upload_stream_with_flat_memory(gatehouse, alice, relay_doubles):
    pid = gatehouse["process"].pid
    size = 1 << 30
    get(gatehouse, "/api/contracts/warm", alice)
    before = peak_rss_kib(pid)
    digest = hashlib.sha256()
    with get(gatehouse, f"/api/contracts/download?bytes={size}", alice, stream=True) as response:
        assert response.status_code == 200
        assert int(response.headers["Content-Length"]) == size
        for chunk in response.iter_content(1 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == relay_doubles["backend"].pattern_sha256(size)
    assert served_by(gatehouse, response) == "fast"  # logged once the answer has ended

    upload_size = 256 << 20
    block = os.urandom(1 << 20)
    sent = hashlib.sha256()

    def chunks():
        for _ in range(upload_size // len(block)):
            sent.update(block)
            yield block

    response = requests.put(gatehouse["url"] + "/api/contracts/upload", data=chunks(),
                            headers={"Authorization": f"Bearer {alice}"}, timeout=120)
    assert response.status_code == 200, response.text
    assert served_by(gatehouse, response) == "general"
    assert response.json()["body_bytes"] == upload_size
    assert response.json()["body_sha256"] == sent.hexdigest()
    grown_mib = (peak_rss_kib(pid) - before) / 1024
    print(f"Gatehouse peak RSS grew by {grown_mib:.1f} MiB while relaying 1 GiB down and 256 MiB up")
    assert grown_mib < 64


def test_head_request_is_relayed_without_a_body(gatehouse, relay_path, relay_token):
    response = requests.head(gatehouse["url"] + "/api/contracts/download?bytes=1000",
                             headers={"Authorization": f"Bearer {relay_token('/api/contracts')}"}, timeout=10)
    assert response.status_code == 200
    assert served_by(gatehouse, response) == relay_path
    assert response.headers["Content-Length"] == "1000"
    assert response.content == b""


def test_pipelined_requests_are_answered_in_order(gatehouse, alice, tokens):
    """Cached-identity GETs take the event loop's fast path; a POST with a body over the fast
    path's 64 KiB and a cache miss (a token Gatehouse has never seen) go through the general
    path, and so do a slow answer and a non-relay endpoint. On one connection their answers must
    still come back in request order."""
    get(gatehouse, "/api/contracts/warm", alice)
    fresh = tokens.fresh()
    body = os.urandom(70 * 1024)
    auth = [("Authorization", f"Bearer {alice}")]
    sequence = [  # (request, the path that must serve it or None when either may, what identifies its answer)
        (request("GET", "/api/contracts/1", auth), "fast", "/contracts/1"),
        (request("POST", "/api/contracts/posted", auth + [("Content-Type", "application/octet-stream")], body), "general",
         "/contracts/posted"),
        (request("GET", "/api/contracts/2", auth), None, "/contracts/2"),
        (request("GET", "/api/contracts/missed", [("Authorization", f"Bearer {fresh}")]), "general", "/contracts/missed"),
        (request("GET", "/api/contracts/3", auth), None, "/contracts/3"),
        (request("GET", "/api/slow?seconds=0.3", auth), None, "slow"),
        (request("GET", "/healthz"), None, "ok"),
        (request("GET", "/api/contracts/4", auth), None, "/contracts/4"),
    ]
    with RawClient(urlsplit(gatehouse["url"]).port) as client:
        client.send(b"".join(payload for payload, _, _ in sequence))
        # Every answer is read from one buffer: answers that arrive in one segment must not be
        # lost in the read-ahead of a reader made per answer.
        answers = [client.read_response(timeout=30) for _ in sequence]
    assert all(answer is not None and answer.status == 200 for answer in answers), answers
    bodies = [answer.json() for answer in answers]
    seen = [b.get("path") or ("slow" if "slept" in b else b.get("status")) for b in bodies]
    assert seen == [expected for _, _, expected in sequence]
    posted = bodies[1]
    assert posted["method"] == "POST" and posted["body_bytes"] == len(body)
    assert posted["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert bodies[3]["headers"]["x-subject"] == "alice"
    ids = [answer.request_id for answer in answers]
    assert len(set(ids)) == len(ids)
    for answer, (_, path, expected) in zip(answers, sequence):
        served = served_by(gatehouse, answer)
        if expected == "ok":
            assert served is None  # not a relayed request
        elif path is not None:
            assert served == path, (expected, served)
        else:
            assert served in ("fast", "general"), (expected, served)
