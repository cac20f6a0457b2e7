"""The modern upstream's authorization server (sandbox/modern/serve.py): client authentication
by certificate (RFC 8705) and by private_key_jwt (RFC 7523, with the checks authlib leaves out),
PKCE, OpenID Connect, and authlib's AuthorizationServer with its grants and RFC 7009 revocation."""

import base64
import json
import secrets
import threading
import time

from authlib.oauth2.rfc6749 import AuthorizationServer, grants
from authlib.oauth2.rfc6749.errors import InvalidClientError, InvalidRequestError
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7523 import JWTBearerClientAssertion
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import OpenIDCode
from cryptography import x509
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from .model import (ASSERTION_TYPE, AUTH_METHODS, CERTIFICATE_METHODS, AuthorizationCode, Token, TokenRef,
                    certificate_thumbprint, now)


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
