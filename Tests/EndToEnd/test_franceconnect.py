"""FranceConnect end to end: the gatehouse binary in front of FranceConnect doubles built from
FranceConnect's published documentation (sandbox/franceconnect/), v2 and v1.

One Gatehouse of this module's own (SQLite) has four `franceconnect` upstreams, each its own
double: `fc` (v2, ES256, the integration platform with its issuer overridden), `fc-rs` (v2,
RS256), `fc-jwks` (v2, for the JWKS outage) and `fc-v1` (v1: HS256 keyed with the client
secret, JSON userinfo, /api/v1/logout). Apps sign in through a simulated browser that clicks
"Continuer" (or "Annuler") on the double's login page.

What is checked: the authorization request Gatehouse sends (acr_values=eidas1, state and nonce
of 32 characters or more, the identity-pivot scopes, client_secret_post at the token endpoint);
the sealed app's tokens and Gatehouse's own ES256 ID token; GET /userinfo giving the pivot claims
exactly as FranceConnect gave them; the passthrough app getting FranceConnect's token response as
it was; the relay's identity from the session after FranceConnect's access token has expired,
with no identity call and no upstream refresh ever; the browser logout through /session/end and
back; and every named negative: wrong nonce, aud, iss, alg none, HS256 keyed with the RSA public
key, expired, iat in the future, unknown kid (one JWKS refetch), bad userinfo signature, userinfo
sub ≠ ID token sub, a callback `iss` of another upstream, the cancelled sign-in, logout with a
forged state or an unregistered post-logout URI.
"""

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the sandbox package

from sandbox import franceconnect as fcd  # noqa: E402
from sandbox.backends import EchoBackend  # noqa: E402
from sandbox.nativeapp import App, free_port, query  # noqa: E402
from processes import run_gatehouse, session_keys  # noqa: E402
from sandbox.gatehouse import server_and_store  # noqa: E402

APP_REDIRECT = "com.example.app:/oauth2redirect"
APP_SIGNED_OUT = "com.example.app:/signed-out"
APP_SCOPES = "openid given_name family_name birthdate gender birthplace birthcountry"
SEALED, PASSTHROUGH = "com.example.fc.sealed", "com.example.fc.passthrough"
SEALED_RS, SEALED_JWKS, SEALED_V1 = "com.example.fc.rs", "com.example.fc.jwks", "com.example.fc.v1"
#: The client id Gatehouse has at each double (its FranceConnect "fournisseur de service").
FS_CLIENT = {"fc": "gatehouse-fc", "fc-rs": "gatehouse-fc-rs", "fc-jwks": "gatehouse-fc-jwks", "fc-v1": "gatehouse-fc-v1"}
SECRET_ENV = {"fc": "FC_SECRET_V2", "fc-rs": "FC_SECRET_RS", "fc-jwks": "FC_SECRET_JWKS", "fc-v1": "FC_SECRET_V1"}


def wait_until(predicate, timeout, what):
    """Polls an observable condition (never a fixed sleep) until it holds; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout}s: {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def fc(workdir, seen):
    """Four FranceConnect doubles, an echo backend and a Gatehouse in front of them."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    for name in SECRET_ENV.values():
        env[name] = secrets.token_urlsafe(32)
        seen.add(env[name], kind="upstream client secret")

    def double_config(name, version, alg="ES256"):
        return {"version": version, "alg": alg, "clients": [{
            "client_id": FS_CLIENT[name], "client_secret_env": SECRET_ENV[name], "name": "Gatehouse (tests)",
            "redirect_uris": [f"{base}/oauth/callback"], "post_logout_redirect_uris": [f"{base}/oauth/logout/callback"]}]}

    backend = EchoBackend()
    keys = session_keys(workdir, "fc-session-keys", seen)
    with fcd.start(workdir, "fc-double-v2", double_config("fc", "v2"), env) as v2, \
            fcd.start(workdir, "fc-double-rs", double_config("fc-rs", "v2", "RS256"), env) as rs, \
            fcd.start(workdir, "fc-double-jwks", double_config("fc-jwks", "v2"), env) as jwks, \
            fcd.start(workdir, "fc-double-v1", double_config("fc-v1", "v1"), env) as v1:

        def upstream(name, double, extra=""):
            return fcd.gatehouse_upstream(name, double, FS_CLIENT[name], SECRET_ENV[name], extra)

        def client(client_id, upstream_name, exposure="sealed"):
            return f"""
  - client_id: {client_id}
    upstream: {upstream_name}
    wiring: callback
    token_exposure: {exposure}
    scopes: [{", ".join(APP_SCOPES.split())}]
    redirect_uris: ["{APP_REDIRECT}"]
    post_logout_redirect_uris: ["{APP_SIGNED_OUT}"]"""

        config = server_and_store(port, f"{workdir}/fc-gatehouse.sqlite") + f"""
upstreams:{upstream("fc", v2, '''
    platform: integration
    acr_values: eidas1
    id_token_signing_alg: ES256
    scopes: [openid, given_name, family_name, birthdate, gender, birthplace, birthcountry]
    identity:
      kind: session
      attributes:
        given_name: /given_name
        birthcountry: /birthcountry''')}{upstream("fc-rs", rs, '''
    id_token_signing_alg: RS256''')}{upstream("fc-jwks", jwks)}{upstream("fc-v1", v1)}
clients:{client(SEALED, "fc")}{client(PASSTHROUGH, "fc", "passthrough")}{client(SEALED_RS, "fc-rs")}{client(SEALED_JWKS, "fc-jwks")}{client(SEALED_V1, "fc-v1")}
routes:
  - prefix: /api/fc
    backend: {backend.url}/fc
    upstream: fc
    identity_headers:
      X-Subject: subject
      X-Given-Name: given_name
      X-Birthcountry: birthcountry
  - prefix: /api/fc-v1
    backend: {backend.url}/fc-v1
    upstream: fc-v1
    identity_headers:
      X-Subject: subject
sessions:
  encryption_keys_file: {keys}
"""
        try:
            with run_gatehouse(workdir, "fc-gatehouse", config, env) as gatehouse:
                yield {"url": base, "gatehouse": {**gatehouse, "url": base}, "backend": backend,
                       "fc": v2, "fc-rs": rs, "fc-jwks": jwks, "fc-v1": v1}
        finally:
            backend.stop()


# --------------------------------------------------------------------------- helpers

def sign_in(fc, seen, client_id, identity=0, cancel=False, nonce=None, browser=None):
    """The app starts a sign-in at Gatehouse; the person picks `identity` on FranceConnect's page
    (or cancels). Returns (app, browser, what the app received on its redirect URI)."""
    app = App(fc["gatehouse"], seen, client_id=client_id)
    browser = browser or fcd.Browser(identity=identity, cancel=cancel)
    location = browser.follow(app.authorize_url(scope=APP_SCOPES, nonce=nonce), APP_REDIRECT)
    assert isinstance(location, str), \
        f"the sign-in stopped at HTTP {location.status_code} ({browser.visited}): {location.text[:300]}"
    received = query(location)
    seen.add(received.get("code"), kind="Gatehouse code")
    return app, browser, received


def signed_in(fc, seen, client_id, identity=0, nonce=None):
    """A completed sign-in: (app, browser, token response JSON)."""
    app, browser, received = sign_in(fc, seen, client_id, identity, nonce=nonce)
    assert set(received) >= {"code", "state"} and "error" not in received, received
    assert received["state"] == app.state
    answer = app.redeem(received["code"])
    assert answer.status_code == 200, answer.text
    return app, browser, answer.json()


def begin_logout(fc, double, browser, seen, client_id, id_token_hint):
    """Gatehouse's RP-initiated logout for an app, up to the redirect toward FranceConnect's
    /session/end: (the app's logout state, that redirect, its query)."""
    logout_state = secrets.token_urlsafe(16)
    url = fc["url"] + "/oauth/logout?" + urlencode({"client_id": client_id, "post_logout_redirect_uri": APP_SIGNED_OUT,
                                                     "state": logout_state, "id_token_hint": id_token_hint})
    first = browser.session.get(url, allow_redirects=False, timeout=10)
    assert first.status_code == 302, first.text
    toward = first.headers["Location"]
    assert toward.startswith(double.issuer + "/session/end?"), toward
    asked = query(toward)
    seen.add(asked.get("state"), kind="Gatehouse logout state toward the upstream")
    return logout_state, toward, asked


def gatehouse_jwks(fc):
    answer = requests.get(fc["url"] + "/.well-known/jwks.json", timeout=10)
    assert answer.status_code == 200
    return answer.json()


def userinfo(fc, access_token, **headers):
    if access_token is not None:
        headers["Authorization"] = f"Bearer {access_token}"
    return requests.get(fc["url"] + "/userinfo", headers=headers, timeout=10)


def failed_sign_in(fc, seen, client_id, double, expected, **fault):
    """Arms `fault` on `double`, signs in; the app must get error=server_error with its own state,
    Gatehouse's `iss` and a description naming `expected`. Returns (stats before, after, received)."""
    before = double.stats()
    double.control(**fault)
    app, _, received = sign_in(fc, seen, client_id)
    after = double.stats()
    assert received.get("error") == "server_error", received
    assert "code" not in received, received
    assert received.get("state") == app.state, received
    assert received.get("iss") == fc["url"], received
    assert expected in received.get("error_description", ""), received
    assert after["pending"] == {"id_token": [], "userinfo": [], "callback": [], "authorize_error": []}, \
        f"the double did not use the fault: {after['pending']}"
    return before, after, received


# --------------------------------------------------------------------------- the double itself

def test_the_franceconnect_double_behaves_as_documented():
    """The double's own self-check (no Gatehouse): every checked request and every fault knob."""
    answer = subprocess.run([sys.executable, str(ROOT / "sandbox/check_franceconnect.py")],
                            capture_output=True, text=True, timeout=300)
    assert answer.returncode == 0, answer.stdout[-2000:] + answer.stderr[-4000:]
    assert re.search(r"^\d+ checks passed, 0 failed$", answer.stdout, re.M), answer.stdout


# --------------------------------------------------------------------------- v2 sign-in

def test_gatehouse_asks_franceconnect_as_documented(fc, seen):
    double = fc["fc"]
    app, _, tokens = signed_in(fc, seen, SEALED)
    asked = double.stats()["authorize"][-1]
    assert asked["outcome"] == "login page", asked
    assert asked["client_id"] == FS_CLIENT["fc"]
    assert asked["redirect_uri"] == fc["url"] + "/oauth/callback"
    assert asked["response_type"] == "code"
    assert asked["acr_values"] == "eidas1"
    assert set(asked["scope"].split()) == set(fcd.PIVOT_SCOPES), asked["scope"]
    assert asked["state_length"] >= 32 and asked["nonce_length"] >= 32, asked
    stats = double.stats()
    assert stats["token_auth_methods"] and set(stats["token_auth_methods"]) == {"client_secret_post"}, \
        stats["token_auth_methods"]


def test_sealed_sign_in_gives_gatehouse_tokens_and_its_own_id_token(fc, seen):
    double = fc["fc"]
    nonce = secrets.token_urlsafe(24)
    before = double.stats()
    app, _, tokens = signed_in(fc, seen, SEALED, identity=0, nonce=nonce)
    after = double.stats()
    assert tokens["access_token"].startswith("gha_") and tokens["refresh_token"].startswith("ghr_"), sorted(tokens)
    assert tokens["token_type"] == "Bearer"
    assert after["token_requests"] == before["token_requests"] + 1
    assert after["userinfo_requests"] == before["userinfo_requests"] + 1  # fetched once, at sign-in
    header, claims = fcd.verify_jws(tokens["id_token"], gatehouse_jwks(fc), algorithms=("ES256",))
    fs_identity = double.identity(FS_CLIENT["fc"], 0)
    assert header["alg"] == "ES256"
    assert claims["iss"] == fc["url"]
    assert claims["aud"] == SEALED
    assert claims["sub"] == fs_identity["sub"]
    assert claims["nonce"] == nonce
    assert claims.get("sid")
    now = time.time()
    assert claims["iat"] <= now + 5 and claims["exp"] > now, claims
    # The upstream's ID token stays sealed: the app's is Gatehouse's, not FranceConnect's.
    upstream_token = tokens["id_token"] in "".join(after["token_responses"])
    assert not upstream_token, "the sealed app got FranceConnect's own ID token"


def test_userinfo_gives_the_pivot_claims_exactly_as_franceconnect_gave_them(fc, seen):
    double = fc["fc"]
    for identity in (0, 1, 2):  # born in Paris, born abroad (empty birthplace), born in Corsica
        app, _, tokens = signed_in(fc, seen, SEALED, identity=identity)
        sub = double.identity(FS_CLIENT["fc"], identity)["sub"]
        given = [p for p in double.stats()["userinfo_payloads"] if json.loads(p)["sub"] == sub]
        assert given, "FranceConnect gave no userinfo for this person"
        before = double.stats()["userinfo_requests"]
        answer = userinfo(fc, tokens["access_token"])
        assert answer.status_code == 200, answer.text
        assert answer.headers["Content-Type"].startswith("application/json")
        assert answer.content == given[-1].encode(), (answer.content, given[-1])  # personal data, no secret
        claims = answer.json()
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", claims["birthdate"])
        assert claims["gender"] in ("male", "female")
        assert re.fullmatch(r"99\d{3}", claims["birthcountry"])
        if claims["birthcountry"] == "99100":
            assert re.fullmatch(r"[0-9][0-9AB]\d{3}", claims["birthplace"]), claims["birthplace"]
        else:
            assert claims["birthplace"] == ""
        assert double.stats()["userinfo_requests"] == before  # served from the session, no call to FranceConnect


def test_userinfo_without_a_token_or_with_a_dead_one_is_401(fc):
    answer = userinfo(fc, None)
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    dead = userinfo(fc, "gha_" + secrets.token_urlsafe(32))
    assert dead.status_code == 401
    assert 'error="invalid_token"' in dead.headers["WWW-Authenticate"], dead.headers


def test_metadata_names_userinfo_and_end_session(fc):
    metadata = requests.get(fc["url"] + "/.well-known/oauth-authorization-server", timeout=10).json()
    assert metadata["userinfo_endpoint"] == fc["url"] + "/userinfo"
    assert metadata["end_session_endpoint"] == fc["url"] + "/oauth/logout"
    assert metadata["jwks_uri"]
    assert metadata["id_token_signing_alg_values_supported"] == ["ES256"]


def test_passthrough_sign_in_hands_on_franceconnects_token_response_as_it_was(fc, seen):
    double = fc["fc"]
    app, browser, tokens = signed_in(fc, seen, PASSTHROUGH, identity=1)
    given = json.loads(double.stats()["token_responses"][-1])
    same = tokens == given  # (compared aside: a failure must not print the tokens)
    assert same, f"Gatehouse answered {sorted(tokens)}, FranceConnect gave {sorted(given)} (or other values)"
    assert "refresh_token" not in tokens
    header, claims = fcd.decode_jws(tokens["id_token"])[0], json.loads(fcd.decode_jws(tokens["id_token"])[1])
    assert header["alg"] == "ES256" and claims["iss"] == double.issuer and claims["aud"] == FS_CLIENT["fc"]

    # Logout with FranceConnect's own ID token as the hint.
    logout_state, toward, asked = begin_logout(fc, double, browser, seen, PASSTHROUGH, tokens["id_token"])
    same_hint = asked["id_token_hint"] == tokens["id_token"]
    assert same_hint, "the hint toward FranceConnect is not the ID token it gave"
    assert asked["post_logout_redirect_uri"] == fc["url"] + "/oauth/logout/callback"
    assert len(asked["state"]) == 43 and asked["state"] != logout_state
    back = browser.follow(toward, APP_SIGNED_OUT)
    assert isinstance(back, str), back
    assert query(back) == {"state": logout_state}
    ended = double.stats()["session_end"][-1]
    assert ended["outcome"] == "redirect" and ended["id_token_hint_issued"] and ended["had_session_cookie"], ended


# --------------------------------------------------------------------------- relay, refresh

def test_relay_takes_the_identity_from_the_session_after_franceconnects_token_expired(fc, seen):
    double, backend = fc["fc"], fc["backend"]
    double.control(access_token_lifetime=2)
    try:
        app, _, tokens = signed_in(fc, seen, SEALED, identity=0)
    finally:
        double.control(access_token_lifetime=60)
    person = double.identity(FS_CLIENT["fc"], 0)
    # FranceConnect's access token (2 s here, 60 s there) is dead before Gatehouse relays anything.
    wait_until(lambda: not double.stats()["last_access_token_alive"], 10, "FranceConnect's access token expired")
    before = double.stats()
    access = tokens["access_token"]
    for path in ("/api/fc/profile", "/api/fc/profile?again=1"):
        answer = requests.get(fc["url"] + path, headers={"Authorization": f"Bearer {access}"}, timeout=10)
        assert answer.status_code == 200, answer.text
        headers = answer.json()["headers"]
        assert headers["x-subject"] == person["sub"]
        assert headers["x-given-name"] == person["given_name"]
        assert headers["x-birthcountry"] == person["birthcountry"]
        assert "authorization" not in headers
    # Gatehouse's own refresh: a new pair from the session, nothing asked of FranceConnect.
    renewed = app.refresh(tokens["refresh_token"])
    assert renewed.status_code == 200, renewed.text
    fresh = renewed.json()["access_token"]
    assert fresh.startswith("gha_") and fresh != access
    answer = requests.get(fc["url"] + "/api/fc/profile", headers={"Authorization": f"Bearer {fresh}"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["headers"]["x-subject"] == person["sub"], answer.text
    after = double.stats()
    assert after["userinfo_requests"] == before["userinfo_requests"], "an identity call per request"
    assert after["token_requests"] == before["token_requests"], "FranceConnect's token endpoint was called"
    assert after["refresh_grants"] == 0


def test_franceconnects_own_access_token_is_refused_on_a_session_route_by_both_relay_paths(fc, seen):
    """A route whose identity comes from the sealed session knows no other caller: FranceConnect's
    access token behind a session (which a backend could see, or the double hands out) is 401,
    even after the session's own token made the relay cache that session's identity."""
    double = fc["fc"]
    app, _, tokens = signed_in(fc, seen, SEALED, identity=0)
    upstream_access = json.loads(double.stats()["token_responses"][-1])["access_token"]
    # The sealed call, twice: the general path, then the fast path, with the identity cached.
    for _ in range(2):
        answer = requests.get(fc["url"] + "/api/fc/profile", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10)
        assert answer.status_code == 200, answer.text
    for path in ("/api/fc/profile", "/api/fc/profile?again=1", "/api/fc/profile"):
        answer = requests.get(fc["url"] + path, headers={"Authorization": f"Bearer {upstream_access}"}, timeout=10)
        assert answer.status_code == 401, f"{path}: {answer.status_code}"
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert 'error="invalid_token"' in answer.headers["WWW-Authenticate"]


# --------------------------------------------------------------------------- logout

def test_sealed_logout_goes_through_franceconnect_and_back(fc, seen):
    double = fc["fc"]
    app, browser, tokens = signed_in(fc, seen, SEALED, identity=0)
    assert browser.cookie(), "FranceConnect set no session cookie"
    person = double.identity(FS_CLIENT["fc"], 0)
    logout_state, toward, asked = begin_logout(fc, double, browser, seen, SEALED, tokens["id_token"])
    assert set(asked) >= {"id_token_hint", "state", "post_logout_redirect_uri"}, sorted(asked)
    assert asked["post_logout_redirect_uri"] == fc["url"] + "/oauth/logout/callback"
    assert len(asked["state"]) == 43 and asked["state"] != logout_state
    own_token = asked["id_token_hint"] == tokens["id_token"]
    assert not own_token, "the hint toward FranceConnect is Gatehouse's ID token, not FranceConnect's"
    back = browser.follow(toward, APP_SIGNED_OUT)
    assert isinstance(back, str), back
    assert query(back) == {"state": logout_state}
    ended = double.stats()["session_end"][-1]
    assert ended["outcome"] == "redirect", ended
    assert ended["id_token_hint_issued"] and ended["sub"] == person["sub"] and ended["client_id"] == FS_CLIENT["fc"], ended
    assert ended["had_session_cookie"], "the browser did not carry FranceConnect's cookie: not a browser redirect"
    assert browser.cookie() is None, "FranceConnect's session cookie survived the logout"
    # The Gatehouse session is over.
    assert userinfo(fc, tokens["access_token"]).status_code == 401
    assert app.refresh(tokens["refresh_token"]).status_code == 400
    # FranceConnect's way back works once.
    replay = requests.get(fc["url"] + "/oauth/logout/callback?" + urlencode({"state": asked["state"]}),
                          headers={"Accept": "text/html"}, allow_redirects=False, timeout=10)
    assert replay.status_code == 400 and "Location" not in replay.headers


def test_logout_callback_with_a_forged_state_is_an_error_page_not_a_redirect(fc):
    forged = secrets.token_urlsafe(32)
    page = requests.get(fc["url"] + "/oauth/logout/callback?" + urlencode({"state": forged}),
                        headers={"Accept": "text/html"}, allow_redirects=False, timeout=10)
    assert page.status_code == 400 and "Location" not in page.headers
    assert page.headers["Content-Type"].startswith("text/html"), page.headers
    problem = requests.get(fc["url"] + "/oauth/logout/callback?" + urlencode({"state": forged}),
                           headers={"Accept": "application/json"}, allow_redirects=False, timeout=10)
    assert problem.status_code == 400 and "Location" not in problem.headers
    assert problem.headers["Content-Type"].startswith("application/problem+json"), problem.headers
    missing = requests.get(fc["url"] + "/oauth/logout/callback", allow_redirects=False, timeout=10)
    assert missing.status_code == 400 and "Location" not in missing.headers


def test_logout_with_an_unregistered_uri_or_a_bad_hint_is_an_error_page(fc, seen):
    double = fc["fc"]
    app, _, tokens = signed_in(fc, seen, SEALED)
    before = len(double.stats()["session_end"])
    good = {"client_id": SEALED, "post_logout_redirect_uri": APP_SIGNED_OUT, "state": secrets.token_urlsafe(16),
            "id_token_hint": tokens["id_token"]}
    head, body, signature = tokens["id_token"].split(".")
    forged_hint = f"{head}.{body}.{signature[:-6]}AAAAAA"
    for name, changed in [("unregistered post_logout_redirect_uri", {"post_logout_redirect_uri": "com.example.app:/elsewhere"}),
                          ("unknown client", {"client_id": "com.example.nobody"}),
                          ("forged id_token_hint", {"id_token_hint": forged_hint}),
                          ("absent id_token_hint", {"id_token_hint": None})]:
        parameters = {k: v for k, v in {**good, **changed}.items() if v is not None}
        answer = requests.get(fc["url"] + "/oauth/logout?" + urlencode(parameters), headers={"Accept": "text/html"},
                              allow_redirects=False, timeout=10)
        assert answer.status_code == 400, f"{name}: {answer.status_code}"
        assert "Location" not in answer.headers, f"{name}: redirected to {answer.headers['Location']}"
        assert answer.headers["Content-Type"].startswith("text/html"), f"{name}: {answer.headers['Content-Type']}"
    assert len(double.stats()["session_end"]) == before, "FranceConnect was asked to log out"
    assert userinfo(fc, tokens["access_token"]).status_code == 200, "a refused logout ended the session"


# --------------------------------------------------------------------------- errors at sign-in

def test_cancelled_sign_in_relays_access_denied_with_the_apps_state(fc, seen):
    double = fc["fc"]
    before = double.stats()
    app, _, received = sign_in(fc, seen, SEALED, cancel=True)
    after = double.stats()
    assert received.get("error") == "access_denied", received
    assert received.get("state") == app.state
    assert "code" not in received
    assert after["cancels"] == before["cancels"] + 1
    assert after["token_requests"] == before["token_requests"]


@pytest.mark.parametrize("error", ["invalid_scope", "invalid_request", "server_error", "temporarily_unavailable"])
def test_franceconnect_callback_errors_are_relayed_with_the_apps_state(fc, seen, error):
    double = fc["fc"]
    double.control(authorize_error=error)
    app, _, received = sign_in(fc, seen, SEALED)
    assert received.get("error") == error, received
    assert received.get("state") == app.state
    assert "code" not in received


def test_an_unknown_kid_is_refused_after_exactly_one_jwks_refetch(fc, seen):
    """Before any other fault on this upstream: no earlier refetch can stand in for this one."""
    double = fc["fc"]
    signed_in(fc, seen, SEALED)  # the JWKS is cached
    before, after, _ = failed_sign_in(fc, seen, SEALED, double, "kid", id_token="unknown_kid")
    assert after["jwks_fetches"] == before["jwks_fetches"] + 1, (before["jwks_fetches"], after["jwks_fetches"])


def test_a_rotated_key_is_found_with_one_jwks_refetch(fc, seen):
    double = fc["fc-rs"]
    signed_in(fc, seen, SEALED_RS)  # the JWKS is cached
    before = double.stats()["jwks_fetches"]
    double.control(id_token="rotated_kid")
    signed_in(fc, seen, SEALED_RS)
    assert double.stats()["jwks_fetches"] == before + 1


def test_hs256_id_token_keyed_with_the_rsa_public_key_is_refused(fc, seen):
    double = fc["fc-rs"]
    signed_in(fc, seen, SEALED_RS)  # RS256 works
    failed_sign_in(fc, seen, SEALED_RS, double, "alg", id_token="hs256_public_key")


def test_an_unreachable_jwks_is_temporarily_unavailable_not_a_sign_in_error(fc, seen):
    double = fc["fc-jwks"]
    double.control(jwks="unavailable", id_token="rotated_kid")
    try:
        app, _, received = sign_in(fc, seen, SEALED_JWKS)
    finally:
        double.control(jwks="available")
    assert received.get("error") == "temporarily_unavailable", received
    assert received.get("state") == app.state and "code" not in received
    assert double.stats()["jwks_fetches"] >= 1


@pytest.mark.parametrize("fault, expected", [
    ("wrong_nonce", "nonce"),
    ("wrong_aud", "aud"),
    ("wrong_iss", "iss"),
    ("alg_none", "alg"),
    ("expired", "exp"),
    ("iat_future", "iat"),
    ("bad_signature", "signature"),
    ("wrong_acr", "acr"),
    ("bad_at_hash", "at_hash"),
    ("multiple_aud", "azp"),
    ("alg_mismatch", "alg"),
])
def test_an_id_token_failing_a_check_is_refused(fc, seen, fault, expected):
    before, after, _ = failed_sign_in(fc, seen, SEALED, fc["fc"], expected, id_token=fault)
    assert after["token_requests"] == before["token_requests"] + 1  # the faulty token was issued and refused


def test_a_bad_userinfo_signature_is_refused(fc, seen):
    failed_sign_in(fc, seen, SEALED, fc["fc"], "userinfo signature", userinfo="bad_signature")


def test_a_userinfo_sub_other_than_the_id_tokens_is_refused(fc, seen):
    failed_sign_in(fc, seen, SEALED, fc["fc"], "userinfo sub", userinfo="other_sub")


def test_a_callback_iss_of_another_upstream_is_refused_before_any_token_request(fc, seen):
    double, other = fc["fc"], fc["fc-rs"]
    other_before = other.stats()["token_requests"]
    before, after, _ = failed_sign_in(fc, seen, SEALED, double, "iss", callback={"iss": other.issuer})
    assert after["token_requests"] == before["token_requests"], "the code went to a token endpoint"
    assert other.stats()["token_requests"] == other_before


# --------------------------------------------------------------------------- v1

def test_v1_sign_in_userinfo_relay_and_logout(fc, seen):
    double = fc["fc-v1"]
    app, browser, tokens = signed_in(fc, seen, SEALED_V1, identity=2)
    person = double.identity(FS_CLIENT["fc-v1"], 2)
    stats = double.stats()
    assert stats["authorize"][-1]["client_id"] == FS_CLIENT["fc-v1"]
    assert set(stats["token_auth_methods"]) == {"client_secret_post"}
    _, claims = fcd.verify_jws(tokens["id_token"], gatehouse_jwks(fc), algorithms=("ES256",))
    assert claims["sub"] == person["sub"] and claims["aud"] == SEALED_V1
    answer = userinfo(fc, tokens["access_token"])
    assert answer.status_code == 200, answer.text
    assert answer.content == stats["userinfo_payloads"][-1].encode()
    relayed = requests.get(fc["url"] + "/api/fc-v1/x", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10)
    assert relayed.status_code == 200 and relayed.json()["headers"]["x-subject"] == person["sub"], relayed.text

    logout_state = secrets.token_urlsafe(16)
    url = fc["url"] + "/oauth/logout?" + urlencode({"client_id": SEALED_V1, "post_logout_redirect_uri": APP_SIGNED_OUT,
                                                    "state": logout_state, "id_token_hint": tokens["id_token"]})
    first = browser.session.get(url, allow_redirects=False, timeout=10)
    assert first.status_code == 302, first.text
    assert first.headers["Location"].startswith(double.issuer + "/logout?"), first.headers["Location"]
    seen.add(query(first.headers["Location"]).get("state"), kind="Gatehouse logout state toward the upstream")
    back = browser.follow(first.headers["Location"], APP_SIGNED_OUT)
    assert isinstance(back, str) and query(back) == {"state": logout_state}, back
    ended = double.stats()["session_end"][-1]
    assert ended["outcome"] == "redirect" and ended["id_token_hint_issued"] and ended["had_session_cookie"], ended


@pytest.mark.parametrize("fault, expected", [("wrong_nonce", "nonce"), ("hs256_wrong_secret", "signature"),
                                             ("alg_none", "alg")])
def test_v1_id_token_failing_a_check_is_refused(fc, seen, fault, expected):
    failed_sign_in(fc, seen, SEALED_V1, fc["fc-v1"], expected, id_token=fault)


# --------------------------------------------------------------------------- the whole module

def test_no_upstream_refresh_was_ever_attempted_and_every_token_request_was_client_secret_post(fc):
    for name in FS_CLIENT:
        stats = fc[name].stats()
        assert stats["token_requests"] > 0, f"{name} saw no token request"
        assert stats["refresh_grants"] == 0, f"{name}: {stats['refresh_grants']} refresh grants"
        assert "unsupported_grant_type" not in stats["token_errors"], name
        assert set(stats["token_auth_methods"]) == {"client_secret_post"}, f"{name}: {stats['token_auth_methods']}"
