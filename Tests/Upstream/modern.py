"""A modern upstream authorization server for Gatehouse tests: private_key_jwt, mutual TLS, PAR.

An OpenID Connect provider over HTTPS built from authlib's server side (authorization code grant,
PKCE, OpenID Connect code flow, refresh grant, RFC 7009 revocation, RFC 7523 client assertions),
with the parts authlib has no server code for written here from their RFCs: pushed authorization
requests (RFC 9126) and mutual-TLS client authentication and certificate-bound tokens (RFC 8705).
No database: everything lives in memory for the life of the process. Run it with the repo's venv:

    .venv/bin/python Tests/Upstream/modern.py --config cfg.json [--port 0] [--mtls-port 0] [--host 127.0.0.1] [--quiet]

Once both listeners listen it prints exactly one line to stdout and nothing after it:

    {"ready": true, "url": "https://127.0.0.1:PORT", "mtls_url": "https://127.0.0.1:PORT2"}

`url` is the issuer. Access log (method, path without its query, listener, status) and errors go
to stderr (--quiet: tracebacks only); no secret is ever written there. SIGTERM/SIGINT exit 0.

Config (every key but "server_certificate", "server_key" and "clients" optional; defaults in
parentheses):

    {"server_certificate": "server.pem",      # PEM chain of both listeners (for 127.0.0.1)
     "server_key": "server-key.pem",
     "client_ca_file": "client-ca.pem",       # trust roots of tls_client_auth certificates (none)
     "trusted_self_signed_certificates": ["self.pem"],
                                              # certificates the mTLS listener accepts at the TLS
                                              # layer besides those of client_ca_file (see below)
     "require_pushed_authorization_requests": false,   # for every client (false)
     "par_expires_in": 60,                    # lifetime of a request_uri (60)
     "access_token_expires_in": 3600, "authorization_code_expires_in": 60,
     "assertion_leeway": 0,                   # clock skew allowed on exp/nbf/iat of assertions (0)
     "max_assertion_lifetime": null,          # refuse assertions whose exp - iat is longer (none)
     "clock_offset": 0,                       # seconds this server's clock is ahead (negative: behind)
     "user": {"sub": "alice-sub-1", "name": "Alice Liddell", "given_name": "Alice",
              "family_name": "Liddell", "email": "alice@example.test"},
     "clients": [{
        "client_id": "gatehouse-pkjwt",
        "token_endpoint_auth_method": "private_key_jwt",   # | tls_client_auth |
                                                            # self_signed_tls_client_auth | client_secret_basic
        "jwks": {"keys": [...]},              # the client's public keys, inline, or
        "jwks_uri": "http://127.0.0.1:8080/upstreams/modern/jwks.json",  # fetched at every verification
        "assertion_audience": "issuer",       # aud accepted: "issuer" (the issuer only),
                                              # "token_endpoint" (the main token endpoint URL only,
                                              # at every endpoint), "endpoint" (the exact URL of the
                                              # endpoint the assertion is posted to, listener and
                                              # path: as idpyoidc checks at each of its endpoints),
                                              # "any" (issuer, token, PAR, revocation endpoint URLs) ("any")
        "assertion_algorithms": ["RS256", "PS256", "ES256"],
        "tls_client_auth_subject_dn": "CN=gatehouse-mtls,O=Gatehouse Tests",  # tls_client_auth
        "client_secret_env": "ENV_VAR",       # client_secret_basic: env var holding the secret
        "redirect_uris": ["http://127.0.0.1:8080/oauth/callback"],
        "scopes": ["openid", "profile", "email"],           # what it may be granted (these)
        "max_assertion_lifetime": 30,         # this client's, instead of the server's
        "require_par": false}]}               # this client must push its requests (false)

Listeners (both HTTPS with the server certificate, HTTP/1.1 keep-alive):

    main (url)       asks for no client certificate. Everything but the mTLS aliases.
    mtls (mtls_url)  asks for a client certificate (CERT_OPTIONAL). Python's ssl cannot ask for a
                     certificate and accept any: the handshake verifies it against client_ca_file,
                     trusted_self_signed_certificates and the x5c of every self-signed client's
                     inline jwks. A certificate none of them vouches for fails the handshake (logged
                     with "handshake_error"). Which client a certificate authenticates is decided
                     after, by the auth method.

Endpoints:

    GET  /.well-known/openid-configuration   discovery (also /.well-known/oauth-authorization-server)
    GET  /jwks.json                          the RSA key of the ID tokens
    GET  /authorize                          authorization endpoint: signs the configured user in at
                                             once, redirects with code, state and iss (RFC 9207)
    POST /par        (main and mtls)         RFC 9126: 201 {"request_uri", "expires_in"}
    POST /token      (main and mtls)         authorization_code (PKCE S256 required for every
                                             client, nonce required with openid), refresh_token
                                             (rotating, single-use refresh tokens)
    POST /revoke     (main and mtls)         RFC 7009
    GET|POST /userinfo (main and mtls)       OpenID userinfo; certificate-bound tokens only on mtls,
                                             with the same certificate
    GET  /_test/log                          every request so far (below), JSON list; ?since=N
                                             skips the first N

Client authentication at /par, /token and /revoke (authlib's ClientAuthentication registry):
client_secret_basic (authlib's), private_key_jwt (authlib's JWTBearerClientAssertion: signature
against the client's jwks or jwks_uri, iss = sub, aud, exp, plus here: a jti seen before is
refused, iat required, exp - iat <= max_assertion_lifetime, the form's client_id must be sub,
the alg one of assertion_algorithms), tls_client_auth (RFC 8705 §2.1: a certificate issued by a
client_ca_file certificate, whose subject DN equals the registered one), and
self_signed_tls_client_auth (§2.2: the certificate is the x5c[0] of one key of the client's jwks
or jwks_uri). A client may use its registered method only. Failures are invalid_client, 401.

Tokens issued to a client authenticated by certificate are bound to it (RFC 8705 §3, cnf
x5t#S256, kept here): /userinfo then needs that certificate on the mtls listener, else 401
invalid_token.

Errors (RFC 6749 §5.2): JSON {"error", "error_description"} with status 400, or 401 and a
WWW-Authenticate header for invalid_client (token, PAR, revocation) and invalid_token (userinfo).
The authorization endpoint redirects its errors to a registered redirect_uri with error,
error_description, state and iss; without one it answers 400 JSON. A PAR-required client's plain
request: redirect with error=invalid_request. An unknown, spent, expired or other client's
request_uri: 400 {"error": "invalid_request_uri"}.

The log (/_test/log): one object per request, in arrival order:
    {"n", "at", "listener": "main" | "mtls", "method", "path", "url" (the listener's URL and the
     path, without the query: what an "endpoint" audience names), "endpoint", "status", "error",
     "error_description", "client_id" (the request's; else the authenticated client's), "form" / "query" (parameter names, sorted),
     "params" (values of the parameters that are no secret: response_type, client_id,
     redirect_uri, scope, code_challenge, code_challenge_method, grant_type, client_assertion_type,
     token_type_hint, prompt, request_uri), "client_auth" (the method that authenticated the
     client), "client_assertion": {"header", "claims"} (decoded, as received), "jwks_source"
     ("inline" | "jwks_uri"), "jwks_kids", "client_certificate": {"sha256" (base64url, the
     x5t#S256), "subject", "issuer"} (RFC 4514), "pushed" (authorize: served from a pushed
     request), "pushed_params" (its parameter names), "code_was_pushed" (token: the code came from
     a pushed request), "bound" (the tokens issued are certificate-bound), "refresh_rotated",
     "revoked" ("access_token" | "refresh_token" | null), "handshake_error", "refusal" (why a
     client assertion was refused: "unknown_key", "signature", "algorithm", "expired", "issued_in_future",
     "lifetime", "replayed", "claim <name>" (missing or invalid, e.g. "claim aud"), "client_id")}.
Handshake failures are entries too ({"endpoint": "tls-handshake", "handshake_error"}).

Secrets record: when GATEHOUSE_SECRETS_RECORD names a file, every secret received or issued is
appended to it as serve.py does (codes, verifiers, state, nonce, tokens, client secrets) and
every client assertion received ("client assertion").
"""

import argparse
import base64
import hashlib
import json
import os
import secrets
import signal
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import requests
from authlib.oauth2.rfc6749 import AuthorizationServer, ClientMixin, OAuth2Request, TokenMixin
from authlib.oauth2.rfc6749 import grants
from authlib.oauth2.rfc6749.errors import InvalidClientError, InvalidRequestError, OAuth2Error
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7523 import JWTBearerClientAssertion
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import OpenIDCode
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, RSAKey

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the sandbox package
from sandbox.secretsrecord import SecretsRecord  # noqa: E402

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
REQUEST_URI_PREFIX = "urn:ietf:params:oauth:request_uri:"
AUTH_METHODS = ["client_secret_basic", "private_key_jwt", "tls_client_auth", "self_signed_tls_client_auth"]
CERTIFICATE_METHODS = ("tls_client_auth", "self_signed_tls_client_auth")
ASSERTION_ALGORITHMS = ["RS256", "PS256", "ES256"]
#: Parameters whose values the log shows (none is a secret; state, nonce, code, verifier, tokens are).
PUBLIC_PARAMS = ("response_type", "client_id", "redirect_uri", "scope", "code_challenge", "code_challenge_method",
                 "grant_type", "client_assertion_type", "token_type_hint", "prompt", "request_uri")
#: Parameters that are client authentication, never part of a pushed authorization request's content.
AUTH_PARAMS = ("client_assertion", "client_assertion_type", "client_secret")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def certificate_thumbprint(der):
    """x5t#S256 (RFC 8705 §3.1): base64url SHA-256 of the DER certificate."""
    return b64url(hashlib.sha256(der).digest())


def now(state=None):
    return int(time.time()) + (state.clock_offset if state else 0)


# --- models -------------------------------------------------------------------------------------


class Client(ClientMixin):
    def __init__(self, config):
        self.client_id = config["client_id"]
        self.auth_method = config.get("token_endpoint_auth_method", "private_key_jwt")
        if self.auth_method not in AUTH_METHODS:
            sys.exit(f"modern.py: {self.client_id}: unknown token_endpoint_auth_method {self.auth_method!r}")
        self.jwks = config.get("jwks")
        self.jwks_uri = config.get("jwks_uri")
        self.assertion_audience = config.get("assertion_audience", "any")
        self.assertion_algorithms = config.get("assertion_algorithms", ASSERTION_ALGORITHMS)
        self.subject_dn = config.get("tls_client_auth_subject_dn")
        self.redirect_uris = config.get("redirect_uris", [])
        self.scopes = config.get("scopes", ["openid", "profile", "email"])
        self.require_par = config.get("require_par", False)
        self.max_assertion_lifetime = config.get("max_assertion_lifetime")  # overrides the server's
        self.secret = os.environ.get(config["client_secret_env"]) if config.get("client_secret_env") else None
        if self.auth_method == "client_secret_basic" and not self.secret:
            sys.exit(f"modern.py: {self.client_id}: set client_secret_env to a non-empty environment variable")
        if self.auth_method == "tls_client_auth" and not self.subject_dn:
            sys.exit(f"modern.py: {self.client_id}: tls_client_auth needs tls_client_auth_subject_dn")
        if self.auth_method in ("private_key_jwt", "self_signed_tls_client_auth") and not (self.jwks or self.jwks_uri):
            sys.exit(f"modern.py: {self.client_id}: {self.auth_method} needs jwks or jwks_uri")

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return self.redirect_uris[0] if self.redirect_uris else None

    def get_allowed_scope(self, scope):
        if not scope:
            return ""
        return " ".join(s for s in scope.split() if s in self.scopes)

    def check_redirect_uri(self, redirect_uri):
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret):
        return self.secret is not None and secrets.compare_digest(client_secret.encode(), self.secret.encode())

    def check_endpoint_auth_method(self, method, endpoint):
        return method == self.auth_method

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type in ("authorization_code", "refresh_token")


class AuthorizationCode:
    def __init__(self, code, request, user, state):
        data = request.payload.data
        self.code = code
        self.client_id = request.client.client_id
        self.redirect_uri = data.get("redirect_uri")
        self.scope = request.scope
        self.nonce = data.get("nonce")
        self.code_challenge = data.get("code_challenge")
        self.code_challenge_method = data.get("code_challenge_method")
        self.user = user
        self.auth_time = now(state)
        self.expires_at = time.time() + state.config.get("authorization_code_expires_in", 60)
        self.pushed = getattr(request, "pushed", False)

    def get_redirect_uri(self):
        return self.redirect_uri

    def get_scope(self):
        return self.scope

    def get_nonce(self):
        return self.nonce

    def get_auth_time(self):
        return self.auth_time

    def get_acr(self):
        return None

    def get_amr(self):
        return None


class Token(TokenMixin):
    def __init__(self, token, client_id, user, cnf, expires_in):
        self.access_token = token["access_token"]
        self.refresh_token = token.get("refresh_token")
        self.scope = token.get("scope", "")
        self.client_id = client_id
        self.user = user
        self.cnf = cnf  # x5t#S256 of the certificate the tokens are bound to, or None
        self.issued_at = time.time()
        self.expires_in = expires_in
        self.access_revoked = False
        self.refresh_revoked = False  # revoked, or spent by a refresh (rotation)

    def check_client(self, client):
        return client.client_id == self.client_id

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.expires_in

    def is_expired(self):
        return time.time() > self.issued_at + self.expires_in

    def is_revoked(self):
        return self.access_revoked


class TokenRef:
    """A token found by its access or refresh token string, and which of the two it was."""

    def __init__(self, token, kind):
        self.token, self.kind = token, kind

    def check_client(self, client):
        return self.token.check_client(client)


class WireRequest(OAuth2Request):
    """An OAuth2Request built from what arrived on the wire, with the TLS facts and the log entry."""

    def __init__(self, method, uri, headers, data, listener, peer_certificate, entry, form=None):
        super().__init__(method, uri, headers=headers)
        self._form = form if form is not None else (data if method == "POST" else {})
        self._args = data if method == "GET" else {}
        self.payload = BasicOAuth2Payload(data)
        self.listener = listener
        self.peer_certificate = peer_certificate  # DER or None
        self.entry = entry
        self.pushed = False

    @property
    def form(self):
        return self._form

    @property
    def args(self):
        return self._args


# --- the authorization server -------------------------------------------------------------------


class State:
    """Everything the server holds: config, clients, codes, tokens, pushed requests, seen jti, the log."""

    def __init__(self, config, record):
        self.config = config
        self.record = record
        self.clients = {c["client_id"]: Client(c) for c in config["clients"]}
        self.user = config.get("user", {"sub": "alice-sub-1", "name": "Alice Liddell", "given_name": "Alice",
                                        "family_name": "Liddell", "email": "alice@example.test"})
        self.clock_offset = config.get("clock_offset", 0)
        self.lock = threading.Lock()
        self.refresh_lock = threading.Lock()
        self.codes = {}
        self.access_tokens = {}
        self.refresh_tokens = {}
        self.pushed = {}  # request_uri -> (client_id, params, expires_at)
        self.jtis = {}  # (client_id, jti) -> exp
        self.log = []
        self.client_ca = None
        if config.get("client_ca_file"):
            self.client_ca = x509.load_pem_x509_certificates(Path(config["client_ca_file"]).read_bytes())
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.signing_key = RSAKey.import_key(private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self.signing_kid = self.signing_key.thumbprint()
        self.issuer = None  # set once listening
        self.mtls_url = None

    def endpoint(self, name, mtls=False):
        return (self.mtls_url if mtls else self.issuer) + {"token": "/token", "par": "/par", "revocation": "/revoke",
                                                           "userinfo": "/userinfo", "authorize": "/authorize"}[name]

    def append_log(self, entry):
        with self.lock:
            entry["n"] = len(self.log)
            self.log.append(entry)

    def client_keys(self, client, entry):
        """The client's JWK set: inline, or fetched from its jwks_uri now."""
        if client.jwks is not None:
            document, source = client.jwks, "inline"
        else:
            try:
                answer = requests.get(client.jwks_uri, timeout=10)
                answer.raise_for_status()
                document = answer.json()
            except (requests.RequestException, ValueError) as error:
                entry["jwks_source"] = "jwks_uri"
                raise InvalidClientError(status_code=401, description=f"The client's jwks_uri could not be read: {type(error).__name__}") from None
            source = "jwks_uri"
        entry["jwks_source"] = source
        entry["jwks_kids"] = [key.get("kid") for key in document.get("keys", [])]
        return document


def certificate_facts(der):
    certificate = x509.load_der_x509_certificate(der)
    return certificate, {"sha256": certificate_thumbprint(der), "subject": certificate.subject.rfc4514_string(),
                         "issuer": certificate.issuer.rfc4514_string()}


def certificate_method(method, state):
    """The client authentication function of tls_client_auth or self_signed_tls_client_auth."""

    def authenticate(query_client, request):
        client_id = request.form.get("client_id")
        if not client_id:
            return None
        client = query_client(client_id)
        if client is None or client.auth_method != method:
            return None
        if request.peer_certificate is None:
            raise InvalidClientError(status_code=401, description=(
                "No client certificate on this connection" + (" (use the mtls_endpoint_aliases)" if request.listener == "main" else "")))
        certificate, _ = certificate_facts(request.peer_certificate)
        if method == "tls_client_auth":
            issuers = [ca for ca in (state.client_ca or []) if ca.subject == certificate.issuer]
            issued = False
            for ca in issuers:
                try:
                    certificate.verify_directly_issued_by(ca)
                    issued = True
                except (ValueError, TypeError, Exception):  # InvalidSignature included
                    continue
            if not issued:
                raise InvalidClientError(status_code=401, description="The client certificate is not issued by a trusted client CA")
            expected = x509.Name.from_rfc4514_string(client.subject_dn)
            if certificate.subject != expected:
                raise InvalidClientError(status_code=401, description="The client certificate's subject DN is not the registered tls_client_auth_subject_dn")
        else:
            registered = registered_certificates(state.client_keys(client, request.entry))
            if request.peer_certificate not in registered:
                raise InvalidClientError(status_code=401, description="The client certificate is not one the client registered (x5c)")
        return client

    return authenticate


def registered_certificates(document):
    """The DER certificates a self-signed client registered: x5c[0] of each key (RFC 8705 §2.2).
    An x5c that is not an array of base64 DER certificates (RFC 7517 §4.7) is invalid_client."""
    found = []
    for key in document.get("keys", []) if isinstance(document, dict) else []:
        if "x5c" not in key:
            continue
        chain = key["x5c"]
        if not isinstance(chain, list) or not chain or not all(isinstance(item, str) for item in chain):
            raise InvalidClientError(status_code=401, description=(
                "The client's JWK set has an x5c that is not an array of base64 certificates (RFC 7517 section 4.7)"))
        try:
            found.append(base64.b64decode(chain[0], validate=True))
        except ValueError:
            raise InvalidClientError(status_code=401, description="The client's JWK set has an x5c that is not base64") from None
    return found


class PrivateKeyJWT(JWTBearerClientAssertion):
    """authlib's RFC 7523 client assertion verifier, with this server's keys, audiences and jti store."""

    CLIENT_AUTH_METHOD = "private_key_jwt"

    def __init__(self, state):
        super().__init__(validate_jti=True, leeway=state.config.get("assertion_leeway", 0))
        self.state = state
        self.local = threading.local()

    def __call__(self, query_client, request):
        form = request.form
        assertion_type, assertion = form.get("client_assertion_type"), form.get("client_assertion")
        if not assertion and not assertion_type:
            return None
        if assertion_type != ASSERTION_TYPE or not assertion:
            raise InvalidClientError(status_code=401, description="client_assertion_type must be jwt-bearer, with a client_assertion")
        self.state.record.add("client assertion", assertion)
        try:
            obj = jws.extract_compact(assertion.encode())
            request.entry["client_assertion"] = {"header": obj.headers(), "claims": json.loads(obj.payload)}
        except (JoseError, ValueError):
            request.entry["client_assertion"] = {"header": None, "claims": None}
        self.local.request = request
        self.local.client = None
        client = super().__call__(query_client, request)
        if client is not None and form.get("client_id") and form["client_id"] != client.client_id:
            raise self.refusal("client_id", "client_id is not the assertion's subject")
        return client

    def refusal(self, reason, description):
        """invalid_client (401), its reason recorded in the request's log entry ("refusal")."""
        self.local.request.entry["refusal"] = reason
        return InvalidClientError(status_code=401, description=description)

    def resolve_client_public_key(self, client):
        self.local.client = client
        document = self.state.client_keys(client, self.local.request.entry)
        try:
            return KeySet.import_key_set(document)
        except (JoseError, ValueError, TypeError, KeyError) as error:
            raise InvalidClientError(status_code=401, description=f"The client's JWK set cannot be read: {type(error).__name__}") from None

    def get_audiences(self):
        client, state = self.local.client, self.state
        issuer, token, par, revocation = (state.issuer, state.endpoint("token"), state.endpoint("par"),
                                          state.endpoint("revocation"))
        if client.assertion_audience == "endpoint":
            return [self.local.request.entry["url"]]
        return {"issuer": [issuer], "token_endpoint": [token]}.get(client.assertion_audience, [issuer, token, par, revocation])

    def process_assertion_claims(self, assertion, resolve_key):
        # authlib's, with the algorithms this client may use (joserfc's default omits PS256).
        client = self.local.client
        try:
            header = jws.extract_compact(assertion.encode()).headers()
        except JoseError as error:
            raise InvalidClientError(status_code=401, description="Invalid JWT assertion.") from error
        if header.get("alg") not in client.assertion_algorithms:
            raise self.refusal("algorithm", f"alg {header.get('alg')} is not one this client may use")
        try:
            token = jwt.decode(assertion, resolve_key, algorithms=client.assertion_algorithms)
        except JoseError as error:
            # No registered key has the assertion's kid, or the key that has it did not sign it.
            reason = "unknown_key" if error.error == "invalid_key_id" else "signature"
            raise self.refusal(reason, f"The assertion's signature does not verify: {error.error}") from error
        self.verify_claims(token.claims)
        return token.claims

    def verify_claims(self, claims):
        state = self.state
        current, leeway = now(state), self.leeway
        if not isinstance(claims.get("iat"), int):
            raise self.refusal("claim iat", "Missing or invalid claim: 'iat'")
        if not isinstance(claims.get("exp"), int):
            raise self.refusal("claim exp", "Missing or invalid claim: 'exp'")
        if claims["exp"] < current - leeway:
            raise self.refusal("expired", "The assertion has expired")
        if claims["iat"] > current + leeway:
            raise self.refusal("issued_in_future", "The assertion is issued in the future")
        client = self.local.client
        longest = client.max_assertion_lifetime if client.max_assertion_lifetime is not None else state.config.get("max_assertion_lifetime")
        if longest is not None and claims["exp"] - claims["iat"] > longest:
            raise self.refusal("lifetime", f"The assertion lives longer than {longest} s")
        try:
            super().verify_claims(claims)  # authlib: iss, sub (equal), aud, exp, jti (validate_jti)
        except InvalidClientError as error:
            error.status_code = 401
            entry = self.local.request.entry
            # joserfc names the claim it refused; authlib's own checks are of sub (= iss) and jti.
            claim = getattr(error.__cause__, "claim", None) or ("jti" if "JWT ID" in (error.description or "") else "sub")
            entry.setdefault("refusal", f"claim {claim}")
            raise

    def validate_jti(self, claims, jti):
        key = (claims["sub"], jti)
        with self.state.lock:
            if key in self.state.jtis:
                self.local.request.entry["refusal"] = "replayed"
                return False
            self.state.jtis[key] = claims["exp"]
            return True


class PKCE(CodeChallenge):
    """authlib's PKCE, S256 required for every client (not only public ones)."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant, redirect_uri):
        super().validate_code_challenge(grant, redirect_uri)
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("PKCE is required: code_challenge with code_challenge_method S256")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("code_challenge_method must be S256")

    def get_authorization_code_challenge(self, authorization_code):
        return authorization_code.code_challenge

    def get_authorization_code_challenge_method(self, authorization_code):
        return authorization_code.code_challenge_method


class OpenID(OpenIDCode):
    def __init__(self, state):
        super().__init__(require_nonce=True)
        self.state = state

    def exists_nonce(self, nonce, request):
        return False

    def resolve_client_private_key(self, client):
        return self.state.signing_key

    def get_client_algorithm(self, client):
        return "RS256"

    def get_encode_header(self, client):
        return {"alg": "RS256", "kid": self.state.signing_kid, "typ": "JWT"}

    def get_client_claims(self, client):
        return {"iss": self.state.issuer, "aud": [client.client_id]}

    def generate_user_info(self, user, scope):
        return user_claims(user, scope)


def user_claims(user, scope):
    scopes = set((scope or "").split())
    claims = {"sub": user["sub"]}
    if "profile" in scopes:
        claims.update({k: user[k] for k in ("name", "given_name", "family_name") if k in user})
    if "email" in scopes and "email" in user:
        claims.update({"email": user["email"], "email_verified": True})
    return claims


def make_server(state):
    class CodeGrant(grants.AuthorizationCodeGrant):
        TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS

        def save_authorization_code(self, code, request):
            state.record.add("upstream authorization code", code)
            with state.lock:
                state.codes[code] = AuthorizationCode(code, request, request.user, state)

        def query_authorization_code(self, code, client):
            with state.lock:
                found = state.codes.get(code)
            if found and found.client_id == client.client_id and time.time() < found.expires_at:
                self.request.entry["code_was_pushed"] = found.pushed
                return found
            return None

        def delete_authorization_code(self, authorization_code):
            with state.lock:
                state.codes.pop(authorization_code.code, None)

        def authenticate_user(self, authorization_code):
            return authorization_code.user

    class RefreshGrant(grants.RefreshTokenGrant):
        TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS
        INCLUDE_NEW_REFRESH_TOKEN = True

        def authenticate_refresh_token(self, refresh_token):
            with state.lock:
                token = state.refresh_tokens.get(refresh_token)
            if token is None:
                self.request.entry["refresh_token_known"] = False
                return None
            if token.refresh_revoked:
                self.request.entry["refresh_token_spent"] = True
                return None
            return token

        def authenticate_user(self, refresh_token):
            return refresh_token.user

        def revoke_old_credential(self, refresh_token):
            refresh_token.refresh_revoked = True  # single use: rotated
            self.request.entry["refresh_rotated"] = True

    class Revocation(RevocationEndpoint):
        CLIENT_AUTH_METHODS = AUTH_METHODS

        def query_token(self, token_string, token_type_hint):
            with state.lock:
                by_access, by_refresh = state.access_tokens.get(token_string), state.refresh_tokens.get(token_string)
            if token_type_hint == "refresh_token" and by_refresh:
                return TokenRef(by_refresh, "refresh_token")
            if by_access:
                return TokenRef(by_access, "access_token")
            if by_refresh:
                return TokenRef(by_refresh, "refresh_token")
            return None

        def revoke_token(self, token, request):
            if token.kind == "refresh_token":  # RFC 7009 §2.1: its access token goes with it
                token.token.refresh_revoked = True
            token.token.access_revoked = True
            request.entry["revoked"] = token.kind

    class Server(AuthorizationServer):
        def query_client(self, client_id):
            return state.clients.get(client_id)

        def save_token(self, token, request):
            bound = request.auth_method in CERTIFICATE_METHODS
            cnf = certificate_thumbprint(request.peer_certificate) if bound else None
            record = Token(token, request.client.client_id, request.user, cnf, token.get("expires_in", 3600))
            with state.lock:
                state.access_tokens[record.access_token] = record
                if record.refresh_token:
                    state.refresh_tokens[record.refresh_token] = record
            request.entry["bound"] = bound

        def send_signal(self, name, *args, **kwargs):
            pass

        def create_oauth2_request(self, request):
            return request

        def handle_response(self, status, body, headers):
            return status, body, headers

        def handle_error_response(self, request, error):
            if error.error == "invalid_client":
                error.status_code = 401  # RFC 6749 §5.2, with WWW-Authenticate (authlib adds it for 401)
            return super().handle_error_response(request, error)

    def generate_token(grant_type, client, user=None, scope=None, expires_in=None, include_refresh_token=True):
        token = {"token_type": "Bearer", "access_token": secrets.token_urlsafe(32),
                 "expires_in": expires_in or state.config.get("access_token_expires_in", 3600), "scope": scope or ""}
        if include_refresh_token:
            token["refresh_token"] = secrets.token_urlsafe(32)
        return token

    server = Server(scopes_supported=["openid", "profile", "email", "offline_access"])
    server.register_token_generator("default", generate_token)
    server.register_client_auth_method("private_key_jwt", PrivateKeyJWT(state))
    for method in CERTIFICATE_METHODS:
        server.register_client_auth_method(method, certificate_method(method, state))
    server.register_grant(CodeGrant, [PKCE(required=True), OpenID(state)])
    server.register_grant(RefreshGrant)
    server.register_endpoint(Revocation)
    return server


# --- HTTP ---------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection is closed after a minute

    def log_message(self, format, *args):
        pass  # the access log is written by `finish_entry`, without the query

    @property
    def state(self):
        return self.server.state

    @property
    def listener(self):
        return self.server.listener

    def peer_certificate(self):
        try:
            return self.connection.getpeercert(binary_form=True)
        except (ValueError, AttributeError):
            return None

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def parameters(self, raw):
        parsed = parse_qs(raw, keep_blank_values=True)
        duplicated = sorted(name for name, values in parsed.items() if len(values) > 1)
        return {name: values[0] for name, values in parsed.items()}, duplicated

    def new_entry(self, endpoint, data, kind):
        entry = {"at": time.time(), "listener": self.listener, "method": self.command, "path": urlsplit(self.path).path,
                 "endpoint": endpoint, kind: sorted(data), "client_id": data.get("client_id"),
                 "params": {name: data[name] for name in PUBLIC_PARAMS if name in data},
                 "client_auth": None, "client_assertion": None, "client_certificate": None, "status": None, "error": None}
        der = self.peer_certificate()
        if der:
            entry["client_certificate"] = certificate_facts(der)[1]
        return entry

    def answer(self, entry, status, body, headers=()):
        """Writes (status, body, headers): a dict body as JSON; logs the entry."""
        headers = list(headers)
        if isinstance(body, dict) or isinstance(body, list):
            if isinstance(body, dict) and "error" in body and entry is not None:
                entry["error"] = body["error"]
                entry["error_description"] = body.get("error_description")
            payload = json.dumps(body).encode()
            if not any(name.lower() == "content-type" for name, _ in headers):
                headers.append(("Content-Type", "application/json"))
        else:
            payload = (body or "").encode() if isinstance(body, str) else (body or b"")
        if entry is not None:
            location = dict((name.lower(), value) for name, value in headers).get("location")
            if location and "error=" in location:
                returned = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
                entry["error"], entry["error_description"] = returned.get("error"), returned.get("error_description")
            entry["status"] = status
            self.state.append_log(entry)
        self.send_response(status)
        for name, value in headers:
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        if not self.server.quiet:
            sys.stderr.write(f"{self.command} {urlsplit(self.path).path} [{self.listener}] {status}\n")

    def error(self, entry, status, error, description, headers=()):
        return self.answer(entry, status, {"error": error, "error_description": description},
                           [("Cache-Control", "no-store"), *headers])

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def dispatch(self, method):
        path = urlsplit(self.path).path
        mtls = self.listener == "mtls"
        routes = {
            ("GET", "/.well-known/openid-configuration"): self.discovery,
            ("GET", "/.well-known/oauth-authorization-server"): self.discovery,
            ("GET", "/jwks.json"): self.jwks,
            ("GET", "/authorize"): self.authorize,
            ("POST", "/par"): self.par,
            ("POST", "/token"): self.token,
            ("POST", "/revoke"): self.revoke,
            ("GET", "/userinfo"): self.userinfo,
            ("POST", "/userinfo"): self.userinfo,
            ("GET", "/_test/log"): self.test_log,
        }
        if mtls and path not in ("/par", "/token", "/revoke", "/userinfo"):
            route = None
        else:
            route = routes.get((method, path))
        body = self.read_body() if method == "POST" else b""
        try:
            if route is None:
                return self.answer(None, 404, {"error": "not_found"})
            route(body)
        except Exception:  # a bug of this server: 500, with the traceback on stderr
            import traceback
            traceback.print_exc()
            try:
                self.answer(None, 500, {"error": "server_error", "error_description": "modern.py failed; see its stderr"})
            except OSError:
                pass

    # --- endpoints ---

    def discovery(self, _):
        state = self.state
        aliases = {"token_endpoint": state.endpoint("token", True), "revocation_endpoint": state.endpoint("revocation", True),
                   "userinfo_endpoint": state.endpoint("userinfo", True),
                   "pushed_authorization_request_endpoint": state.endpoint("par", True)}
        document = {
            "issuer": state.issuer,
            "authorization_endpoint": state.endpoint("authorize"),
            "token_endpoint": state.endpoint("token"),
            "userinfo_endpoint": state.endpoint("userinfo"),
            "jwks_uri": state.issuer + "/jwks.json",
            "revocation_endpoint": state.endpoint("revocation"),
            "pushed_authorization_request_endpoint": state.endpoint("par"),
            "require_pushed_authorization_requests": bool(state.config.get("require_pushed_authorization_requests", False)),
            "scopes_supported": ["openid", "profile", "email"],
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": AUTH_METHODS,
            "token_endpoint_auth_signing_alg_values_supported": ASSERTION_ALGORITHMS,
            "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
            "revocation_endpoint_auth_signing_alg_values_supported": ASSERTION_ALGORITHMS,
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "nonce", "name", "given_name", "family_name", "email",
                                 "email_verified"],
            "mtls_endpoint_aliases": aliases,
            "tls_client_certificate_bound_access_tokens": True,
            "authorization_response_iss_parameter_supported": True,
        }
        self.answer(None, 200, document)

    def jwks(self, _):
        key = self.state.signing_key.as_dict(private=False)
        key.update({"kid": self.state.signing_kid, "use": "sig", "alg": "RS256"})
        self.answer(None, 200, {"keys": [key]})

    def test_log(self, _):
        since = int(parse_qs(urlsplit(self.path).query).get("since", ["0"])[0])
        with self.state.lock:
            entries = self.state.log[since:]
        self.answer(None, 200, entries)

    def oauth_request(self, data, entry, method="POST"):
        url = (self.state.issuer if self.listener == "main" else self.state.mtls_url) + self.path
        entry["url"] = url.split("?")[0]  # the URL the request was posted to: an "endpoint" audience
        return WireRequest(method, url, self.headers, data, self.listener, self.peer_certificate(), entry)

    def reply(self, entry, result, request=None):
        status, body, headers = result
        if request is not None:
            entry["client_auth"] = request.auth_method
            if entry.get("client_id") is None and request.client is not None:
                entry["client_id"] = request.client.client_id  # authenticated without a client_id parameter
        self.answer(entry, status, body, headers)

    def token(self, body):
        data, duplicated = self.parameters(body.decode(errors="replace"))
        entry = self.new_entry("token", data, "form")
        entry["grant_type"] = data.get("grant_type")
        record = self.state.record
        record.add("upstream authorization code", data.get("code"))
        record.add("PKCE verifier toward the upstream", data.get("code_verifier"))
        record.add("refresh token presented to the upstream", data.get("refresh_token"))
        record_basic(record, self.headers.get("Authorization", ""))
        if duplicated:
            return self.error(entry, 400, "invalid_request", f"Repeated parameters: {', '.join(duplicated)}")
        request = self.oauth_request(data, entry)
        server = self.server.oauth
        if data.get("grant_type") == "refresh_token":
            with self.state.refresh_lock:  # single use: one refresh of a token at a time
                result = server.create_token_response(request)
        else:
            result = server.create_token_response(request)
        status, answer, _ = result
        if status == 200 and isinstance(answer, dict):
            record.add("upstream access token", answer.get("access_token"))
            record.add("upstream refresh token", answer.get("refresh_token"))
            record.add("upstream ID token", answer.get("id_token"))
        self.reply(entry, result, request)

    def revoke(self, body):
        data, _ = self.parameters(body.decode(errors="replace"))
        entry = self.new_entry("revocation", data, "form")
        entry["revoked"] = None
        self.state.record.add("token presented to the upstream (revoked or introspected)", data.get("token"))
        record_basic(self.state.record, self.headers.get("Authorization", ""))
        request = self.oauth_request(data, entry)
        self.reply(entry, self.server.oauth.create_endpoint_response("revocation", request), request)

    def par(self, body):
        state = self.state
        data, duplicated = self.parameters(body.decode(errors="replace"))
        entry = self.new_entry("par", data, "form")
        state.record.add("Gatehouse state toward the upstream", data.get("state"))
        state.record.add("OpenID nonce", data.get("nonce"))
        record_basic(state.record, self.headers.get("Authorization", ""))
        if duplicated:
            return self.error(entry, 400, "invalid_request", f"Repeated parameters: {', '.join(duplicated)}")
        request = self.oauth_request(data, entry)
        server = self.server.oauth
        try:
            client = server.authenticate_client(request, AUTH_METHODS, "pushed_authorization_request")
        except OAuth2Error as error:
            return self.reply(entry, server.handle_error_response(request, error), request)
        entry["client_auth"] = request.auth_method
        if "request_uri" in data:  # RFC 9126 §2.1
            return self.error(entry, 400, "invalid_request", "request_uri must not be pushed")
        if data.get("client_id") not in (None, client.client_id):
            return self.error(entry, 400, "invalid_request", "client_id is not the authenticated client")
        params = {name: value for name, value in data.items() if name not in AUTH_PARAMS}
        params["client_id"] = client.client_id
        # The same validation as at the authorization endpoint (RFC 9126 §2.1), answered here as JSON.
        check = WireRequest("GET", state.endpoint("authorize"), self.headers, params, self.listener, None, entry)
        try:
            grant = server.get_authorization_grant(check)
            grant.validate_authorization_request()
        except OAuth2Error as error:
            return self.error(entry, 400, error.error, error.get_error_description() or error.error)
        request_uri = REQUEST_URI_PREFIX + secrets.token_urlsafe(24)
        expires_in = state.config.get("par_expires_in", 60)
        with state.lock:
            state.pushed[request_uri] = (client.client_id, params, time.time() + expires_in)
        self.answer(entry, 201, {"request_uri": request_uri, "expires_in": expires_in}, [("Cache-Control", "no-store")])

    def authorize(self, _):
        state = self.state
        data, duplicated = self.parameters(urlsplit(self.path).query)
        entry = self.new_entry("authorize", data, "query")
        entry["pushed"] = False
        state.record.add("Gatehouse state toward the upstream", data.get("state"))
        state.record.add("OpenID nonce", data.get("nonce"))
        if duplicated:
            return self.error(entry, 400, "invalid_request", f"Repeated parameters: {', '.join(duplicated)}")
        client = state.clients.get(data.get("client_id", ""))
        if "request_uri" in data:
            with state.lock:
                pushed = state.pushed.get(data["request_uri"])
                if pushed is not None and pushed[0] == data.get("client_id"):
                    del state.pushed[data["request_uri"]]  # single use (another client's attempt does not spend it)
            if pushed is None or pushed[2] < time.time() or pushed[0] != data.get("client_id"):
                reason = "unknown or already used" if pushed is None else ("expired" if pushed[2] < time.time() else "pushed by another client")
                return self.error(entry, 400, "invalid_request_uri", f"The request_uri is {reason}")
            params = pushed[1]
            entry["pushed"] = True
            entry["pushed_params"] = sorted(params)
        else:
            if client is not None and (state.config.get("require_pushed_authorization_requests") or client.require_par):
                redirect_uri = data.get("redirect_uri") or client.get_default_redirect_uri()
                error = InvalidRequestError("Pushed authorization requests are required (RFC 9126): send request_uri from the PAR endpoint",
                                            state=data.get("state"))
                if redirect_uri and client.check_redirect_uri(redirect_uri):
                    error.redirect_uri = redirect_uri
                    return self.redirect_error(entry, error)
                return self.error(entry, 400, error.error, error.get_error_description())
            params = data
        request = WireRequest("GET", state.issuer + self.path, self.headers, params, self.listener, None, entry)
        request.pushed = entry["pushed"]
        server = self.server.oauth
        try:
            grant = server.get_authorization_grant(request)
            redirect_uri = grant.validate_authorization_request()
            status, body, headers = grant.create_authorization_response(redirect_uri, dict(state.user))
        except OAuth2Error as error:
            error.state = params.get("state")
            if error.redirect_uri:
                return self.redirect_error(entry, error)
            return self.error(entry, 400, error.error, error.get_error_description() or error.error)
        self.answer(entry, status, body, [(name, with_issuer(value, state.issuer) if name == "Location" else value)
                                          for name, value in headers])

    def redirect_error(self, entry, error):
        status, body, headers = error()
        self.answer(entry, status, body, [(name, with_issuer(value, self.state.issuer) if name == "Location" else value)
                                          for name, value in headers])

    def userinfo(self, body):
        state = self.state
        data, _ = self.parameters(body.decode(errors="replace")) if self.command == "POST" else ({}, [])
        entry = self.new_entry("userinfo", data, "form")
        scheme, _, value = self.headers.get("Authorization", "").partition(" ")
        token_string = value.strip() if scheme.lower() == "bearer" else data.get("access_token")
        state.record.add("upstream access token", token_string)
        if not token_string:
            return self.answer(entry, 401, b"", [("WWW-Authenticate", 'Bearer realm="modern"')])
        with state.lock:
            token = state.access_tokens.get(token_string)

        def refuse(description):
            escaped = description.replace('"', "'")
            return self.error(entry, 401, "invalid_token", description,
                              [("WWW-Authenticate", f'Bearer error="invalid_token", error_description="{escaped}"')])

        if token is None:
            return refuse("Unknown access token")
        entry["client_id"] = token.client_id
        if token.access_revoked:
            return refuse("The access token is revoked")
        if token.is_expired():
            return refuse("The access token has expired")
        if "openid" not in token.scope.split():
            return self.error(entry, 403, "insufficient_scope", "The access token lacks scope openid",
                              [("WWW-Authenticate", 'Bearer error="insufficient_scope", scope="openid"')])
        entry["bound"] = token.cnf is not None
        if token.cnf is not None:  # RFC 8705 §3
            der = self.peer_certificate()
            if self.listener != "mtls" or der is None:
                return refuse("The access token is bound to a client certificate; present it on the mtls_endpoint_aliases")
            if certificate_thumbprint(der) != token.cnf:
                return refuse("The client certificate is not the one the access token is bound to")
        self.answer(entry, 200, user_claims(token.user, token.scope), [("Cache-Control", "no-store")])


def with_issuer(location, issuer):
    """The redirect with RFC 9207's iss added."""
    parts = urlsplit(location)
    query = parts.query + ("&" if parts.query else "") + urlencode({"iss": issuer})
    return urlunsplit(parts._replace(query=query))


def record_basic(record, header):
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8", "replace")
        except ValueError:
            return
        record.add("upstream client secret", decoded.partition(":")[2])


class TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address, context, listener, state, oauth, quiet):
        self.state, self.listener, self.oauth, self.quiet = state, listener, oauth, quiet
        super().__init__(address, Handler)
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request_thread(self, request, client_address):
        try:
            request.settimeout(30)
            request.do_handshake()
        except (ssl.SSLError, OSError) as error:
            self.state.append_log({"at": time.time(), "listener": self.listener, "endpoint": "tls-handshake",
                                   "path": None, "status": None, "error": "handshake_failed",
                                   "handshake_error": getattr(error, "reason", None) or type(error).__name__,
                                   "client_certificate": None, "client_auth": None, "client_assertion": None})
            self.shutdown_request(request)
            return
        super().process_request_thread(request, client_address)

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, socket.timeout, TimeoutError)):
            return  # a client going away
        super().handle_error(request, client_address)


def contexts(config):
    main = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    main.minimum_version = ssl.TLSVersion.TLSv1_2
    main.load_cert_chain(config["server_certificate"], config["server_key"])
    mtls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    mtls.minimum_version = ssl.TLSVersion.TLSv1_2
    mtls.load_cert_chain(config["server_certificate"], config["server_key"])
    mtls.verify_mode = ssl.CERT_OPTIONAL
    anchors = 0
    if config.get("client_ca_file"):
        mtls.load_verify_locations(cafile=config["client_ca_file"])
        anchors += 1
    for path in config.get("trusted_self_signed_certificates", []):
        mtls.load_verify_locations(cafile=path)
        anchors += 1
    for client in config["clients"]:
        if client.get("token_endpoint_auth_method") == "self_signed_tls_client_auth":
            for key in (client.get("jwks") or {}).get("keys", []):
                chain = key.get("x5c")
                if isinstance(chain, list) and chain and isinstance(chain[0], str):
                    mtls.load_verify_locations(cadata=base64.b64decode(chain[0]))
                    anchors += 1
    if not anchors:  # a context with no trust anchor refuses every certificate; say why
        sys.stderr.write("modern.py: no client_ca_file nor self-signed certificate: the mtls listener accepts no certificate\n")
    return main, mtls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="main listener; 0 picks a free port")
    parser.add_argument("--mtls-port", type=int, default=0, help="mTLS listener; 0 picks a free port")
    parser.add_argument("--quiet", action="store_true", help="log tracebacks only")
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))

    record = SecretsRecord(os.environ.get("GATEHOUSE_SECRETS_RECORD"))
    state = State(config, record)
    for client in state.clients.values():
        record.add("upstream client secret", client.secret)
    oauth = make_server(state)
    main_context, mtls_context = contexts(config)
    main_server = TLSServer((args.host, args.port), main_context, "main", state, oauth, args.quiet)
    mtls_server = TLSServer((args.host, args.mtls_port), mtls_context, "mtls", state, oauth, args.quiet)
    host = f"[{args.host}]" if ":" in args.host else args.host
    state.issuer = f"https://{host}:{main_server.server_address[1]}"
    state.mtls_url = f"https://{host}:{mtls_server.server_address[1]}"
    threading.Thread(target=mtls_server.serve_forever, daemon=True).start()
    print(json.dumps({"ready": True, "url": state.issuer, "mtls_url": state.mtls_url}), flush=True)
    sys.stdout = sys.stderr  # the ready line is the only stdout output
    try:
        main_server.serve_forever()
    finally:
        main_server.server_close()
        mtls_server.server_close()


if __name__ == "__main__":
    main()
