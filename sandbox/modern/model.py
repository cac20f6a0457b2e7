"""The modern upstream's model (sandbox/modern/serve.py): its constants, the client, the code
and token records, the request as it arrived on the wire, and the State holding them all."""

import base64
import hashlib
import os
import secrets
import sys
import threading
import time
from pathlib import Path

import requests
from authlib.oauth2.rfc6749 import ClientMixin, OAuth2Request, TokenMixin
from authlib.oauth2.rfc6749.errors import InvalidClientError
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc.jwk import RSAKey

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


# --- the state of the server ---------------------------------------------------------------------


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
