"""Gatehouse authenticating to its upstreams with private_key_jwt (RFC 7523 §2.2), mutual
TLS (RFC 8705: tls_client_auth, self_signed_tls_client_auth) and pushing its authorization
requests (RFC 9126), end to end against sandbox/modern (authlib's server side, with PAR
and mTLS written from their RFCs; its own tests are test_modern_upstream_double.py).

Every assertion is on what the double recorded on the wire (its /_test/log): which listener, which
client authentication method, the client assertion's header and claims, the client certificate's
thumbprint, the parameters pushed and those the browser carried. Gatehouse's word is not taken.

Three doubles (HTTPS, a test CA that Gatehouse trusts through `ca_file`):

    modern    PAR optional. Clients: gatehouse-es (ES256, aud issuer), gatehouse-ps (PS256, aud the
              endpoint posted to, as idpyoidc checks; Gatehouse's audience: token_endpoint),
              gatehouse-plain (an oauth2 upstream without issuer: aud the endpoint), gatehouse-rotation (two keys, read from Gatehouse's jwks_uri),
              gatehouse-mtls (tls_client_auth), gatehouse-self (self_signed_tls_client_auth, its
              certificate read from Gatehouse's jwks_uri), gatehouse-wrong-key (registers a key
              Gatehouse does not have), gatehouse-untrusted (tls_client_auth; Gatehouse presents a
              certificate of a CA the double does not trust), gatehouse-long (accepts assertions
              of 30 s at most; Gatehouse's live 60 s)
    par       require_pushed_authorization_requests: gatehouse-par (private_key_jwt),
              gatehouse-par-mtls (tls_client_auth), gatehouse-par-never (Gatehouse told never to push),
              gatehouse-par-endpoint (aud the endpoint posted to; Gatehouse's audience: endpoint, served
              by a second Gatehouse, `endpoint_audience`)
    skewed    its clock 10 minutes ahead: every assertion Gatehouse signs is expired there

and one Gatehouse (SQLite) with an upstream per double client, and per upstream a sealed app
(com.example.NAME) and a passthrough app (com.example.NAME.pt, whose every refresh is an
upstream refresh).
"""

import base64
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from modernupstream import (ASSERTION_TYPE, CLIENT_DN, Pki, b64url, b64url_json, certificate_thumbprint, double_config,
                            entries, assertion_checks, thumbprint)
from sandbox.modern import run as run_modern
from sandbox.nativeapp import APP_REDIRECT, App, InAppBrowser, free_port, query
from processes import run_gatehouse, session_keys
from sandbox.gatehouse import gatehouse_binary, server_and_store

SCOPES = "openid profile email"
PRIVATE_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
#: What an app may be told when its sign-in fails upstream (RFC 6749 §4.1.2.1).
SIGN_IN_ERRORS = {"server_error", "temporarily_unavailable", "access_denied", "invalid_request", "unauthorized_client"}


# --- the doubles and the Gatehouse ------------------------------------------------------------------


def double_client(client_id, method, callback, **extra):
    return {"client_id": client_id, "token_endpoint_auth_method": method, "redirect_uris": [callback],
            "scopes": ["openid", "profile", "email"], **extra}


def pkjwt_upstream(name, double, pki, client_id, keys, algorithm=None, audience=None, lifetime=None, par=None, ca=True):
    lines = [f"      keys: [{', '.join(str(key) for key in keys)}]"]
    if algorithm:
        lines.append(f"      algorithm: {algorithm}")
    if audience:
        lines.append(f"      audience: {audience}")
    if lifetime:
        lines.append(f"      lifetime: {lifetime}")
    assertion = "\n".join(lines)
    trust = f"\n    ca_file: {pki.server_ca}" if ca else ""
    return f"""
  - name: {name}
    kind: oidc
    issuer: {double["url"]}{trust}
    client_id: {client_id}
    client_auth: private_key_jwt
    client_assertion:
{assertion}{f'''
    pushed_authorization_requests: {par}''' if par else ''}
    id_token_signing_alg: RS256
    scopes: [openid, profile, email]
    timeout: 10s"""


def certificate_upstream(name, double, pki, client_id, method, certificate, key, par=None):
    return f"""
  - name: {name}
    kind: oidc
    issuer: {double["url"]}
    ca_file: {pki.server_ca}
    client_id: {client_id}
    client_auth: {method}
    client_certificate:
      certificate: {certificate}
      key: {key}{f'''
    pushed_authorization_requests: {par}''' if par else ''}
    id_token_signing_alg: RS256
    scopes: [openid, profile, email]
    timeout: 10s"""


def apps(name):
    return "".join(f"""
  - client_id: com.example.{name}{suffix}
    upstream: {name}
    wiring: callback
    token_exposure: {exposure}
    scopes: [openid, profile, email]
    redirect_uris: ["{APP_REDIRECT}"]""" for suffix, exposure in (("", "sealed"), (".pt", "passthrough")))


@pytest.fixture(scope="module")
def pki(workdir, seen):
    return Pki.recorded(workdir / "modern-pki", seen)


@pytest.fixture(scope="module")
def setup(workdir, seen, pki):
    port, metrics_port, endpoint_port = free_port(), free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    callback = f"{base}/oauth/callback"
    endpoint_base = f"http://127.0.0.1:{endpoint_port}"

    def jwks_uri(name):
        return f"{base}/upstreams/{name}/jwks.json"

    own = {name: pki.assertion_key(name) for name in ("rotation-old", "wrong-key", "long", "par", "par-never", "expired", "no-ca",
                                                      "par-endpoint")}

    modern_clients = [
        double_client("gatehouse-es", "private_key_jwt", callback, jwks=pki.jwks(pki.ec_key), assertion_audience="issuer",
                      assertion_algorithms=["ES256"]),
        double_client("gatehouse-ps", "private_key_jwt", callback, jwks=pki.jwks(pki.rsa_key), assertion_audience="endpoint",
                      assertion_algorithms=["PS256"]),
        double_client("gatehouse-rotation", "private_key_jwt", callback, jwks_uri=jwks_uri("rotation"), assertion_audience="issuer"),
        double_client("gatehouse-mtls", "tls_client_auth", callback, tls_client_auth_subject_dn=CLIENT_DN),
        double_client("gatehouse-self", "self_signed_tls_client_auth", callback, jwks_uri=jwks_uri("self-signed")),
        double_client("gatehouse-wrong-key", "private_key_jwt", callback, jwks=pki.jwks(pki.stranger_ec_key), assertion_audience="issuer"),
        double_client("gatehouse-untrusted", "tls_client_auth", callback, tls_client_auth_subject_dn=CLIENT_DN),
        double_client("gatehouse-long", "private_key_jwt", callback, jwks=pki.jwks(own["long"]), assertion_audience="issuer",
                      max_assertion_lifetime=30),
        double_client("gatehouse-plain", "private_key_jwt", callback, jwks=pki.jwks(pki.rsa_key_2), assertion_audience="endpoint",
                      assertion_algorithms=["RS256"], scopes=["profile", "email"]),
    ]
    par_clients = [
        double_client("gatehouse-par", "private_key_jwt", callback, jwks=pki.jwks(own["par"]), assertion_audience="issuer"),
        double_client("gatehouse-par-mtls", "tls_client_auth", callback, tls_client_auth_subject_dn=CLIENT_DN),
        double_client("gatehouse-par-never", "private_key_jwt", callback, jwks=pki.jwks(own["par-never"]), assertion_audience="issuer"),
        double_client("gatehouse-par-endpoint", "private_key_jwt", f"{endpoint_base}/oauth/callback", jwks=pki.jwks(own["par-endpoint"]),
                      assertion_audience="endpoint"),
    ]
    skewed_clients = [double_client("gatehouse-expired", "private_key_jwt", callback, jwks=pki.jwks(own["expired"]), assertion_audience="issuer")]
    with run_modern(workdir, "modern-upstream", double_config(pki, modern_clients)) as modern, \
            run_modern(workdir, "modern-upstream-par", double_config(pki, par_clients, require_pushed_authorization_requests=True)) as par, \
            run_modern(workdir, "modern-upstream-skewed", double_config(pki, skewed_clients, clock_offset=600)) as skewed:
        upstreams = "".join([
            pkjwt_upstream("es", modern, pki, "gatehouse-es", [pki.ec_key], algorithm="ES256", audience="issuer"),
            pkjwt_upstream("ps", modern, pki, "gatehouse-ps", [pki.rsa_key], algorithm="PS256", audience="token_endpoint"),
            pkjwt_upstream("rotation", modern, pki, "gatehouse-rotation", [pki.ec_key_2, own["rotation-old"]]),
            certificate_upstream("mtls", modern, pki, "gatehouse-mtls", "tls_client_auth", pki.client_cert, pki.client_key),
            certificate_upstream("self-signed", modern, pki, "gatehouse-self", "self_signed_tls_client_auth",
                                 pki.self_signed_cert, pki.self_signed_key),
            pkjwt_upstream("wrong-key", modern, pki, "gatehouse-wrong-key", [own["wrong-key"]]),
            certificate_upstream("untrusted", modern, pki, "gatehouse-untrusted", "tls_client_auth", pki.untrusted_cert, pki.untrusted_key),
            pkjwt_upstream("long", modern, pki, "gatehouse-long", [own["long"]], lifetime="60s"),
            pkjwt_upstream("par", par, pki, "gatehouse-par", [own["par"]], par="auto"),
            certificate_upstream("par-mtls", par, pki, "gatehouse-par-mtls", "tls_client_auth", pki.client_cert, pki.client_key),
            pkjwt_upstream("par-never", par, pki, "gatehouse-par-never", [own["par-never"]], par="never"),
            pkjwt_upstream("expired", skewed, pki, "gatehouse-expired", [own["expired"]]),
            pkjwt_upstream("no-ca", modern, pki, "gatehouse-es", [own["no-ca"]], ca=False),  # fails before any assertion
            f"""
  - name: plain
    kind: oauth2
    authorization_endpoint: {modern["url"]}/authorize
    token_endpoint: {modern["url"]}/token
    revocation_endpoint: {modern["url"]}/revoke
    pushed_authorization_request_endpoint: {modern["url"]}/par
    pkce: true
    ca_file: {pki.server_ca}
    client_id: gatehouse-plain
    client_auth: private_key_jwt
    client_assertion:
      keys: [{pki.rsa_key_2}]
    scopes: [profile, email]""",
        ])
        names = ["es", "ps", "rotation", "mtls", "self-signed", "wrong-key", "untrusted", "long", "par", "par-mtls", "par-never", "expired",
                 "no-ca", "plain"]
        config = server_and_store(port, f"{workdir}/modern.sqlite") + f"""
upstreams:{upstreams}
clients:{"".join(apps(name) for name in names)}
sessions:
  encryption_keys_file: {session_keys(workdir, "modern-session-keys", seen)}
observability:
  metrics:
    listen: 127.0.0.1:{metrics_port}
"""
        with run_gatehouse(workdir, "modern", config, dict(os.environ)) as gatehouse:
            yield {**gatehouse, "url": base, "modern": modern, "par": par, "skewed": skewed, "pki": pki, "seen": seen,
                   "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics", "endpoint_port": endpoint_port}


@pytest.fixture(scope="module")
def endpoint_audience(setup, workdir, seen, pki):
    """A second Gatehouse, with `client_assertion.audience: endpoint` toward the PAR-requiring
    double (whose client gatehouse-par-endpoint takes at each endpoint an assertion naming it only)."""
    port = setup["endpoint_port"]
    config = server_and_store(port, f"{workdir}/modern-endpoint.sqlite") + f"""
upstreams:{pkjwt_upstream("par-endpoint", setup["par"], pki, "gatehouse-par-endpoint", [pki.assertion_key("par-endpoint")], audience="endpoint")}
clients:{apps("par-endpoint")}
sessions:
  encryption_keys_file: {session_keys(workdir, "modern-endpoint-session-keys", seen)}
"""
    with run_gatehouse(workdir, "modern-endpoint", config, dict(os.environ)) as gatehouse:
        yield {**setup, **gatehouse, "url": f"http://127.0.0.1:{port}"}


# --- the app's side -------------------------------------------------------------------------------


class ModernApp(App):
    """The native app, asking for OpenID scopes; its in-app browser trusts the doubles' test CA."""

    def __init__(self, setup, client_id, scope=SCOPES):
        super().__init__(setup, setup["seen"], client_id=client_id)
        self.setup = setup
        self.scope = scope

    def authorize_url(self, **overrides):
        return super().authorize_url(**{"scope": self.scope, **overrides})

    def browse(self):
        browser = InAppBrowser(seen=self.seen)
        browser.session.verify = str(self.setup["pki"].server_ca)
        browser.session.trust_env = False  # else REQUESTS_CA_BUNDLE, when set, wins over session.verify
        location = browser.follow(self.authorize_url(), self.redirect_uri)
        return location

    def sign_in(self, browser=None):
        location = self.browse()
        assert isinstance(location, str), f"sign-in stopped at HTTP {location.status_code}: {location.text[:300]}"
        received = query(location)
        self._remember(received.get("code"), kind="Gatehouse code")
        return received


def signed_in(setup, client_id, scope=SCOPES):
    """A completed sign-in of `client_id`: (app, token response)."""
    app = ModernApp(setup, client_id, scope)
    received = app.sign_in()
    assert "error" not in received and received.get("state") == app.state, received
    answer = app.redeem(received["code"])
    assert answer.status_code == 200, answer.text
    return app, answer.json()


def failed_sign_in(setup, client_id):
    """A sign-in that must fail: what the app was told. Either a redirect to the app with an OAuth
    error (its state, no code) or an error page; never a 500, never a code."""
    app = ModernApp(setup, client_id)
    location = app.browse()
    if isinstance(location, str):
        received = query(location)
        assert "code" not in received, received
        assert received.get("state") == app.state, received
        assert received.get("error") in SIGN_IN_ERRORS, received
        assert received.get("error_description"), f"no error_description for the app: {received}"
        return {"redirect": received}
    assert location.status_code != 500 and 400 <= location.status_code < 600, (location.status_code, location.text[:300])
    return {"page": (location.status_code, location.text[:500])}


def wire(setup, double, since):
    return setup[double]["log"](since=since)


def mark(setup, double="modern"):
    return len(setup[double]["log"]())


def kid(pki, path):
    return pki.jwk(path)["kid"]


def s256(verifier):
    return b64url(hashlib.sha256(verifier.encode()).digest())


def assert_distinct_jti(found):
    jtis = [entry["client_assertion"]["claims"]["jti"] for entry in found if entry.get("client_assertion")]
    assert len(jtis) == len(set(jtis)) and jtis, jtis


def gatehouse_alive(setup):
    assert setup["process"].poll() is None, "Gatehouse exited"


# --- private_key_jwt: sign-in, refresh, revocation ---------------------------------------------------

PKJWT = {
    # upstream: (double client, key, alg, what the audience names: the issuer, or the endpoint posted to)
    "es": ("gatehouse-es", "ec_key", "ES256", "issuer"),
    "ps": ("gatehouse-ps", "rsa_key", "PS256", "endpoint"),
}
ENDPOINT_PATHS = {"token": "/token", "par": "/par", "revocation": "/revoke"}


def audience_of(entry, names, double):
    """The aud an assertion must carry at the endpoint `entry` records: the issuer, or the URL the
    double says it was posted to, which must be that endpoint's on the main listener."""
    if names == "issuer":
        return double["url"]
    assert entry["url"] == double["url"] + ENDPOINT_PATHS[entry["endpoint"]], entry
    return entry["url"]


@pytest.mark.parametrize("upstream", sorted(PKJWT))
def test_private_key_jwt_sealed_sign_in_signs_the_token_request(setup, upstream):
    client_id, key, alg, audience = PKJWT[upstream]
    pki, modern = setup["pki"], setup["modern"]
    before = mark(setup)
    signed_in(setup, f"com.example.{upstream}")
    log = wire(setup, "modern", before)
    authorize = entries(log, "authorize", client_id)
    assert len(authorize) == 1 and authorize[0]["status"] == 302 and authorize[0]["pushed"] is False, authorize
    assert authorize[0]["params"]["code_challenge_method"] == "S256" and "nonce" in authorize[0]["query"]
    tokens = entries(log, "token", client_id)
    assert [entry["grant_type"] for entry in tokens] == ["authorization_code"], tokens
    entry = tokens[0]
    assert entry["status"] == 200 and entry["listener"] == "main", entry
    assert assertion_checks(entry, client_id, audience_of(entry, audience, modern), kid(pki, getattr(pki, key)), 60, alg) == []
    assert "client_id" in entry["form"] and "client_secret" not in entry["form"]
    assert entry["params"]["client_assertion_type"] == ASSERTION_TYPE
    assert entry["client_certificate"] is None  # nothing but the assertion authenticated Gatehouse


@pytest.mark.parametrize("upstream", sorted(PKJWT))
def test_private_key_jwt_refresh_is_signed_with_a_fresh_jti(setup, upstream):
    client_id, key, alg, audience = PKJWT[upstream]
    pki, modern = setup["pki"], setup["modern"]
    before = mark(setup)
    app, body = signed_in(setup, f"com.example.{upstream}.pt")
    pair = body
    for _ in range(2):  # passthrough: every app refresh is an upstream refresh
        refreshed = app.refresh(pair["refresh_token"])
        assert refreshed.status_code == 200, refreshed.text
        assert refreshed.json()["refresh_token"] != pair["refresh_token"]
        pair = refreshed.json()
    tokens = entries(wire(setup, "modern", before), "token", client_id)
    assert [entry["grant_type"] for entry in tokens] == ["authorization_code", "refresh_token", "refresh_token"], tokens
    for entry in tokens:
        assert entry["status"] == 200, entry
        assert assertion_checks(entry, client_id, audience_of(entry, audience, modern), kid(pki, getattr(pki, key)), 60, alg) == []
    assert all(entry.get("refresh_rotated") for entry in tokens[1:])
    assert_distinct_jti(tokens)


@pytest.mark.parametrize("upstream", sorted(PKJWT))
def test_private_key_jwt_revocation_is_signed_for_the_revocation_endpoint(setup, upstream):
    """With `audience: token_endpoint` (ps) the revocation assertion names the revocation endpoint,
    never the token endpoint: the double (as idpyoidc) takes at each endpoint its own URL only."""
    client_id, key, alg, audience = PKJWT[upstream]
    pki, modern = setup["pki"], setup["modern"]
    before = mark(setup)
    app, pair = signed_in(setup, f"com.example.{upstream}")
    revoked = requests.post(setup["url"] + "/oauth/revoke", timeout=30,
                            data={"token": pair["refresh_token"], "client_id": app.client_id, "token_type_hint": "refresh_token"})
    assert revoked.status_code == 200, revoked.text
    log = wire(setup, "modern", before)
    revocations = entries(log, "revocation", client_id)
    assert len(revocations) == 1, revocations
    entry = revocations[0]
    assert entry["status"] == 200 and entry["revoked"] == "refresh_token", entry  # the refresh token of that session
    assert assertion_checks(entry, client_id, audience_of(entry, audience, modern), kid(pki, getattr(pki, key)), 60, alg) == []
    assert_distinct_jti(entries(log, None, client_id))
    assert app.refresh(pair["refresh_token"]).status_code == 400


def test_an_oauth2_upstream_pushes_signs_refreshes_and_revokes_each_assertion_naming_its_endpoint(setup):
    """`kind: oauth2` has no issuer: each assertion names the endpoint it is posted to (PAR, token,
    revocation), never the token endpoint elsewhere; its configured PAR endpoint is used
    (`pushed_authorization_requests: auto`)."""
    pki, modern = setup["pki"], setup["modern"]
    before = mark(setup)
    app, pair = signed_in(setup, "com.example.plain", scope="profile email")
    passthrough, tokens = signed_in(setup, "com.example.plain.pt", scope="profile email")
    refreshed = passthrough.refresh(tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    revoked = requests.post(setup["url"] + "/oauth/revoke", timeout=30, data={"token": pair["refresh_token"], "client_id": app.client_id})
    assert revoked.status_code == 200, revoked.text
    log = entries(wire(setup, "modern", before), None, "gatehouse-plain")
    assert [entry["endpoint"] for entry in log if entry["endpoint"] != "authorize"] == ["par", "token", "par", "token", "token", "revocation"], log
    assert all(entry["query"] == ["client_id", "request_uri"] for entry in log if entry["endpoint"] == "authorize")
    signed = [entry for entry in log if entry["endpoint"] != "authorize"]
    for entry in signed:
        assert entry["status"] in (200, 201) and entry["client_auth"] == "private_key_jwt", entry
        assert assertion_checks(entry, "gatehouse-plain", audience_of(entry, "endpoint", modern), kid(pki, pki.rsa_key_2), 60, "RS256") == []
    assert_distinct_jti(signed)


def test_audience_endpoint_names_the_exact_url_of_each_endpoint_posted_to(endpoint_audience):
    """`client_assertion.audience: endpoint`: the pushed authorization request's assertion names the
    PAR endpoint, the code exchange's and refresh's the token endpoint, the revocation's the
    revocation endpoint, each as the double recorded the URL it arrived on; the double takes at each
    endpoint an assertion naming it only, so every call succeeds."""
    setup = endpoint_audience
    pki, par = setup["pki"], setup["par"]
    before = mark(setup, "par")
    app, pair = signed_in(setup, "com.example.par-endpoint")
    passthrough, tokens = signed_in(setup, "com.example.par-endpoint.pt")
    refreshed = passthrough.refresh(tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    revoked = requests.post(setup["url"] + "/oauth/revoke", timeout=30, data={"token": pair["refresh_token"], "client_id": app.client_id})
    assert revoked.status_code == 200, revoked.text
    log = [entry for entry in entries(wire(setup, "par", before), None, "gatehouse-par-endpoint") if entry["endpoint"] in ENDPOINT_PATHS]
    assert [entry["endpoint"] for entry in log] == ["par", "token", "par", "token", "token", "revocation"], log
    for entry in log:
        assert entry["status"] in (200, 201), entry
        assert assertion_checks(entry, "gatehouse-par-endpoint", audience_of(entry, "endpoint", par), kid(pki, pki.assertion_key("par-endpoint")),
                                60, "ES256") == []
    assert [entry["revoked"] for entry in log if entry["endpoint"] == "revocation"] == ["refresh_token"]
    assert_distinct_jti(log)


def test_a_replayed_assertion_of_gatehouse_is_refused_by_the_upstream(setup):
    """The assertion Gatehouse just used, sent again (within its lifetime): invalid_client. The
    double remembers every jti, so Gatehouse's distinct jtis are what keep its calls working."""
    modern, seen = setup["modern"], setup["seen"]
    before = mark(setup)
    signed_in(setup, "com.example.es")
    entry = entries(wire(setup, "modern", before), "token", "gatehouse-es")[-1]
    jti = entry["client_assertion"]["claims"]["jti"]
    used = [value for value in seen.recorded("client assertion") if b64url_json(value.split(".")[1]).get("jti") == jti]
    assert len(used) == 1, "the double recorded the assertion it verified"
    replay = requests.post(modern["url"] + "/token", verify=str(setup["pki"].server_ca), timeout=10, data={
        "grant_type": "refresh_token", "refresh_token": "x" * 43, "client_id": "gatehouse-es",
        "client_assertion_type": ASSERTION_TYPE, "client_assertion": used[0]})
    assert replay.status_code == 401 and replay.json()["error"] == "invalid_client", replay.text
    assert entries(wire(setup, "modern", before), "token", "gatehouse-es")[-1].get("refusal") == "replayed", replay.text


# --- key rotation: two keys, published at Gatehouse's jwks_uri ---------------------------------------


def test_the_published_keys_are_both_public_keys_with_thumbprint_kids(setup):
    pki = setup["pki"]
    answer = requests.get(setup["url"] + "/upstreams/rotation/jwks.json", timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"].startswith(("application/json", "application/jwk-set+json"))
    keys = answer.json()["keys"]
    assert len(keys) == 2, keys
    assert {key["kid"] for key in keys} == {kid(pki, pki.ec_key_2), kid(pki, pki.assertion_key("rotation-old"))}
    for key in keys:
        assert key["kid"] == thumbprint(key), key  # RFC 7638 of the published members
        assert not [member for member in PRIVATE_MEMBERS if member in key], key
        assert key["kty"] == "EC" and key["crv"] == "P-256" and key.get("use", "sig") == "sig"
    assert "PRIVATE KEY" not in answer.text
    # An upstream that does not exist has no keys.
    assert requests.get(setup["url"] + "/upstreams/no-such-upstream/jwks.json", timeout=10).status_code == 404


def test_rotation_signs_with_the_first_key_which_the_upstream_reads_from_the_jwks_uri(setup):
    pki, modern = setup["pki"], setup["modern"]
    before = mark(setup)
    signed_in(setup, "com.example.rotation")
    entry = entries(wire(setup, "modern", before), "token", "gatehouse-rotation")[-1]
    assert entry["status"] == 200, entry
    assert entry["jwks_source"] == "jwks_uri"
    assert set(entry["jwks_kids"]) == {kid(pki, pki.ec_key_2), kid(pki, pki.assertion_key("rotation-old"))}
    assert assertion_checks(entry, "gatehouse-rotation", modern["url"], kid(pki, pki.ec_key_2), 60, "ES256") == []


def test_self_signed_certificate_is_published_with_x5c(setup):
    pki = setup["pki"]
    answer = requests.get(setup["url"] + "/upstreams/self-signed/jwks.json", timeout=10)
    assert answer.status_code == 200, answer.text
    keys = answer.json()["keys"]
    der = x509.load_pem_x509_certificate(pki.self_signed_cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    assert len(keys) == 1, keys
    assert isinstance(keys[0].get("x5c"), list), f"x5c must be an array of base64 DER certificates (RFC 7517 §4.7): {keys[0]}"
    assert base64.b64decode(keys[0]["x5c"][0]) == der
    assert keys[0]["kid"] == thumbprint(keys[0])
    assert not [member for key in keys for member in PRIVATE_MEMBERS if member in key]


# --- mutual TLS ---------------------------------------------------------------------------------------

MTLS = {"mtls": ("gatehouse-mtls", "tls_client_auth", "client_cert"),
        "self-signed": ("gatehouse-self", "self_signed_tls_client_auth", "self_signed_cert")}


@pytest.mark.parametrize("upstream", sorted(MTLS))
def test_mtls_sign_in_userinfo_refresh_and_revocation_go_to_the_aliases_with_the_certificate(setup, upstream):
    client_id, method, certificate = MTLS[upstream]
    pki = setup["pki"]
    expected = certificate_thumbprint(getattr(pki, certificate))
    before = mark(setup)
    app, pair = signed_in(setup, f"com.example.{upstream}")
    userinfo = requests.get(setup["url"] + "/userinfo", headers={"Authorization": f"Bearer {pair['access_token']}"}, timeout=30)
    assert userinfo.status_code == 200, userinfo.text
    assert userinfo.json()["sub"] == "alice-modern-7"
    passthrough, tokens = signed_in(setup, f"com.example.{upstream}.pt")
    refreshed = passthrough.refresh(tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    revoked = requests.post(setup["url"] + "/oauth/revoke", timeout=30,
                            data={"token": pair["refresh_token"], "client_id": app.client_id})
    assert revoked.status_code == 200, revoked.text
    log = entries(wire(setup, "modern", before), None, client_id)
    calls = [entry for entry in log if entry["endpoint"] in ("token", "revocation", "userinfo", "par")]
    assert sorted({entry["endpoint"] for entry in calls}) == ["revocation", "token", "userinfo"], calls
    for entry in calls:
        assert entry["listener"] == "mtls", entry  # the mtls_endpoint_aliases
        assert (entry["client_certificate"] or {}).get("sha256") == expected, entry
        assert entry["status"] == 200, entry
        assert entry["client_assertion"] is None
    for entry in calls:
        if entry["endpoint"] != "userinfo":
            assert entry["client_auth"] == method and "client_id" in entry["form"], entry
    token_calls = [entry for entry in calls if entry["endpoint"] == "token"]
    assert [entry["grant_type"] for entry in token_calls] == ["authorization_code", "authorization_code", "refresh_token"]
    assert all(entry["bound"] for entry in token_calls)  # certificate-bound tokens, which userinfo accepted
    assert [entry["revoked"] for entry in calls if entry["endpoint"] == "revocation"] == ["refresh_token"]
    if upstream == "self-signed":
        assert all(entry.get("jwks_source") == "jwks_uri" for entry in calls if entry["endpoint"] != "userinfo")


#: What an app is told of a failed TLS handshake toward its upstream: nothing it could act on.
TLS_DESCRIPTION = "Gatehouse could not reach the sign-in service securely"
#: What the operator's side says and the app's never does: a BoringSSL reason, a setting, a certificate.
OPERATOR_WORDS = re.compile(r"\b[A-Z0-9]+_[A-Z0-9_]{3,}\b|\bTLS|ca_file|[Cc]ertificate|[Hh]andshake|BoringSSL|OPENSSL")


def wait_for_log(setup, since, *needles, timeout=10):
    """Gatehouse's log after `since` (a length), once it holds every needle (polled, no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        text = setup["log"].read_text(errors="replace")[since:]
        if all(needle in text for needle in needles) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def metric(setup, upstream, endpoint, outcome):
    text = requests.get(setup["metrics_url"], timeout=10).text
    pattern = re.compile(r'^gatehouse_upstream_requests_total\{([^}]*)\} ([0-9.e+]+)$', re.M)
    for labels, value in pattern.findall(text):
        if {f'upstream="{upstream}"', f'endpoint="{endpoint}"', f'outcome="{outcome}"'} <= set(labels.split(",")):
            return float(value)
    return 0.0


def test_a_client_certificate_the_upstream_does_not_trust_fails_the_sign_in_clearly(setup):
    before = mark(setup)
    told = failed_sign_in(setup, "com.example.untrusted")
    log = wire(setup, "modern", before)
    failures = [entry for entry in entries(log, "tls-handshake") if entry["listener"] == "mtls"]
    assert any(entry["handshake_error"] == "CERTIFICATE_VERIFY_FAILED" for entry in failures), log
    assert not [entry for entry in entries(log, "token", "gatehouse-untrusted") if entry["status"] == 200]
    gatehouse_alive(setup)
    # Not an outage to retry: server_error, with nothing of the TLS layer for the app.
    assert told["redirect"]["error"] == "server_error", told


def test_an_upstream_certificate_gatehouse_does_not_trust_fails_the_sign_in_before_any_request(setup):
    """Without ca_file the double's certificate (a test CA) is not trusted: discovery is never
    read, so nothing, no assertion, reaches the upstream."""
    before = mark(setup)
    told = failed_sign_in(setup, "com.example.no-ca")
    assert not [entry for entry in wire(setup, "modern", before) if entry.get("endpoint") != "tls-handshake"], "a request reached the double"
    assert told.get("redirect", {}).get("error") == "server_error", told
    gatehouse_alive(setup)


@pytest.mark.parametrize("upstream, endpoint, reason, hint", [
    ("no-ca", "discovery", "CERTIFICATE_VERIFY_FAILED", "ca_file"),
    ("untrusted", "token", "_ALERT_", "client certificate"),
], ids=["upstream certificate not trusted", "client certificate refused"])
def test_a_tls_failure_tells_the_app_a_generic_description_and_the_operator_the_reason(setup, upstream, endpoint, reason, hint):
    """The app's error_description is one generic sentence, with no BoringSSL reason nor ca_file or
    client-certificate hint; Gatehouse's log line says both, and the upstream metric counts the
    call as `tls`. The double's wire record shows the handshake failed (nothing else reached it)."""
    before, since = mark(setup), len(setup["log"].read_text(errors="replace"))
    counted = metric(setup, upstream, endpoint, "tls")
    told = failed_sign_in(setup, f"com.example.{upstream}")
    description = told["redirect"]["error_description"]
    assert description == TLS_DESCRIPTION, told
    assert not OPERATOR_WORDS.search(json.dumps(told)), told
    handshakes = entries(wire(setup, "modern", before), "tls-handshake")
    assert handshakes, "the double saw no failed handshake"
    assert not [entry for entry in wire(setup, "modern", before)
                if entry.get("endpoint") not in ("tls-handshake", "authorize") and entry.get("status") == 200]
    text = wait_for_log(setup, since, reason, hint)
    failure = [line for line in text.splitlines() if reason in line]
    assert failure and hint in failure[0] and upstream in failure[0], text[-2000:]
    assert metric(setup, upstream, endpoint, "tls") == counted + 1
    gatehouse_alive(setup)


# --- PAR ------------------------------------------------------------------------------------------


def test_par_required_pushes_the_request_with_client_auth_and_the_browser_carries_only_its_reference(setup):
    seen, pki, par = setup["seen"], setup["pki"], setup["par"]
    before = mark(setup, "par")
    app, body = signed_in(setup, "com.example.par")
    log = wire(setup, "par", before)
    pushes = entries(log, "par", "gatehouse-par")
    assert len(pushes) == 1 and pushes[0]["status"] == 201, pushes
    push = pushes[0]
    assert push["listener"] == "main" and push["client_auth"] == "private_key_jwt"
    assert assertion_checks(push, "gatehouse-par", par["url"], kid(pki, pki.assertion_key("par")), 60, "ES256") == []
    assert set(push["form"]) >= {"response_type", "client_id", "redirect_uri", "scope", "state", "nonce", "code_challenge",
                                 "code_challenge_method"}, push["form"]
    assert push["params"]["code_challenge_method"] == "S256" and push["params"]["response_type"] == "code"
    assert push["params"]["redirect_uri"] == setup["url"] + "/oauth/callback"
    assert set(push["params"]["scope"].split()) == set(SCOPES.split())
    authorize = entries(log, "authorize", "gatehouse-par")
    assert len(authorize) == 1 and authorize[0]["pushed"] is True and authorize[0]["status"] == 302, authorize
    assert authorize[0]["query"] == ["client_id", "request_uri"]  # nothing else in the browser's URL
    token = entries(log, "token", "gatehouse-par")
    assert len(token) == 1 and token[0]["status"] == 200 and token[0]["code_was_pushed"] is True, token
    # The challenge pushed is the S256 of the verifier Gatehouse redeemed the code with.
    assert push["params"]["code_challenge"] in {s256(v) for v in seen.recorded("PKCE verifier toward the upstream")}
    assert_distinct_jti(pushes + token)


def test_par_with_tls_client_auth_pushes_to_the_mtls_alias(setup):
    pki = setup["pki"]
    before = mark(setup, "par")
    signed_in(setup, "com.example.par-mtls")
    log = wire(setup, "par", before)
    push = entries(log, "par", "gatehouse-par-mtls")
    assert len(push) == 1 and push[0]["status"] == 201, push
    assert push[0]["listener"] == "mtls" and push[0]["client_auth"] == "tls_client_auth"
    assert push[0]["client_certificate"]["sha256"] == certificate_thumbprint(pki.client_cert)
    assert entries(log, "authorize", "gatehouse-par-mtls")[0]["query"] == ["client_id", "request_uri"]


def test_par_never_against_an_upstream_that_requires_it_fails_clearly(setup):
    before = mark(setup, "par")
    told = failed_sign_in(setup, "com.example.par-never")
    log = wire(setup, "par", before)
    assert not entries(log, "par", "gatehouse-par-never")  # never pushed
    authorize = entries(log, "authorize", "gatehouse-par-never")
    assert authorize and authorize[0]["pushed"] is False and authorize[0]["error"] == "invalid_request", authorize
    assert not entries(log, "token", "gatehouse-par-never")
    gatehouse_alive(setup)
    # The upstream's own refusal, relayed to the app with Gatehouse's state.
    assert told["redirect"]["error"] == "invalid_request", told


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("upstream,double,client_id,refusal", [
    ("wrong-key", "modern", "gatehouse-wrong-key", "unknown_key"),
    ("long", "modern", "gatehouse-long", "lifetime"),
    ("expired", "skewed", "gatehouse-expired", "expired"),
])
def test_an_assertion_the_upstream_refuses_fails_the_sign_in_clearly(setup, upstream, double, client_id, refusal):
    """Each fault is refused for its own reason, as the double recorded it (the log's "refusal"),
    not merely with some invalid_client."""
    before = mark(setup, double)
    told = failed_sign_in(setup, f"com.example.{upstream}")
    tokens = entries(wire(setup, double, before), "token", client_id)
    assert tokens, "Gatehouse never reached the token endpoint"
    for entry in tokens:
        assert entry["status"] == 401 and entry["error"] == "invalid_client", entry
        assert entry.get("refusal") == refusal, entry
        assert entry["client_assertion"] and entry["client_assertion"]["header"]["alg"] == "ES256"
    gatehouse_alive(setup)
    print(f"{upstream}: the app was told:", told)


# --- no secret in any log --------------------------------------------------------------------------


def test_no_private_key_nor_assertion_in_the_logs_of_this_module(setup, workdir):
    """What test_zz_no_secrets_logged checks for the whole run, here for this module's logs at once:
    every private key (PEM, base64 body, lines), every assertion, code, token and verifier the
    doubles saw (the secrets record)."""
    seen = setup["seen"]
    assert seen.recorded("client assertion"), "the doubles recorded no client assertion"
    seen.harvest()
    logs = [setup["log"]] + [Path(workdir) / f"{name}.log" for name in ("modern-upstream", "modern-upstream-par", "modern-upstream-skewed",
                                                                          "modern-endpoint")
                             if name != "modern-endpoint" or (Path(workdir) / f"{name}.log").exists()]
    leaks = [f"{path.name}: {kind} ({form})" for path in logs for kind, form in seen.find(path.read_bytes())]
    assert leaks == []
    assert "gatehouse is ready" in setup["log"].read_text()


# --- gatehouse check-config --------------------------------------------------------------------------


def base_config(tmp_path, upstream):
    return f"""
server:
  public_base_url: http://127.0.0.1:8080
store:
  sqlite_path: {tmp_path}/x.sqlite
upstreams:{upstream}
clients:
  - client_id: com.example.app
    upstream: modern
    wiring: callback
    token_exposure: passthrough
    scopes: [openid]
    redirect_uris: ["{APP_REDIRECT}"]
"""


def check(tmp_path, text, name="modern.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return subprocess.run([str(gatehouse_binary()), "check-config", str(path)], capture_output=True, text=True, timeout=30)


def pkjwt_yaml(key, extra="", assertion=True):
    block = f"""
    client_assertion:
      keys: [{key}]""" if assertion else ""
    return f"""
  - name: modern
    kind: oidc
    issuer: https://127.0.0.1:9443
    ca_file: CA
    client_id: gatehouse-pkjwt
    client_auth: private_key_jwt{block}{extra}
    scopes: [openid]"""


def line_of(text, needle):
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def assert_refused(result, *needles):
    output = result.stdout + result.stderr
    assert result.returncode == 78, output
    assert "upstreams[0]" in output, output
    assert re.search(r"line \d+", output), output
    for needle in needles:
        assert needle in output, (needle, output)
    return output


def test_check_config_accepts_private_key_jwt_and_tls_client_auth(tmp_path, pki):
    accepted = check(tmp_path, base_config(tmp_path, pkjwt_yaml(pki.ec_key).replace("CA", str(pki.server_ca))))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    mtls = certificate_upstream("modern", {"url": "https://127.0.0.1:9443"}, pki, "gatehouse-mtls", "tls_client_auth",
                                pki.client_cert, pki.client_key)
    accepted = check(tmp_path, base_config(tmp_path, mtls), "mtls.yaml")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr


def test_check_config_refuses_a_client_secret_with_private_key_jwt(tmp_path, pki):
    text = base_config(tmp_path, pkjwt_yaml(pki.ec_key, "\n    client_secret: never-echoed-secret-4242").replace("CA", str(pki.server_ca)))
    output = assert_refused(check(tmp_path, text), "client_secret")
    assert f"line {line_of(text, 'client_secret:')}" in output or f"line {line_of(text, 'client_auth:')}" in output, output
    assert "never-echoed-secret-4242" not in output


def test_check_config_refuses_a_key_file_that_is_not_a_key(tmp_path, pki):
    not_a_key = tmp_path / "not-a-key.pem"
    not_a_key.write_text(pki.server_cert.read_text())  # a certificate, not a private key
    text = base_config(tmp_path, pkjwt_yaml(not_a_key).replace("CA", str(pki.server_ca)))
    output = assert_refused(check(tmp_path, text), "client_assertion")
    assert f"line {line_of(text, 'keys:')}" in output, output


def test_check_config_refuses_a_certificate_whose_key_is_another(tmp_path, pki):
    mismatched = certificate_upstream("modern", {"url": "https://127.0.0.1:9443"}, pki, "gatehouse-mtls", "tls_client_auth",
                                      pki.client_cert, pki.self_signed_key)
    text = base_config(tmp_path, mismatched)
    output = assert_refused(check(tmp_path, text), "client_certificate")
    assert pki.self_signed_key.read_text().splitlines()[1] not in output  # the key is never echoed


def test_check_config_refuses_private_key_jwt_without_client_assertion(tmp_path, pki):
    text = base_config(tmp_path, pkjwt_yaml(pki.ec_key, assertion=False).replace("CA", str(pki.server_ca)))
    assert_refused(check(tmp_path, text), "client_assertion")


def test_check_config_refuses_one_assertion_key_on_several_upstreams(tmp_path, pki):
    """One key signing for two upstreams would let one upstream replay Gatehouse's assertion at the
    other (the same iss/sub when the client ids match, a shared key set otherwise): refused, at the
    later upstream's key with its path and line and the other upstream named, whether the key file
    is the same or a copy (the key's RFC 7638 thumbprint decides)."""
    copy = tmp_path / "same-key-copy.pem"
    copy.write_text(pki.ec_key.read_text())
    first = pkjwt_yaml(pki.ec_key).replace("CA", str(pki.server_ca))
    for name, key in (("same file", pki.ec_key), ("a copy", copy)):
        second = pkjwt_yaml(key).replace("CA", str(pki.server_ca)).replace("name: modern", "name: other").replace(
            "client_id: gatehouse-pkjwt", "client_id: gatehouse-other")
        text = base_config(tmp_path, first + second)
        output = assert_refused(check(tmp_path, text, f"shared-{name.replace(' ', '-')}.yaml"), "upstreams[1].client_assertion.keys[0]",
                                "'modern'", "upstreams[0].client_assertion.keys[0]", kid(pki, pki.ec_key))
        second_keys = [number for number, line in enumerate(text.splitlines(), 1) if "keys: [" in line][1]
        assert f"line {second_keys}" in output, output
        assert "PRIVATE KEY" not in output
    # Distinct keys on the two upstreams, and `audience: endpoint`, are accepted.
    second = pkjwt_yaml(pki.ec_key_2, "\n      audience: endpoint").replace("CA", str(pki.server_ca)).replace(
        "name: modern", "name: other")
    accepted = check(tmp_path, base_config(tmp_path, first + second), "distinct.yaml")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
