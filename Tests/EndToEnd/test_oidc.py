"""The generic `kind: oidc` upstream, end to end, against the real django-oauth-toolkit.

A django-oauth-toolkit of this module's own (sandbox/dot/serve.py, OIDC on) has two
applications: `gatehouse-oidc` signs its ID tokens RS256 (the key in its JWKS),
`gatehouse-hs256` HS256 with its client secret (FranceConnect v1's scheme). It serves
discovery at {issuer}/.well-known/openid-configuration with issuer http://HOST:PORT/o, puts
`nonce` and `at_hash` in its ID tokens, issues refresh tokens and has no end-session endpoint.

A Gatehouse of this module's own (SQLite) has, toward it:

    dot                  oidc, RS256 pinned, identity {kind: session}
    dot-hs256            oidc, HS256 pinned (the client secret is the key)
    dot-hs256-as-rs256   the HS256 application, but RS256 pinned: its ID tokens must be refused

and a second Gatehouse whose upstream's discovery document names another issuer than the
configured one (a proxy in front of the same DOT: the document is DOT's, the configured issuer
the proxy's).

What the app sees is checked against what DOT itself answers: the userinfo JSON DOT gives
for the same user and scopes (fetched directly from DOT, not through Gatehouse), the ID
tokens DOT issued (the secrets record of serve.py), DOT's own JWKS and client secret.
"""

import base64
import json
import re
import secrets
import time
from urllib.parse import urlencode, urlsplit

import pytest
import requests
from jwcrypto import jwk, jwt

from sandbox.backends import EchoBackend
from sandbox.nativeapp import APP_REDIRECT, PASSWORD, USERNAME, App, InAppBrowser, free_port, pkce_pair, query
from sandbox.stubserver import StubHandler, StubServer
from processes import run_gatehouse, run_upstream, session_keys
from sandbox.gatehouse import server_and_store

SCOPES = "openid profile email"
POST_LOGOUT = "com.example.app:/signed-out"
USERS = [{"username": USERNAME, "password": PASSWORD, "email": "alice@example.test",
          "first_name": "Alice", "last_name": "Liddell"}]


# --- the upstream, the Gatehouse, the app -------------------------------------------------


def b64url_json(segment):
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def jose_header(token):
    return b64url_json(token.split(".")[0])


def jose_payload(token):
    return b64url_json(token.split(".")[1])


class OidcApp(App):
    """The native app, asking for OpenID scopes and sending its own nonce."""

    def __init__(self, gatehouse, seen, client_id, nonce="own"):
        super().__init__(gatehouse, seen, client_id=client_id)
        self.nonce = secrets.token_urlsafe(24) if nonce == "own" else nonce

    def authorize_url(self, **overrides):
        return super().authorize_url(**{"scope": SCOPES, "nonce": self.nonce, **overrides})


class DiscoveryProxy(StubServer):
    """Forwards every GET to `target` (with `target`'s own Host), counting the paths asked.
    In front of DOT, DOT's discovery document names DOT's issuer, not this proxy's."""

    class Handler(StubHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            answer = requests.get(self.stub.target + self.path, timeout=10)
            try:
                document = answer.json()
            except ValueError:
                document = None
            self.stub.record((urlsplit(self.path).path, answer.status_code, document))
            self.reply(answer.status_code, answer.content, answer.headers.get("Content-Type", "application/json"))

    def __init__(self, target):
        self.target = target
        super().__init__()
        self.lock, self.answered = self.condition, self.received  # (path, status, JSON body or None)


def oidc_upstream(name, issuer, client_id, alg, extra=""):
    return f"""
  - name: {name}
    kind: oidc
    issuer: {issuer}
    client_id: {client_id}
    client_secret_env: UPSTREAM_SECRET_LEGACY
    id_token_signing_alg: {alg}
    scopes: [openid, profile, email]
    timeout: 10s{extra}"""


def client(client_id, upstream, exposure="sealed", wiring="callback"):
    return f"""
  - client_id: {client_id}
    upstream: {upstream}
    wiring: {wiring}
    token_exposure: {exposure}
    scopes: [openid, profile, email]
    redirect_uris: ["{APP_REDIRECT}"]
    post_logout_redirect_uris: ["{POST_LOGOUT}"]"""


@pytest.fixture(scope="module")
def oidc(workdir, seen):
    port = free_port()
    callback = f"http://127.0.0.1:{port}/oauth/callback"
    # Both applications share the one secret run_upstream makes (32 characters: enough for HS256).
    applications = [
        {"client_id": "gatehouse-oidc", "client_secret_env": "UPSTREAM_SECRET_LEGACY", "algorithm": "RS256",
         "redirect_uris": [callback, APP_REDIRECT], "pkce_required": True},
        {"client_id": "gatehouse-hs256", "client_secret_env": "UPSTREAM_SECRET_LEGACY", "algorithm": "HS256",
         "redirect_uris": [callback, APP_REDIRECT], "pkce_required": True},
    ]
    backend = EchoBackend()
    with run_upstream(workdir, "upstream-oidc", seen, [callback], users=USERS, applications=applications) as up:
        issuer = up["url"] + "/o"
        config = server_and_store(port, f"{workdir}/oidc.sqlite") + f"""
upstreams:{oidc_upstream("dot", issuer, "gatehouse-oidc", "RS256", '''
    identity:
      kind: session
      attributes: {given_name: /given_name, email: /email}''')}{oidc_upstream("dot-hs256", issuer, "gatehouse-hs256", "HS256")}{oidc_upstream("dot-hs256-as-rs256", issuer, "gatehouse-hs256", "RS256")}
clients:{client("com.example.oidc", "dot")}{client("com.example.oidc.passthrough", "dot", "passthrough")}{client("com.example.oidc.relay", "dot", wiring="relay")}{client("com.example.hs256", "dot-hs256")}{client("com.example.hs256.passthrough", "dot-hs256", "passthrough")}{client("com.example.pinned", "dot-hs256-as-rs256")}{client("com.example.pinned.relay", "dot-hs256-as-rs256", wiring="relay")}
routes:
  - prefix: /api/oidc
    backend: {backend.url}/oidc
    methods: [GET]
    upstream: dot
    identity_headers:
      X-Subject: subject
      X-Given-Name: given_name
      X-Email: email
sessions:
  encryption_keys_file: {session_keys(workdir, "oidc-session-keys", seen)}
"""
        try:
            with run_gatehouse(workdir, "oidc", config, up["env"]) as process:
                yield {**process, "url": f"http://127.0.0.1:{port}", "upstream": up, "issuer": issuer,
                       "secret": up["env"]["UPSTREAM_SECRET_LEGACY"], "backend": backend, "userinfo": {}}
        finally:
            backend.stop()


def dot_direct(oidc, seen, client_id):
    """Signs alice in at DOT itself (no Gatehouse) with `client_id` and SCOPES: DOT's token
    response and the userinfo response DOT gives for it (cached per client)."""
    if client_id in oidc["userinfo"]:
        return oidc["userinfo"][client_id]
    up = oidc["upstream"]["url"]
    verifier, challenge = pkce_pair()
    url = up + "/o/authorize/?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": APP_REDIRECT, "scope": SCOPES,
        "state": secrets.token_urlsafe(16), "code_challenge": challenge, "code_challenge_method": "S256"})
    location = InAppBrowser(seen=seen).follow(url, APP_REDIRECT)
    assert isinstance(location, str), location
    tokens = requests.post(up + "/o/token/", data={"grant_type": "authorization_code", "code": query(location)["code"],
                                                   "redirect_uri": APP_REDIRECT, "code_verifier": verifier},
                           auth=(client_id, oidc["secret"]), timeout=10)
    assert tokens.status_code == 200, tokens.text
    body = tokens.json()
    seen.add(body["access_token"], kind="upstream access token")
    seen.add(body["refresh_token"], kind="upstream refresh token")
    seen.add(body["id_token"], kind="upstream ID token")
    userinfo = requests.get(up + "/o/userinfo/", headers={"Authorization": f"Bearer {body['access_token']}"}, timeout=10)
    assert userinfo.status_code == 200, userinfo.text
    assert userinfo.json()["given_name"] == "Alice" and userinfo.json()["email"] == "alice@example.test"
    oidc["userinfo"][client_id] = (body, userinfo)
    return body, userinfo


def dot_userinfo(oidc, seen, client_id="gatehouse-oidc"):
    """The bytes of DOT's userinfo answer for alice, SCOPES and `client_id`."""
    return dot_direct(oidc, seen, client_id)[1].content


def dot_sub(oidc, seen):
    return json.loads(dot_userinfo(oidc, seen))["sub"]


def gatehouse_userinfo(oidc, access_token):
    return requests.get(oidc["url"] + "/userinfo", headers={"Authorization": f"Bearer {access_token}"}, timeout=10)


def gatehouse_id_token(oidc, token):
    """Gatehouse's ID token verified with its /.well-known/jwks.json: (header, claims)."""
    keys = requests.get(oidc["url"] + "/.well-known/jwks.json", timeout=10)
    assert keys.status_code == 200, keys.text
    verified = jwt.JWT(jwt=token, key=jwk.JWKSet.from_json(keys.text), algs=["ES256"])
    return json.loads(verified.header), json.loads(verified.claims)


def assert_gatehouse_id_token(oidc, seen, token, client_id, nonce):
    header, claims = gatehouse_id_token(oidc, token)
    assert header["alg"] == "ES256"
    assert claims["iss"] == oidc["url"]
    assert claims["aud"] in (client_id, [client_id]), claims["aud"]
    assert claims["sub"] == dot_sub(oidc, seen)
    assert claims["nonce"] == nonce
    assert isinstance(claims["sid"], str) and claims["sid"]
    now = time.time()
    assert claims["iat"] <= now + 5 and claims["exp"] > now, claims
    return claims


def sealed_sign_in(oidc, seen, client_id="com.example.oidc"):
    app = OidcApp(oidc, seen, client_id)
    received = app.sign_in()
    assert received.get("state") == app.state, received
    assert received.get("iss") == oidc["url"], received
    assert "error" not in received, received
    answer = app.redeem(received["code"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["access_token"].startswith("gha_") and body["refresh_token"].startswith("ghr_"), body.keys()
    return app, body


def upstream_id_tokens_since(seen, count, oidc):
    """The ID tokens this module's DOT answered after the first `count` the run's upstreams
    answered (serve.py's record, shared by every upstream of the run)."""
    return [token for token in seen.recorded("upstream ID token")[count:] if jose_payload(token).get("iss") == oidc["issuer"]]


# --- sealed, callback wiring --------------------------------------------------------------


def test_sealed_sign_in_gives_gatehouse_id_token_with_the_app_nonce_and_dot_sub(oidc, seen):
    issued_before = len(seen.recorded("upstream ID token"))
    app, body = sealed_sign_in(oidc, seen)
    issued = upstream_id_tokens_since(seen, issued_before, oidc)
    assert_gatehouse_id_token(oidc, seen, body["id_token"], "com.example.oidc", app.nonce)
    # Gatehouse's own token, not DOT's: DOT issued one ID token (RS256), which the app never saw.
    assert len(issued) == 1 and jose_header(issued[0])["alg"] == "RS256"
    assert body["id_token"] != issued[0]
    assert jose_payload(issued[0]).get("nonce")  # Gatehouse sent DOT a nonce of the transaction


def test_sealed_userinfo_is_dot_userinfo_exactly(oidc, seen):
    _, body = sealed_sign_in(oidc, seen)
    answer = gatehouse_userinfo(oidc, body["access_token"])
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"].startswith("application/json")
    expected = dot_userinfo(oidc, seen)
    assert answer.json() == json.loads(expected)
    assert answer.content == expected


def test_sealed_refresh_through_gatehouse_works_and_the_new_token_reads_userinfo(oidc, seen):
    app, body = sealed_sign_in(oidc, seen)
    refreshed = app.refresh(body["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    pair = refreshed.json()
    assert pair["access_token"].startswith("gha_") and pair["access_token"] != body["access_token"]
    assert pair["refresh_token"].startswith("ghr_") and pair["refresh_token"] != body["refresh_token"]
    answer = gatehouse_userinfo(oidc, pair["access_token"])
    assert answer.status_code == 200, answer.text
    assert answer.content == dot_userinfo(oidc, seen)
    again = app.refresh(pair["refresh_token"])
    assert again.status_code == 200, again.text


def test_a_route_takes_the_identity_from_the_session_userinfo(oidc, seen):
    _, body = sealed_sign_in(oidc, seen)
    answer = requests.get(oidc["url"] + "/api/oidc/whoami", headers={"Authorization": f"Bearer {body['access_token']}"},
                          timeout=10)
    assert answer.status_code == 200, answer.text
    headers = answer.json()["headers"]
    assert headers["x-subject"] == dot_sub(oidc, seen)
    assert headers["x-given-name"] == "Alice"
    assert headers["x-email"] == "alice@example.test"
    assert "authorization" not in headers  # the default: the app's token is not relayed


# --- passthrough ------------------------------------------------------------------------


def test_passthrough_gets_dot_token_response_with_dot_id_token_as_issued(oidc, seen):
    app = OidcApp(oidc, seen, "com.example.oidc.passthrough")
    issued_before = len(seen.recorded("upstream ID token"))
    received = app.sign_in()
    assert received.get("state") == app.state and "error" not in received, received
    answer = app.redeem(received["code"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) >= {"access_token", "refresh_token", "id_token", "token_type", "expires_in", "scope"}, body.keys()
    assert not body["access_token"].startswith("gha_") and not body["refresh_token"].startswith("ghr_")
    assert sorted(body["scope"].split()) == sorted(SCOPES.split())
    # The ID token is the one DOT issued, byte for byte, signed with DOT's RS256 key.
    assert upstream_id_tokens_since(seen, issued_before, oidc) == [body["id_token"]]
    assert body["access_token"] in seen.recorded("upstream access token")
    up = oidc["upstream"]["url"]
    dot_keys = jwk.JWKSet.from_json(requests.get(up + "/o/.well-known/jwks.json", timeout=10).text)
    verified = jwt.JWT(jwt=body["id_token"], key=dot_keys, algs=["RS256"])
    claims = json.loads(verified.claims)
    assert claims["iss"] == oidc["issuer"]
    assert claims["aud"] in ("gatehouse-oidc", ["gatehouse-oidc"])
    assert claims["sub"] == dot_sub(oidc, seen)
    assert claims.get("nonce") and claims.get("at_hash")
    # DOT's own tokens: its access token reads DOT's userinfo, its refresh token refreshes through Gatehouse.
    userinfo = requests.get(up + "/o/userinfo/", headers={"Authorization": f"Bearer {body['access_token']}"}, timeout=10)
    assert userinfo.content == dot_userinfo(oidc, seen)
    refreshed = app.refresh(body["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    pair = refreshed.json()
    assert pair["refresh_token"] != body["refresh_token"] and pair["access_token"] != body["access_token"]
    assert pair["access_token"] in seen.recorded("upstream access token")
    again = requests.get(up + "/o/userinfo/", headers={"Authorization": f"Bearer {pair['access_token']}"}, timeout=10)
    assert again.status_code == 200, again.text


# --- relay wiring -----------------------------------------------------------------------


def test_relay_wiring_signs_in_and_gives_gatehouse_id_token(oidc, seen):
    app = OidcApp(oidc, seen, "com.example.oidc.relay")
    received = app.sign_in()
    assert "error" not in received, received
    assert received["state"] != app.state  # DOT sent the browser straight to the app, with Gatehouse's state
    answer = app.redeem(received["code"], state=received["state"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["access_token"].startswith("gha_") and body["refresh_token"].startswith("ghr_")
    assert_gatehouse_id_token(oidc, seen, body["id_token"], "com.example.oidc.relay", app.nonce)
    userinfo = gatehouse_userinfo(oidc, body["access_token"])
    assert userinfo.status_code == 200 and userinfo.content == dot_userinfo(oidc, seen)
    refreshed = app.refresh(body["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text


# --- HS256 (FranceConnect v1's scheme) ----------------------------------------------------


def test_hs256_upstream_signs_in_sealed(oidc, seen):
    issued_before = len(seen.recorded("upstream ID token"))
    app, body = sealed_sign_in(oidc, seen, "com.example.hs256")
    issued = upstream_id_tokens_since(seen, issued_before, oidc)
    assert len(issued) == 1 and jose_header(issued[0])["alg"] == "HS256"  # really an HS256 ID token
    assert_gatehouse_id_token(oidc, seen, body["id_token"], "com.example.hs256", app.nonce)
    answer = gatehouse_userinfo(oidc, body["access_token"])
    assert answer.status_code == 200, answer.text
    assert answer.content == dot_userinfo(oidc, seen, "gatehouse-hs256")


def test_hs256_upstream_passthrough_gets_dot_hs256_id_token(oidc, seen):
    app = OidcApp(oidc, seen, "com.example.hs256.passthrough")
    received = app.sign_in()
    assert received.get("state") == app.state and "error" not in received, received
    answer = app.redeem(received["code"])
    assert answer.status_code == 200, answer.text
    token = answer.json()["id_token"]
    assert jose_header(token)["alg"] == "HS256"
    verified = jwt.JWT(jwt=token, key=jwk.JWK.from_password(oidc["secret"]), algs=["HS256"])
    claims = json.loads(verified.claims)
    assert claims["aud"] in ("gatehouse-hs256", ["gatehouse-hs256"]) and claims["sub"] == dot_sub(oidc, seen)


def test_hs256_id_token_is_refused_when_the_upstream_is_pinned_to_rs256(oidc, seen):
    issued_before = len(seen.recorded("upstream ID token"))
    app = OidcApp(oidc, seen, "com.example.pinned")
    received = app.sign_in()
    # DOT did issue its (HS256) ID token to Gatehouse: the refusal is Gatehouse's.
    issued = upstream_id_tokens_since(seen, issued_before, oidc)
    assert len(issued) == 1 and jose_header(issued[0])["alg"] == "HS256"
    assert "code" not in received, received
    assert received["error"] == "server_error", received
    assert "alg" in received.get("error_description", ""), received
    assert received["state"] == app.state
    assert received["iss"] == oidc["url"]


def test_hs256_id_token_is_refused_in_relay_wiring_when_pinned_to_rs256(oidc, seen):
    app = OidcApp(oidc, seen, "com.example.pinned.relay")
    received = app.sign_in()
    assert received["state"] != app.state and "code" in received, received
    issued_before = len(seen.recorded("upstream ID token"))
    answer = app.redeem(received["code"], state=received["state"])
    issued = upstream_id_tokens_since(seen, issued_before, oidc)
    assert len(issued) == 1 and jose_header(issued[0])["alg"] == "HS256"
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"] == "server_error"
    assert "alg" in answer.json().get("error_description", ""), answer.text
    assert "access_token" not in answer.json() and "id_token" not in answer.json()


# --- metadata and /userinfo ------------------------------------------------------------------


def test_metadata_names_userinfo_end_session_and_jwks(oidc):
    base = oidc["url"]
    document = requests.get(base + "/.well-known/oauth-authorization-server", timeout=10).json()
    assert document["issuer"] == base
    assert document["userinfo_endpoint"] == base + "/userinfo"
    assert document["end_session_endpoint"] == base + "/oauth/logout"
    assert document["jwks_uri"] == base + "/.well-known/jwks.json"
    assert document["id_token_signing_alg_values_supported"] == ["ES256"]
    keys = requests.get(document["jwks_uri"], timeout=10)
    assert keys.status_code == 200
    assert [key["kty"] for key in keys.json()["keys"]] and all(key["kty"] == "EC" for key in keys.json()["keys"])
    assert all("d" not in key for key in keys.json()["keys"])  # public keys only


def test_an_unmodified_appauth_app_discovers_gatehouse_and_validates_its_id_token(oidc, seen):
    """What AppAuth-iOS (`discoverServiceConfigurationForIssuer:`) and AppAuth-Android
    (`fetchFromIssuer`) do: fetch only {issuer}/.well-known/openid-configuration, take the
    endpoints from it, and check the ID token's issuer, audience, iat skew and nonce; the
    signature is checked here too (authlib, with the keys of the document's jwks_uri)."""
    from authlib.oidc.core import CodeIDToken
    from joserfc import jwt as jose_jwt
    from joserfc.errors import InvalidClaimError
    from joserfc.jwk import KeySet
    issuer = oidc["url"]
    answer = requests.get(issuer + "/.well-known/openid-configuration", timeout=10)
    assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("application/json"), answer.text
    document = answer.json()
    assert document["issuer"] == issuer
    for member in ("authorization_endpoint", "token_endpoint", "jwks_uri", "response_types_supported", "subject_types_supported",
                   "id_token_signing_alg_values_supported", "userinfo_endpoint", "end_session_endpoint"):
        assert document.get(member), member
    # The same endpoints as RFC 8414's document.
    oauth = requests.get(issuer + "/.well-known/oauth-authorization-server", timeout=10).json()
    assert {key: document[key] for key in oauth} == oauth
    app = OidcApp(oidc, seen, "com.example.oidc")
    received = app.sign_in()
    tokens = requests.post(document["token_endpoint"], timeout=10, data={
        "grant_type": "authorization_code", "client_id": app.client_id, "code": received["code"],
        "redirect_uri": app.redirect_uri, "code_verifier": app.verifier}).json()
    seen.add(tokens["access_token"], tokens["refresh_token"], kind="Gatehouse access token")
    keys = KeySet.import_key_set(requests.get(document["jwks_uri"], timeout=10).json())
    token = jose_jwt.decode(tokens["id_token"], keys, algorithms=document["id_token_signing_alg_values_supported"])
    options = {"iss": {"essential": True, "value": document["issuer"]}, "aud": {"essential": True, "value": app.client_id},
               "nonce": {"essential": True, "value": app.nonce}}
    CodeIDToken(token.claims, token.header, options=options).validate(leeway=60)
    assert abs(token.claims["iat"] - time.time()) < 600  # AppAuth's iat skew
    assert token.claims["sub"] == dot_sub(oidc, seen)
    for wrong in ({"nonce": {"essential": True, "value": "another nonce"}}, {"aud": {"essential": True, "value": "another.app"}},
                  {"iss": {"essential": True, "value": "https://elsewhere.example"}}):
        with pytest.raises(InvalidClaimError):
            CodeIDToken(token.claims, token.header, options={**options, **wrong}).validate(leeway=60)


def test_the_openid_configuration_passes_an_rp_librarys_validation_behind_https(oidc, workdir):
    """Discovery 1.0 §3 as authlib's OpenIDProviderMetadata checks it (https everywhere, so
    Gatehouse runs behind a TLS proxy here: its public_base_url is https). The one rule it
    fails, and says so, is that RS256 be listed: Gatehouse signs its ID tokens with ES256."""
    from authlib.oidc.discovery import OpenIDProviderMetadata
    port = free_port()
    text = oidc["config"].read_text()
    text = re.sub(r"public_base_url: http://127\.0\.0\.1:\d+", "public_base_url: https://gatehouse.example.test", text)
    text = re.sub(r"^  port: \d+$", f"  port: {port}", text, flags=re.MULTILINE)
    text = text.replace(f"{workdir}/oidc.sqlite", f"{workdir}/oidc-https.sqlite")
    with run_gatehouse(workdir, "oidc-https", text, oidc["upstream"]["env"]) as behind_tls:
        document = requests.get(f"http://127.0.0.1:{port}/.well-known/openid-configuration", timeout=10).json()
        assert document["issuer"] == "https://gatehouse.example.test"
        metadata = OpenIDProviderMetadata(document)
        for name in dir(metadata):
            if name.startswith("validate_") and name != "validate_id_token_signing_alg_values_supported":
                getattr(metadata, name)()
        with pytest.raises(ValueError, match="RS256"):
            metadata.validate()
        assert behind_tls["process"].poll() is None


def test_userinfo_without_a_token_asks_for_one(oidc):
    answer = requests.get(oidc["url"] + "/userinfo", timeout=10)
    assert answer.status_code == 401
    challenge = answer.headers["WWW-Authenticate"]
    assert challenge.split()[0] == "Bearer" and "error=" not in challenge  # RFC 6750 §3.1: no error without a token


def test_userinfo_with_an_unknown_token_is_invalid_token(oidc):
    answer = gatehouse_userinfo(oidc, "gha_" + secrets.token_urlsafe(32))
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert 'error="invalid_token"' in answer.headers["WWW-Authenticate"]


# --- logout -------------------------------------------------------------------------------------


def logout(oidc, accept=None, **parameters):
    headers = {"Accept": accept} if accept else {}
    return requests.get(oidc["url"] + "/oauth/logout?" + urlencode(parameters), headers=headers,
                        allow_redirects=False, timeout=10)


def test_logout_without_an_upstream_end_session_endpoint_goes_straight_to_the_app_and_ends_the_session(oidc, seen):
    app, body = sealed_sign_in(oidc, seen)
    assert gatehouse_userinfo(oidc, body["access_token"]).status_code == 200  # alive before
    state = secrets.token_urlsafe(16)
    answer = logout(oidc, client_id=app.client_id, post_logout_redirect_uri=POST_LOGOUT, state=state,
                    id_token_hint=body["id_token"])
    assert answer.status_code == 302, answer.text
    location = answer.headers["Location"]
    assert location.split("?")[0] == POST_LOGOUT  # DOT has no end_session_endpoint: straight back to the app
    assert query(location)["state"] == state
    dead = gatehouse_userinfo(oidc, body["access_token"])
    assert dead.status_code == 401, dead.text
    assert 'error="invalid_token"' in dead.headers["WWW-Authenticate"]
    refreshed = app.refresh(body["refresh_token"])
    assert refreshed.status_code == 400, refreshed.text
    assert refreshed.json()["error"] == "invalid_grant"
    assert "access_token" not in refreshed.json()


def forged(token):
    """`token` with one character of its signature changed."""
    head, payload, signature = token.split(".")
    middle = len(signature) // 2
    swapped = "A" if signature[middle] != "A" else "B"
    return ".".join([head, payload, signature[:middle] + swapped + signature[middle + 1:]])


REFUSED_LOGOUTS = {
    "unregistered post-logout URI": lambda app, body: {"client_id": app.client_id, "id_token_hint": body["id_token"],
                                                       "post_logout_redirect_uri": "com.example.app:/elsewhere"},
    "post-logout URI of the redirect URI": lambda app, body: {"client_id": app.client_id, "id_token_hint": body["id_token"],
                                                              "post_logout_redirect_uri": APP_REDIRECT},
    "unknown client": lambda app, body: {"client_id": "com.example.unknown", "id_token_hint": body["id_token"],
                                         "post_logout_redirect_uri": POST_LOGOUT},
    "no id_token_hint": lambda app, body: {"client_id": app.client_id, "post_logout_redirect_uri": POST_LOGOUT},
    "forged id_token_hint": lambda app, body: {"client_id": app.client_id, "id_token_hint": forged(body["id_token"]),
                                               "post_logout_redirect_uri": POST_LOGOUT},
}


@pytest.mark.parametrize("case", sorted(REFUSED_LOGOUTS))
def test_refused_logout_is_an_error_page_never_a_redirect_and_the_session_lives_on(oidc, seen, case):
    app, body = sealed_sign_in(oidc, seen)
    parameters = {**REFUSED_LOGOUTS[case](app, body), "state": secrets.token_urlsafe(16)}
    page = logout(oidc, accept="text/html,application/xhtml+xml,*/*;q=0.8", **parameters)
    assert page.status_code == 400, page.text
    assert "Location" not in page.headers
    assert page.headers["Content-Type"].startswith("text/html")
    problem = logout(oidc, **parameters)
    assert problem.status_code == 400, problem.text
    assert "Location" not in problem.headers
    assert problem.headers["Content-Type"].startswith("application/problem+json")
    assert problem.json()["status"] == 400
    # Refused: the session was not ended.
    alive = gatehouse_userinfo(oidc, body["access_token"])
    assert alive.status_code == 200, alive.text
    assert app.refresh(body["refresh_token"]).status_code == 200


# --- discovery naming another issuer ---------------------------------------------------------


@pytest.fixture(scope="module")
def mismatched(oidc, workdir, seen):
    """A Gatehouse whose oidc upstream is configured with the proxy's issuer, while the
    discovery document served there (DOT's own) names DOT's."""
    proxy = DiscoveryProxy(oidc["upstream"]["url"])
    port = free_port()
    config = server_and_store(port, f"{workdir}/oidc-mismatch.sqlite") + f"""
upstreams:{oidc_upstream("elsewhere", proxy.url + "/o", "gatehouse-oidc", "RS256")}
clients:{client("com.example.mismatch", "elsewhere")}
sessions:
  encryption_keys_file: {session_keys(workdir, "oidc-session-keys", seen)}
"""
    try:
        with run_gatehouse(workdir, "oidc-mismatch", config, oidc["upstream"]["env"]) as process:
            yield {**process, "url": f"http://127.0.0.1:{port}", "proxy": proxy}
    finally:
        proxy.stop()


def test_discovery_naming_another_issuer_fails_sign_in_with_server_error(mismatched, seen):
    app = OidcApp(mismatched, seen, "com.example.mismatch")
    answer = requests.get(app.authorize_url(), allow_redirects=False, timeout=20)
    assert answer.status_code == 302, answer.text
    location = answer.headers["Location"]
    assert location.startswith(APP_REDIRECT), location  # never sent to the upstream
    received = query(location)
    assert received["error"] == "server_error", received
    assert received["state"] == app.state
    assert received["iss"] == mismatched["url"]
    # Gatehouse did read the discovery document, which named DOT's issuer, not the configured one.
    with mismatched["proxy"].lock:
        discovery = [entry for entry in mismatched["proxy"].answered if entry[0] == "/o/.well-known/openid-configuration"]
    assert discovery, mismatched["proxy"].answered
    assert all(status == 200 and document["issuer"] != mismatched["proxy"].url + "/o" for _, status, document in discovery)
