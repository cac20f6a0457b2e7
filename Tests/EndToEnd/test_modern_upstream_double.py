"""The modern upstream double (sandbox/modern) on its own, without Gatehouse: that it
accepts what a correct client sends (authlib's own client side for private_key_jwt, `requests`
with a client certificate for mutual TLS) and, what makes the Gatehouse tests of
test_modern_upstreams.py mean something, that it refuses what it must: a wrong key, an expired
or too long-lived assertion, a replayed jti, the wrong audience, an untrusted or unregistered
client certificate, a certificate-bound token without its certificate, and a plain authorization
request when PAR is required.
"""

import hashlib
import json
import secrets
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from joserfc import jwt
from joserfc.jwk import KeySet

from modernupstream import (ASSERTION_TYPE, CLIENT_DN, Pki, b64url, certificate_thumbprint, double_config, entries,
                            sign_assertion)
from sandbox.modern import run as run_modern
from sandbox.stubserver import StubHandler, StubServer

REDIRECT = "https://client.example.test/callback"


class JwksServer(StubServer):
    """Serves a JWK set at /jwks.json over http (what Gatehouse's /upstreams/<name>/jwks.json is)."""

    class Handler(StubHandler):
        def do_GET(self):
            self.stub.record(self.path)
            self.reply(200, json.dumps(self.stub.document).encode())

    def __init__(self, document):
        self.document = document
        super().__init__(path="/jwks.json")


@pytest.fixture(scope="module")
def pki(workdir, seen):
    return Pki.recorded(workdir / "modern-double-pki", seen)


@pytest.fixture(scope="module")
def double(workdir, pki, seen):
    jwks_server = JwksServer(pki.jwks(pki.ec_key_2, pki.rsa_key))
    malformed = pki.certificate_jwk(pki.self_signed_cert)
    malformed["x5c"] = malformed["x5c"][0]  # a string, where RFC 7517 §4.7 wants an array
    malformed_server = JwksServer({"keys": [malformed]})

    def client(client_id, method, **extra):
        return {"client_id": client_id, "token_endpoint_auth_method": method, "redirect_uris": [REDIRECT], **extra}

    clients = [
        client("pk-es", "private_key_jwt", jwks=pki.jwks(pki.ec_key), assertion_audience="issuer"),
        client("pk-ps-token", "private_key_jwt", jwks=pki.jwks(pki.rsa_key), assertion_audience="token_endpoint",
               assertion_algorithms=["PS256"]),
        client("pk-uri", "private_key_jwt", jwks_uri=jwks_server.url, assertion_audience="any"),
        client("pk-par", "private_key_jwt", jwks=pki.jwks(pki.ec_key), assertion_audience="issuer", require_par=True),
        client("pk-endpoint", "private_key_jwt", jwks=pki.jwks(pki.ec_key), assertion_audience="endpoint"),
        client("mtls", "tls_client_auth", tls_client_auth_subject_dn=CLIENT_DN),
        client("self-signed", "self_signed_tls_client_auth", jwks={"keys": [pki.certificate_jwk(pki.self_signed_cert)]}),
        client("self-signed-malformed", "self_signed_tls_client_auth", jwks_uri=malformed_server.url),
    ]
    with run_modern(workdir, "modern-double", double_config(pki, clients, max_assertion_lifetime=120)) as running:
        yield {**running, "pki": pki, "jwks_server": jwks_server, "seen": seen}
    jwks_server.stop()
    malformed_server.stop()


def get(double, url, **options):
    return requests.get(url, verify=str(double["ca"]), allow_redirects=False, timeout=10, **options)


def post(double, url, data, **options):
    return requests.post(url, data=data, verify=str(double["ca"]), allow_redirects=False, timeout=10, **options)


def query(location):
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


class Flow:
    """One authorization request's parameters (PKCE S256, state, nonce)."""

    def __init__(self, client_id, scope="openid profile email"):
        self.client_id = client_id
        self.verifier = secrets.token_urlsafe(48)
        self.params = {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT, "scope": scope,
                       "state": secrets.token_urlsafe(16), "nonce": secrets.token_urlsafe(16),
                       "code_challenge": b64url(hashlib.sha256(self.verifier.encode()).digest()),
                       "code_challenge_method": "S256"}

    def authorize(self, double, **overrides):
        return get(double, double["url"] + "/authorize", params={**self.params, **overrides})

    def code(self, double):
        answer = self.authorize(double)
        assert answer.status_code == 302, answer.text
        received = query(answer.headers["Location"])
        assert received["state"] == self.params["state"] and received["iss"] == double["url"], received
        double["seen"].add(received["code"], kind="upstream authorization code")
        return received["code"]

    def redeem_form(self, code):
        return {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT, "code_verifier": self.verifier,
                "client_id": self.client_id}


def assertion_form(double, key, client_id, audience=None, **options):
    assertion = sign_assertion(double["pki"], key, client_id, audience or double["url"], **options)
    double["seen"].add(assertion, kind="client assertion")
    return {"client_id": client_id, "client_assertion_type": ASSERTION_TYPE, "client_assertion": assertion}


def tokens_of(double, answer):
    assert answer.status_code == 200, answer.text
    body = answer.json()
    double["seen"].add(body.get("access_token"), body.get("refresh_token"), body.get("id_token"), kind="upstream token (double test)")
    return body


def refused_client(answer, description=None):
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"] == "invalid_client", answer.text
    assert "invalid_client" in answer.headers.get("WWW-Authenticate", "")
    if description:
        assert description in answer.json()["error_description"], answer.text


def last(double, endpoint, client_id):
    found = entries(double["log"](), endpoint, client_id)
    assert found, f"no {endpoint} entry of {client_id}"
    return found[-1]


def client_cert(pki, which="client"):
    return {"client": (str(pki.client_cert), str(pki.client_key)),
            "self-signed": (str(pki.self_signed_cert), str(pki.self_signed_key)),
            "untrusted": (str(pki.untrusted_cert), str(pki.untrusted_key))}[which]


# --- discovery ------------------------------------------------------------------------------------


def test_discovery_names_the_mtls_aliases_and_the_methods(double):
    document = get(double, double["url"] + "/.well-known/openid-configuration").json()
    assert document["issuer"] == double["url"]
    assert document["token_endpoint"] == double["url"] + "/token"
    assert document["pushed_authorization_request_endpoint"] == double["url"] + "/par"
    assert document["require_pushed_authorization_requests"] is False
    assert document["mtls_endpoint_aliases"] == {name: double["mtls_url"] + path for name, path in [
        ("token_endpoint", "/token"), ("revocation_endpoint", "/revoke"), ("userinfo_endpoint", "/userinfo"),
        ("pushed_authorization_request_endpoint", "/par")]}
    assert set(document["token_endpoint_auth_methods_supported"]) >= {"private_key_jwt", "tls_client_auth", "self_signed_tls_client_auth"}
    assert document["tls_client_certificate_bound_access_tokens"] is True
    # The main listener asks for no certificate: a client certificate is never seen there.
    answer = get(double, double["url"] + "/.well-known/openid-configuration", cert=client_cert(double["pki"]))
    assert answer.status_code == 200


# --- private_key_jwt ------------------------------------------------------------------------------


def test_private_key_jwt_with_authlibs_client_signs_in_refreshes_once_and_revokes(double):
    """authlib's own client side (OAuth2Session + PrivateKeyJWT): an independent implementation."""
    from authlib.integrations.requests_client import OAuth2Session
    from authlib.oauth2.rfc7523 import PrivateKeyJWT
    pki = double["pki"]
    from joserfc.jwk import ECKey
    session = OAuth2Session("pk-es", ECKey.import_key(pki.ec_key.read_text()), token_endpoint_auth_method="private_key_jwt",
                            redirect_uri=REDIRECT, scope="openid email")
    session.verify = str(double["ca"])

    class ShortLived(PrivateKeyJWT):  # authlib's default assertion lives an hour: longer than the double accepts
        def sign(self, auth, token_endpoint):
            self.claims = {"exp": int(time.time()) + 60}  # a fresh dict: authlib adds the jti to it
            return super().sign(auth, token_endpoint)

    session.register_client_auth_method(ShortLived(double["url"], alg="ES256", headers={"kid": pki.jwk(pki.ec_key)["kid"]}))
    flow = Flow("pk-es", scope="openid email")
    code = flow.code(double)
    token = session.fetch_token(double["url"] + "/token", code=code, code_verifier=flow.verifier,
                                grant_type="authorization_code", redirect_uri=REDIRECT, verify=str(double["ca"]))
    double["seen"].add(token["access_token"], token["refresh_token"], token["id_token"], kind="upstream token (double test)")
    entry = last(double, "token", "pk-es")
    assert entry["client_auth"] == "private_key_jwt" and entry["status"] == 200 and entry["bound"] is False
    claims = entry["client_assertion"]["claims"]
    assert claims["iss"] == claims["sub"] == "pk-es" and claims["aud"] == double["url"]
    # The ID token: RS256, the double's key, the nonce of the request.
    keys = KeySet.import_key_set(get(double, double["url"] + "/jwks.json").json())
    id_token = jwt.decode(token["id_token"], keys, algorithms=["RS256"])
    assert id_token.claims["nonce"] == flow.params["nonce"] and id_token.claims["iss"] == double["url"]
    assert id_token.claims["aud"] == ["pk-es"] and id_token.claims["sub"] == "alice-modern-7"
    # Refresh: a new refresh token; the old one is spent.
    refreshed = tokens_of(double, post(double, double["url"] + "/token", {
        "grant_type": "refresh_token", "refresh_token": token["refresh_token"], **assertion_form(double, pki.ec_key, "pk-es")}))
    assert refreshed["refresh_token"] != token["refresh_token"]
    assert last(double, "token", "pk-es")["refresh_rotated"] is True
    again = post(double, double["url"] + "/token", {"grant_type": "refresh_token", "refresh_token": token["refresh_token"],
                                                    **assertion_form(double, pki.ec_key, "pk-es")})
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant", again.text
    # Revocation of the refresh token takes its access token along.
    assert get(double, double["url"] + "/userinfo", headers={"Authorization": "Bearer " + refreshed["access_token"]}).status_code == 200
    revoked = post(double, double["url"] + "/revoke", {"token": refreshed["refresh_token"], "token_type_hint": "refresh_token",
                                                       **assertion_form(double, pki.ec_key, "pk-es")})
    assert revoked.status_code == 200, revoked.text
    entry = last(double, "revocation", "pk-es")
    assert entry["revoked"] == "refresh_token" and entry["client_auth"] == "private_key_jwt"
    dead = get(double, double["url"] + "/userinfo", headers={"Authorization": "Bearer " + refreshed["access_token"]})
    assert dead.status_code == 401 and dead.json()["error"] == "invalid_token"


def test_ps256_with_the_token_endpoint_as_audience(double):
    pki = double["pki"]
    flow = Flow("pk-ps-token")
    code = flow.code(double)
    issuer_audience = post(double, double["url"] + "/token", {**flow.redeem_form(code),
                           **assertion_form(double, pki.rsa_key, "pk-ps-token", alg="PS256")})
    refused_client(issuer_audience)
    rs256 = post(double, double["url"] + "/token", {**flow.redeem_form(code), **assertion_form(
        double, pki.rsa_key, "pk-ps-token", double["url"] + "/token", alg="RS256")})
    refused_client(rs256, "alg RS256")
    body = tokens_of(double, post(double, double["url"] + "/token", {**flow.redeem_form(code), **assertion_form(
        double, pki.rsa_key, "pk-ps-token", double["url"] + "/token", alg="PS256")}))
    assert body["token_type"] == "Bearer"
    assert last(double, "token", "pk-ps-token")["client_assertion"]["header"]["alg"] == "PS256"


def test_an_endpoint_audience_client_takes_at_each_endpoint_its_own_url_only(double):
    """assertion_audience "endpoint" (idpyoidc's rule): the token endpoint takes an assertion naming
    the token endpoint, the revocation endpoint one naming the revocation endpoint; the issuer, or
    another endpoint's URL, is refused with the reason recorded."""
    pki, url = double["pki"], double["url"]
    flow = Flow("pk-endpoint")
    code = flow.code(double)
    for audience in (url, url + "/revoke", url + "/par"):
        refused = post(double, url + "/token", {**flow.redeem_form(code), **assertion_form(double, pki.ec_key, "pk-endpoint", audience)})
        refused_client(refused)
        assert "aud" in last(double, "token", "pk-endpoint")["error_description"], last(double, "token", "pk-endpoint")
    body = tokens_of(double, post(double, url + "/token", {**flow.redeem_form(code), **assertion_form(
        double, pki.ec_key, "pk-endpoint", url + "/token")}))
    assert last(double, "token", "pk-endpoint")["url"] == url + "/token"
    revoke = {"token": body["refresh_token"], "client_id": "pk-endpoint"}
    refused_client(post(double, url + "/revoke", {**revoke, **assertion_form(double, pki.ec_key, "pk-endpoint", url + "/token")}))
    accepted = post(double, url + "/revoke", {**revoke, **assertion_form(double, pki.ec_key, "pk-endpoint", url + "/revoke")})
    assert accepted.status_code == 200, accepted.text
    assert last(double, "revocation", "pk-endpoint")["revoked"] == "refresh_token"


def test_a_key_that_is_not_the_registered_one_is_refused(double):
    pki = double["pki"]
    flow = Flow("pk-es")
    code = flow.code(double)
    registered_kid = pki.jwk(pki.ec_key)["kid"]
    # Another key, claiming the registered key's kid: the signature does not verify.
    refused_client(post(double, double["url"] + "/token", {**flow.redeem_form(code),
                        **assertion_form(double, pki.stranger_ec_key, "pk-es", kid=registered_kid)}), "signature")
    # Another key under its own kid: no such key registered.
    refused_client(post(double, double["url"] + "/token", {**flow.redeem_form(code),
                        **assertion_form(double, pki.stranger_ec_key, "pk-es")}))
    # The code was not spent by the refusals.
    tokens_of(double, post(double, double["url"] + "/token", {**flow.redeem_form(code), **assertion_form(double, pki.ec_key, "pk-es")}))


@pytest.mark.parametrize("case", ["expired", "too long-lived", "no jti", "iss is not sub", "another audience",
                                  "client_id is not sub", "issued in the future"])
def test_a_wrong_assertion_is_refused(double, case):
    pki, now = double["pki"], int(time.time())
    options = {"expired": {"iat": now - 300, "lifetime": 60}, "too long-lived": {"lifetime": 600},
               "no jti": {"jti": ""}, "iss is not sub": {"iss": "someone-else"},
               "another audience": {"audience": "https://elsewhere.example/token"}, "client_id is not sub": {},
               "issued in the future": {"iat": now + 300}}[case]
    audience = options.pop("audience", None)
    form = assertion_form(double, pki.ec_key, "pk-es", audience, **options)
    if case == "client_id is not sub":
        form["client_id"] = "pk-ps-token"
    if case == "no jti":  # sign_assertion always sets one: sign again without
        from joserfc.jwk import import_key
        claims = {"iss": "pk-es", "sub": "pk-es", "aud": double["url"], "iat": now, "exp": now + 60}
        form["client_assertion"] = jwt.encode({"alg": "ES256", "kid": pki.jwk(pki.ec_key)["kid"]}, claims,
                                              import_key(pki.ec_key.read_text(), "EC"), algorithms=["ES256"])
        double["seen"].add(form["client_assertion"], kind="client assertion")
    flow = Flow("pk-es")
    code = flow.code(double)
    refused_client(post(double, double["url"] + "/token", {**flow.redeem_form(code), **form}))
    assert last(double, "token", form["client_id"])["client_auth"] is None


def test_a_replayed_assertion_is_refused(double):
    pki = double["pki"]
    form = assertion_form(double, pki.ec_key, "pk-es")
    first, second = Flow("pk-es"), Flow("pk-es")
    tokens_of(double, post(double, double["url"] + "/token", {**first.redeem_form(first.code(double)), **form}))
    refused_client(post(double, double["url"] + "/token", {**second.redeem_form(second.code(double)), **form}), "JWT ID")


def test_keys_fetched_from_the_jwks_uri_at_each_verification(double):
    pki, server = double["pki"], double["jwks_server"]
    before = len(server.received)
    flow = Flow("pk-uri")
    tokens_of(double, post(double, double["url"] + "/token", {**flow.redeem_form(flow.code(double)),
                           **assertion_form(double, pki.ec_key_2, "pk-uri", double["url"] + "/par")}))
    entry = last(double, "token", "pk-uri")
    assert entry["jwks_source"] == "jwks_uri" and pki.jwk(pki.ec_key_2)["kid"] in entry["jwks_kids"]
    assert len(server.received) == before + 1
    # A key the jwks_uri does not publish (any more) is refused.
    flow = Flow("pk-uri")
    refused_client(post(double, double["url"] + "/token", {**flow.redeem_form(flow.code(double)),
                        **assertion_form(double, pki.ec_key, "pk-uri")}))


def test_pkce_s256_and_a_nonce_are_required(double):
    flow = Flow("pk-es")
    for overrides, what in [({"code_challenge": None, "code_challenge_method": None}, "PKCE"),
                            ({"code_challenge_method": "plain"}, "code_challenge_method"), ({"nonce": None}, "nonce")]:
        answer = flow.authorize(double, **overrides)
        assert answer.status_code == 302, answer.text
        received = query(answer.headers["Location"])
        assert received["error"] == "invalid_request" and "code" not in received, (what, received)
        assert received["iss"] == double["url"]
    code = flow.code(double)
    wrong = post(double, double["url"] + "/token", {**flow.redeem_form(code), "code_verifier": secrets.token_urlsafe(48),
                                                    **assertion_form(double, double["pki"].ec_key, "pk-es")})
    assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant", wrong.text


# --- mutual TLS -----------------------------------------------------------------------------------


def test_tls_client_auth_binds_the_tokens_to_the_certificate(double):
    pki = double["pki"]
    flow = Flow("mtls")
    code = flow.code(double)
    # At the main token endpoint there is no certificate.
    refused_client(post(double, double["url"] + "/token", flow.redeem_form(code)), "No client certificate")
    body = tokens_of(double, post(double, double["mtls_url"] + "/token", flow.redeem_form(code), cert=client_cert(pki)))
    entry = last(double, "token", "mtls")
    assert entry["listener"] == "mtls" and entry["client_auth"] == "tls_client_auth" and entry["bound"] is True
    assert entry["client_certificate"]["sha256"] == certificate_thumbprint(pki.client_cert)
    assert entry["client_certificate"]["subject"] == CLIENT_DN
    bearer = {"Authorization": "Bearer " + body["access_token"]}
    main = get(double, double["url"] + "/userinfo", headers=bearer)
    assert main.status_code == 401 and main.json()["error"] == "invalid_token"
    other = get(double, double["mtls_url"] + "/userinfo", headers=bearer, cert=client_cert(pki, "self-signed"))
    assert other.status_code == 401 and "not the one" in other.json()["error_description"]
    own = get(double, double["mtls_url"] + "/userinfo", headers=bearer, cert=client_cert(pki))
    assert own.status_code == 200 and own.json()["sub"] == "alice-modern-7"
    # Refresh and revocation on the aliases, with the certificate.
    refreshed = tokens_of(double, post(double, double["mtls_url"] + "/token", {
        "grant_type": "refresh_token", "refresh_token": body["refresh_token"], "client_id": "mtls"}, cert=client_cert(pki)))
    revoked = post(double, double["mtls_url"] + "/revoke", {"token": refreshed["refresh_token"], "client_id": "mtls"},
                   cert=client_cert(pki))
    assert revoked.status_code == 200 and last(double, "revocation", "mtls")["revoked"] == "refresh_token"


def test_a_certificate_of_another_ca_fails_the_handshake_and_a_self_signed_one_is_not_tls_client_auth(double):
    pki = double["pki"]
    flow = Flow("mtls")
    code = flow.code(double)
    before = len(double["log"]())
    with pytest.raises(requests.exceptions.SSLError):
        post(double, double["mtls_url"] + "/token", flow.redeem_form(code), cert=client_cert(pki, "untrusted"))
    failures = entries(double["log"](since=before), "tls-handshake")
    assert failures and failures[-1]["handshake_error"] == "CERTIFICATE_VERIFY_FAILED", failures
    # Trusted at the TLS layer (a registered self-signed certificate), but not issued by the client CA.
    refused_client(post(double, double["mtls_url"] + "/token", flow.redeem_form(code), cert=client_cert(pki, "self-signed")),
                   "not issued by a trusted client CA")


def test_self_signed_tls_client_auth_takes_the_registered_certificate_only(double):
    pki = double["pki"]
    flow = Flow("self-signed")
    code = flow.code(double)
    refused_client(post(double, double["mtls_url"] + "/token", flow.redeem_form(code), cert=client_cert(pki)),
                   "not one the client registered")
    tokens_of(double, post(double, double["mtls_url"] + "/token", flow.redeem_form(code), cert=client_cert(pki, "self-signed")))
    entry = last(double, "token", "self-signed")
    assert entry["client_auth"] == "self_signed_tls_client_auth" and entry["bound"] is True
    assert entry["client_certificate"]["sha256"] == certificate_thumbprint(pki.self_signed_cert)


# --- PAR ------------------------------------------------------------------------------------------


def test_par_required_refuses_a_plain_request_and_serves_a_pushed_one_once(double):
    pki = double["pki"]
    flow = Flow("pk-par")
    plain = flow.authorize(double)
    assert plain.status_code == 302, plain.text
    received = query(plain.headers["Location"])
    assert received["error"] == "invalid_request" and "code" not in received and "RFC 9126" in received["error_description"]
    assert received["state"] == flow.params["state"]
    # Pushing needs client authentication, and refuses a request_uri inside.
    refused_client(post(double, double["url"] + "/par", flow.params))
    nested = post(double, double["url"] + "/par", {**flow.params, "request_uri": "urn:x", **assertion_form(double, pki.ec_key, "pk-par")})
    assert nested.status_code == 400 and nested.json()["error"] == "invalid_request"
    # A pushed request is validated as at the authorization endpoint.
    unregistered = post(double, double["url"] + "/par", {**flow.params, "redirect_uri": "https://evil.example/cb",
                                                         **assertion_form(double, pki.ec_key, "pk-par")})
    assert unregistered.status_code == 400, unregistered.text
    pushed = post(double, double["url"] + "/par", {**flow.params, **assertion_form(double, pki.ec_key, "pk-par")})
    assert pushed.status_code == 201, pushed.text
    request_uri = pushed.json()["request_uri"]
    assert request_uri.startswith("urn:ietf:params:oauth:request_uri:") and pushed.json()["expires_in"] > 0
    entry = last(double, "par", "pk-par")
    assert entry["client_auth"] == "private_key_jwt" and entry["params"]["code_challenge_method"] == "S256"
    # Another client may not use it; it stays usable for its own.
    stolen = get(double, double["url"] + "/authorize", params={"client_id": "pk-es", "request_uri": request_uri})
    assert stolen.status_code == 400 and stolen.json()["error"] == "invalid_request_uri", stolen.text
    answer = get(double, double["url"] + "/authorize", params={"client_id": "pk-par", "request_uri": request_uri})
    assert answer.status_code == 302, answer.text
    received = query(answer.headers["Location"])
    assert received["state"] == flow.params["state"] and received["iss"] == double["url"]
    double["seen"].add(received["code"], kind="upstream authorization code")
    entry = last(double, "authorize", "pk-par")
    assert entry["pushed"] is True and entry["query"] == ["client_id", "request_uri"]
    assert set(entry["pushed_params"]) >= {"code_challenge", "code_challenge_method", "nonce", "state", "redirect_uri"}
    reused = get(double, double["url"] + "/authorize", params={"client_id": "pk-par", "request_uri": request_uri})
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_request_uri"
    body = tokens_of(double, post(double, double["url"] + "/token", {**flow.redeem_form(received["code"]),
                                                                     **assertion_form(double, pki.ec_key, "pk-par")}))
    assert body["id_token"]
    assert last(double, "token", "pk-par")["code_was_pushed"] is True


def test_par_over_the_mtls_alias_with_a_certificate(double):
    pki = double["pki"]
    flow = Flow("mtls")
    pushed = post(double, double["mtls_url"] + "/par", flow.params, cert=client_cert(pki))
    assert pushed.status_code == 201, pushed.text
    entry = last(double, "par", "mtls")
    assert entry["listener"] == "mtls" and entry["client_auth"] == "tls_client_auth"
    answer = get(double, double["url"] + "/authorize", params={"client_id": "mtls", "request_uri": pushed.json()["request_uri"]})
    assert answer.status_code == 302 and "code" in query(answer.headers["Location"]), answer.text
    double["seen"].add(query(answer.headers["Location"])["code"], kind="upstream authorization code")


def test_a_registered_x5c_that_is_not_an_array_is_invalid_client_not_a_crash(double):
    pki = double["pki"]
    flow = Flow("self-signed-malformed")
    refused_client(post(double, double["mtls_url"] + "/token", flow.redeem_form(flow.code(double)),
                        cert=client_cert(pki, "self-signed")), "x5c")
