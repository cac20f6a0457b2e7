"""DPoP-bound tokens (RFC 9449) end to end: proofs built with PyJWT + cryptography
(sandbox/dpop.py), never with Gatehouse's code. Token requests with a proof get `ghd_`
tokens of type DPoP; the relay (on both paths: a warm bound token takes the fast path, which
checks its proof on the event loop and writes the proof's jti to the store before the backend is
asked), /userinfo and refreshes then need a fresh proof by the same key; every check of RFC 9449
§4.3 fails on its own; replays are refused by the in-memory cache and by the store, on both relay
paths (across instances and a restart here, a restart of the token endpoint in test_guarantees.py)."""

import secrets
import time

import pytest
import requests

from sandbox.dpop import Key
from sandbox.gatelog import served_by
from sandbox.nativeapp import APP_REDIRECT, App
from sandbox.secretsrecord import stop
from trusted import postgres_store, trusted_gatehouse

OPTIONAL = "com.example.dpop"
REQUIRED = "com.example.dpop.required"
OFF = "com.example.dpop.off"


def client(client_id, dpop, extra=""):
    return f"""
  - client_id: {client_id}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]
    dpop: {dpop}{extra}"""


ROUTES = """
  - prefix: /api/dpop
    backend: {backend}/dpop
    methods: [GET, POST]
    upstream: legacy
    authorization: passthrough"""


@pytest.fixture(scope="module")
def gatehouse(workdir, seen):
    clients = client(OPTIONAL, "optional", "\n    instances: {}") + client(REQUIRED, "required") + client(OFF, "off")
    with trusted_gatehouse(workdir, seen, "dpop", clients, ROUTES) as running:
        yield running


@pytest.fixture(scope="module")
def nonce_gatehouse(workdir, seen):
    with trusted_gatehouse(workdir, seen, "dpop-nonce", client(OPTIONAL, "optional"), ROUTES, "dpop:\n  nonce: true") as running:
        yield running


def token_url(gatehouse):
    return gatehouse["url"] + "/oauth/token"


def bound_sign_in(gatehouse, seen, key, client_id=OPTIONAL):
    app = App(gatehouse, seen, client_id=client_id)
    code = app.sign_in()["code"]
    answer = app.redeem(code, headers={"DPoP": key.proof("POST", token_url(gatehouse))})
    assert answer.status_code == 200, answer.text
    return app, answer.json()


def call(gatehouse, key, token, method="GET", path="/api/dpop/x", proof=None, scheme="DPoP", **proof_options):
    url = gatehouse["url"] + path
    headers = {"Authorization": f"{scheme} {token}"}
    if proof is None and key is not None:
        proof = key.proof(method, url, access_token=token, **proof_options)
    if proof is not None:
        headers["DPoP"] = proof
    return requests.request(method, url, headers=headers, timeout=10)


def challenge(response):
    return response.headers.get("WWW-Authenticate", "")


def test_a_token_request_with_a_proof_gets_bound_tokens_the_relay_accepts_with_a_fresh_proof(gatehouse, seen):
    key = Key()
    _, pair = bound_sign_in(gatehouse, seen, key)
    assert pair["token_type"] == "DPoP" and pair["access_token"].startswith("ghd_")
    paths = []
    for _ in range(3):  # the first call warms the session and identity caches; the next take the fast path
        answer = call(gatehouse, key, pair["access_token"])
        assert answer.status_code == 200, answer.text
        paths.append(served_by(gatehouse, answer))
        received = answer.json()["headers"]
        assert "dpop" not in received  # the proof is Gatehouse's to spend
        assert not received["authorization"].startswith("Bearer ghd_")  # the backend gets the upstream token
    assert paths == ["general", "fast", "fast"], paths
    metadata = requests.get(gatehouse["url"] + "/.well-known/oauth-authorization-server", timeout=10).json()
    assert "ES256" in metadata["dpop_signing_alg_values_supported"]


@pytest.mark.parametrize("alg", ["RS256", "PS256", "EdDSA"])
def test_every_supported_algorithm_binds(gatehouse, seen, alg):
    key = Key(alg)
    _, pair = bound_sign_in(gatehouse, seen, key)
    assert call(gatehouse, key, pair["access_token"]).status_code == 200


def test_without_a_proof_an_optional_app_gets_bearer_tokens(gatehouse, seen):
    app = App(gatehouse, seen, client_id=OPTIONAL)
    pair = app.redeem(app.sign_in()["code"]).json()
    assert pair["token_type"] == "Bearer" and pair["access_token"].startswith("gha_")


def test_a_required_app_gets_nothing_without_a_proof_and_an_off_app_ignores_one(gatehouse, seen):
    app = App(gatehouse, seen, client_id=REQUIRED)
    refused = app.redeem(app.sign_in()["code"])
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_dpop_proof"
    off = App(gatehouse, seen, client_id=OFF)
    pair = off.redeem(off.sign_in()["code"], headers={"DPoP": "not even a JWT"}).json()
    assert pair["token_type"] == "Bearer"


@pytest.mark.parametrize("case", ["wrong htm", "wrong htu", "stale iat", "future iat", "no ath", "wrong ath", "other key",
                                  "typ", "query in htu", "private jwk", "two proofs", "no proof"])
def test_each_check_of_a_resource_proof_fails_on_its_own(gatehouse, seen, case):
    key = Key()
    _, pair = bound_sign_in(gatehouse, seen, key)
    token, url = pair["access_token"], gatehouse["url"] + "/api/dpop/x"
    proofs = {
        "wrong htm": key.proof("POST", url, access_token=token),
        "wrong htu": key.proof("GET", gatehouse["url"] + "/api/dpop/y", access_token=token),
        "stale iat": key.proof("GET", url, access_token=token, iat=int(time.time()) - 600),
        "future iat": key.proof("GET", url, access_token=token, iat=int(time.time()) + 600),
        "no ath": key.proof("GET", url),
        "wrong ath": key.proof("GET", url, access_token=token + "x"),
        "other key": Key().proof("GET", url, access_token=token),
        "typ": key.proof("GET", url, access_token=token, typ="JWT"),
        "private jwk": key.proof("GET", url, access_token=token, jwk=dict(key.jwk, d="AAAA")),
    }
    headers = {"Authorization": f"DPoP {token}"}
    if case == "two proofs":
        response = _two_proofs(url, token, key)
    elif case == "no proof":
        response = requests.get(url, headers=headers, timeout=10)
    elif case == "query in htu":
        response = requests.get(url + "?a=1", headers={**headers, "DPoP": key.proof("GET", url + "?a=1", access_token=token)},
                                timeout=10)
        # htu carries no query (RFC 9449 §4.2): the request's own URI without it is what counts.
        assert response.status_code == 200, response.text
        return
    else:
        response = requests.get(url, headers={**headers, "DPoP": proofs[case]}, timeout=10)
    assert response.status_code == 401, response.text
    assert challenge(response).startswith("DPoP ") and 'error="invalid_dpop_proof"' in challenge(response)
    assert response.headers["Content-Type"].startswith("application/problem+json")
    assert response.headers.get("DPoP-Nonce")
    # The token still works with a good proof: a bad proof burns nothing.
    assert call(gatehouse, key, token).status_code == 200


def _two_proofs(url, token, key):
    import http.client
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    connection.putrequest("GET", parts.path)
    connection.putheader("Authorization", f"DPoP {token}")
    connection.putheader("DPoP", key.proof("GET", url, access_token=token))
    connection.putheader("DPoP", key.proof("GET", url, access_token=token))
    connection.endheaders()
    raw = connection.getresponse()

    class Answer:
        status_code = raw.status
        headers = requests.structures.CaseInsensitiveDict(raw.getheaders())
        text = raw.read().decode()
    connection.close()
    return Answer()


def test_a_replayed_proof_is_refused(gatehouse, seen):
    key = Key()
    _, pair = bound_sign_in(gatehouse, seen, key)
    url = gatehouse["url"] + "/api/dpop/x"
    proof = key.proof("GET", url, access_token=pair["access_token"])
    first = call(gatehouse, None, pair["access_token"], proof=proof)
    assert first.status_code == 200
    again = call(gatehouse, None, pair["access_token"], proof=proof)
    assert again.status_code == 401 and "used before" in again.json()["detail"]


def warm(gatehouse, key, token):
    """A first call by the general path fills the caches the fast path reads; the next one takes it."""
    assert call(gatehouse, key, token).status_code == 200
    answer = call(gatehouse, key, token)
    assert answer.status_code == 200 and served_by(gatehouse, answer) == "fast", answer.text


def test_a_replayed_proof_is_refused_on_the_fast_path_too(gatehouse, seen):
    key = Key()
    _, pair = bound_sign_in(gatehouse, seen, key)
    warm(gatehouse, key, pair["access_token"])
    mark = gatehouse["backend"].mark()
    proof = key.proof("GET", gatehouse["url"] + "/api/dpop/x", access_token=pair["access_token"])
    first = call(gatehouse, None, pair["access_token"], proof=proof)
    assert first.status_code == 200 and served_by(gatehouse, first) == "fast"
    again = call(gatehouse, None, pair["access_token"], proof=proof)
    assert again.status_code == 401 and "used before" in again.json()["detail"], again.text
    assert 'error="invalid_dpop_proof"' in challenge(again) and again.headers.get("DPoP-Nonce")
    assert len(gatehouse["backend"].request_lines_since(mark)) == 1, "the replay never reached the backend"


def test_replays_never_take_the_callers_rate_limit_tokens(workdir, seen):
    """A stolen token and one of its proofs, replayed again and again: each replay is refused
    (general path, in memory) without taking a token of the caller's `relay_per_subject`
    allowance, so the caller's own next request still goes through."""
    limits = "rate_limits:\n  relay_per_subject: {per_second: 0.01, burst: 4}"
    with trusted_gatehouse(workdir, seen, "dpop-limited", client(OPTIONAL, "optional"), ROUTES, limits) as gatehouse:
        key = Key()
        _, pair = bound_sign_in(gatehouse, seen, key)
        token = pair["access_token"]
        warm(gatehouse, key, token)  # two of the four tokens
        proof = key.proof("GET", gatehouse["url"] + "/api/dpop/x", access_token=token)
        assert call(gatehouse, None, token, proof=proof).status_code == 200  # the third
        for _ in range(10):
            replayed = call(gatehouse, None, token, proof=proof)
            assert replayed.status_code == 401 and "used before" in replayed.json()["detail"], replayed.text
        own = call(gatehouse, key, token)
        assert own.status_code == 200, own.text  # the fourth: the replays took none
        assert call(gatehouse, key, token).status_code == 429  # and the allowance is really four


@pytest.mark.parametrize("case", ["wrong htm", "wrong htu", "wrong ath", "other key", "no proof", "bearer scheme"])
def test_a_warm_bound_token_with_a_bad_proof_is_refused_as_on_the_general_path(gatehouse, seen, case):
    key = Key()
    _, pair = bound_sign_in(gatehouse, seen, key)
    token, url = pair["access_token"], gatehouse["url"] + "/api/dpop/x"
    warm(gatehouse, key, token)
    mark = gatehouse["backend"].mark()
    proofs = {"wrong htm": key.proof("POST", url, access_token=token),
              "wrong htu": key.proof("GET", gatehouse["url"] + "/api/dpop/y", access_token=token),
              "wrong ath": key.proof("GET", url, access_token=token + "x"),
              "other key": Key().proof("GET", url, access_token=token)}
    if case == "no proof":
        response = requests.get(url, headers={"Authorization": f"DPoP {token}"}, timeout=10)
    elif case == "bearer scheme":
        response = call(gatehouse, key, token, scheme="Bearer")
    else:
        response = call(gatehouse, None, token, proof=proofs[case])
    assert response.status_code == 401, response.text
    assert challenge(response).startswith("DPoP ")
    assert gatehouse["backend"].request_lines_since(mark) == []


def test_a_bound_token_is_no_bearer_token_and_a_bearer_token_no_dpop_one(gatehouse, seen):
    key = Key()
    _, pair = bound_sign_in(gatehouse, seen, key)
    as_bearer = call(gatehouse, key, pair["access_token"], scheme="Bearer")
    assert as_bearer.status_code == 401 and 'error="invalid_token"' in challenge(as_bearer)
    assert challenge(as_bearer).startswith("DPoP ")
    app = App(gatehouse, seen, client_id=OPTIONAL)
    bearer = app.redeem(app.sign_in()["code"]).json()["access_token"]
    as_dpop = call(gatehouse, key, bearer)
    assert as_dpop.status_code == 401


def test_refreshes_need_a_proof_by_the_bound_key_and_stay_bound(gatehouse, seen):
    key = Key()
    app, pair = bound_sign_in(gatehouse, seen, key)
    without = app.refresh(pair["refresh_token"])
    assert without.status_code == 400 and without.json()["error"] == "invalid_dpop_proof"
    other = app.refresh(pair["refresh_token"], headers={"DPoP": Key().proof("POST", token_url(gatehouse))})
    assert other.status_code == 400 and other.json()["error"] == "invalid_dpop_proof"
    good = app.refresh(pair["refresh_token"], headers={"DPoP": key.proof("POST", token_url(gatehouse))})
    assert good.status_code == 200, good.text
    renewed = good.json()
    assert renewed["token_type"] == "DPoP" and renewed["access_token"].startswith("ghd_")
    assert call(gatehouse, key, renewed["access_token"]).status_code == 200


def test_a_token_endpoint_proof_is_checked_and_spent(gatehouse, seen):
    key = Key()
    app = App(gatehouse, seen, client_id=OPTIONAL)
    wrong_url = app.redeem(app.sign_in()["code"], headers={"DPoP": key.proof("POST", gatehouse["url"] + "/oauth/revoke")})
    assert wrong_url.status_code == 400 and wrong_url.json()["error"] == "invalid_dpop_proof"
    proof = key.proof("POST", token_url(gatehouse))
    first = App(gatehouse, seen, client_id=OPTIONAL)
    assert first.redeem(first.sign_in()["code"], headers={"DPoP": proof}).status_code == 200
    second = App(gatehouse, seen, client_id=OPTIONAL)
    replayed = second.redeem(second.sign_in()["code"], headers={"DPoP": proof})
    assert replayed.status_code == 400 and replayed.json()["error"] == "invalid_dpop_proof"


def test_userinfo_of_a_bound_token_needs_its_proof(gatehouse, seen):
    key = Key()
    _, pair = bound_sign_in(gatehouse, seen, key)
    url = gatehouse["url"] + "/userinfo"
    bare = requests.get(url, headers={"Authorization": f"DPoP {pair['access_token']}"}, timeout=10)
    assert bare.status_code == 401 and challenge(bare).startswith("DPoP ")
    proved = requests.get(url, timeout=10, headers={"Authorization": f"DPoP {pair['access_token']}",
                                                   "DPoP": key.proof("GET", url, access_token=pair["access_token"])})
    assert proved.status_code == 404  # a legacy upstream gives no userinfo: past the token check, nothing to show


def test_proofs_that_must_fail_at_each_endpoint(gatehouse, seen):
    # An unsigned proof (alg none) on the relay, a refresh proof naming another URI, and a proof by
    # another key on /userinfo: each refused, and each names what was wrong.
    import jwt as pyjwt
    key = Key()
    app, pair = bound_sign_in(gatehouse, seen, key)
    token, url = pair["access_token"], gatehouse["url"] + "/api/dpop/x"
    claims = {"htm": "GET", "htu": url, "iat": int(time.time()), "jti": secrets.token_urlsafe(16)}
    unsigned = pyjwt.encode(claims, None, algorithm="none", headers={"typ": "dpop+jwt", "jwk": key.jwk})
    refused = call(gatehouse, None, token, proof=unsigned)
    assert refused.status_code == 401 and "alg" in refused.json()["detail"], refused.text
    wrong_htu = app.refresh(pair["refresh_token"], headers={"DPoP": key.proof("POST", gatehouse["url"] + "/oauth/revoke")})
    assert wrong_htu.status_code == 400 and wrong_htu.json()["error"] == "invalid_dpop_proof", wrong_htu.text
    assert "htu" in wrong_htu.json()["error_description"]
    userinfo = gatehouse["url"] + "/userinfo"
    other_key = requests.get(userinfo, timeout=10, headers={"Authorization": f"DPoP {token}",
                                                           "DPoP": Key().proof("GET", userinfo, access_token=token)})
    assert other_key.status_code == 401 and "key" in other_key.json()["detail"], other_key.text
    # The refresh token survived the refused attempt: a good proof still refreshes.
    assert app.refresh(pair["refresh_token"], headers={"DPoP": key.proof("POST", token_url(gatehouse))}).status_code == 200


def test_an_instance_registered_with_a_key_must_prove_it_on_every_token_request(gatehouse, seen):
    key = Key()
    registered = requests.post(gatehouse["url"] + "/oauth/register", json={"software_id": OPTIONAL}, timeout=10,
                               headers={"DPoP": key.proof("POST", gatehouse["url"] + "/oauth/register")})
    assert registered.status_code == 201, registered.text
    assert registered.json()["dpop_bound_access_tokens"] is True
    instance = registered.json()["client_id"]
    app = App(gatehouse, seen, client_id=instance)
    code = app.sign_in()["code"]
    stranger = app.redeem(code, headers={"DPoP": Key().proof("POST", token_url(gatehouse))})
    assert stranger.status_code == 400 and stranger.json()["error"] == "invalid_dpop_proof"
    app = App(gatehouse, seen, client_id=instance)
    bare = app.redeem(app.sign_in()["code"])
    assert bare.status_code == 400 and bare.json()["error"] == "invalid_dpop_proof"
    app = App(gatehouse, seen, client_id=instance)
    good = app.redeem(app.sign_in()["code"], headers={"DPoP": key.proof("POST", token_url(gatehouse))})
    assert good.status_code == 200 and good.json()["token_type"] == "DPoP"


def test_with_server_nonces_a_proof_without_the_nonce_is_told_which_to_use(nonce_gatehouse, seen):
    gatehouse, key = nonce_gatehouse, Key()
    app = App(gatehouse, seen, client_id=OPTIONAL)
    code = app.sign_in()["code"]
    first = app.redeem(code, headers={"DPoP": key.proof("POST", token_url(gatehouse))})
    assert first.status_code == 400 and first.json()["error"] == "use_dpop_nonce"
    nonce = first.headers["DPoP-Nonce"]
    # The code was not spent by a proof without the nonce: the app tries again with it.
    retried = app.redeem(code, headers={"DPoP": key.proof("POST", token_url(gatehouse), nonce=nonce)})
    assert retried.status_code == 200, retried.text
    token = retried.json()["access_token"]
    stale = call(gatehouse, key, token)
    assert stale.status_code == 401 and 'error="use_dpop_nonce"' in challenge(stale)
    fresh = call(gatehouse, key, token, nonce=stale.headers["DPoP-Nonce"])
    assert fresh.status_code == 200, fresh.text
    forged = call(gatehouse, key, token, nonce="AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
    assert forged.status_code == 401 and 'error="use_dpop_nonce"' in challenge(forged)


def test_revoking_a_bound_access_token_ends_its_session(gatehouse, seen):
    key = Key()
    app, pair = bound_sign_in(gatehouse, seen, key)
    assert call(gatehouse, key, pair["access_token"]).status_code == 200
    revoked = requests.post(gatehouse["url"] + "/oauth/revoke", data={"token": pair["access_token"], "client_id": OPTIONAL}, timeout=10)
    assert revoked.status_code == 200
    assert call(gatehouse, key, pair["access_token"]).status_code == 401
    refreshed = app.refresh(pair["refresh_token"], headers={"DPoP": key.proof("POST", token_url(gatehouse))})
    assert refreshed.json()["error"] == "invalid_grant"


@pytest.fixture(scope="module")
def shared_store(workdir, seen):
    """Two instances on one PostgreSQL database behind one public URL (a load balancer's)."""
    store = postgres_store("dpop")
    with trusted_gatehouse(workdir, seen, "dpop-shared", client(OPTIONAL, "optional"), ROUTES, store=store, replicas=2) as running:
        yield running


def test_a_proof_spent_on_one_instance_is_refused_by_another(shared_store, seen):
    key = Key()
    _, pair = bound_sign_in(shared_store, seen, key)
    other = shared_store["replicas"][0]
    url = shared_store["url"] + "/api/dpop/x"  # the public URL both instances answer for
    proof = key.proof("GET", url, access_token=pair["access_token"])
    headers = {"Authorization": f"DPoP {pair['access_token']}", "DPoP": proof}
    assert requests.get(url, headers=headers, timeout=10).status_code == 200
    replayed = requests.get(other["url"] + "/api/dpop/x", headers=headers, timeout=10)
    assert replayed.status_code == 401 and "used before" in replayed.json()["detail"]
    # The same on the fast path: both instances warm, a proof spent on one is refused by the
    # other's fast path, which finds it in the store before the backend is asked.
    warm(shared_store, key, pair["access_token"])
    assert requests.get(other["url"] + "/api/dpop/x", timeout=10, headers={
        "Authorization": f"DPoP {pair['access_token']}", "DPoP": key.proof("GET", url, access_token=pair["access_token"])}).status_code == 200
    mark = shared_store["backend"].mark()
    headers = {"Authorization": f"DPoP {pair['access_token']}", "DPoP": key.proof("GET", url, access_token=pair["access_token"])}
    first = requests.get(url, headers=headers, timeout=10)
    assert first.status_code == 200 and served_by(shared_store, first) == "fast"
    replayed = requests.get(other["url"] + "/api/dpop/x", headers=headers, timeout=10)
    assert replayed.status_code == 401 and "used before" in replayed.json()["detail"], replayed.text
    assert served_by(other, replayed) == "fast", "refused by the fast path's own store check"
    assert 'error="invalid_dpop_proof"' in challenge(replayed) and replayed.headers.get("DPoP-Nonce")
    assert len(shared_store["backend"].request_lines_since(mark)) == 1
    # A fresh proof works on the other instance: the session and its key are shared too.
    fresh = requests.get(other["url"] + "/api/dpop/x", timeout=10, headers={
        "Authorization": f"DPoP {pair['access_token']}", "DPoP": key.proof("GET", url, access_token=pair["access_token"])})
    assert fresh.status_code == 200, fresh.text


def test_a_saturated_memory_cache_falls_back_to_the_store(workdir, seen):
    """With more live proofs than `dpop.replay_cache_entries`, a proof the memory forgot is still
    refused on SQLite: the store, where every proof id is written, answers."""
    with trusted_gatehouse(workdir, seen, "dpop-small-cache", client(OPTIONAL, "optional"), ROUTES,
                           "dpop:\n  replay_cache_entries: 1000") as gatehouse:
        key = Key()
        _, pair = bound_sign_in(gatehouse, seen, key)
        url = gatehouse["url"] + "/api/dpop/x"
        first = key.proof("GET", url, access_token=pair["access_token"])
        session = requests.Session()
        headers = {"Authorization": f"DPoP {pair['access_token']}"}
        assert session.get(url, headers={**headers, "DPoP": first}, timeout=10).status_code == 200
        for _ in range(1001):  # pushes the first proof out of the memory cache
            assert session.get(url, headers={**headers, "DPoP": key.proof("GET", url, access_token=pair["access_token"])},
                               timeout=10).status_code == 200
        replayed = session.get(url, headers={**headers, "DPoP": first}, timeout=10)
        assert replayed.status_code == 401 and "used before" in replayed.json()["detail"]
        assert served_by(gatehouse, replayed) == "fast", "the fast path asked the store"


def test_a_proof_spent_on_the_fast_path_is_refused_after_a_restart(workdir, seen):
    with trusted_gatehouse(workdir, seen, "dpop-fast-restart", client(OPTIONAL, "optional"), ROUTES) as gatehouse:
        key = Key()
        _, pair = bound_sign_in(gatehouse, seen, key)
        token, url = pair["access_token"], gatehouse["url"] + "/api/dpop/x"
        warm(gatehouse, key, token)
        proof = key.proof("GET", url, access_token=token)
        first = call(gatehouse, None, token, proof=proof)
        assert first.status_code == 200 and served_by(gatehouse, first) == "fast"
        stop(gatehouse["process"])
        with gatehouse["relaunch"]("again") as again:
            warm(again, key, token)
            mark = gatehouse["backend"].mark()
            replayed = call(gatehouse, None, token, proof=proof)
            assert replayed.status_code == 401 and "used before" in replayed.json()["detail"], replayed.text
            assert served_by(again, replayed) == "fast"
            assert gatehouse["backend"].request_lines_since(mark) == []
