"""A FranceConnect (Particulier) look-alike ("double"), v2 and v1, for Gatehouse's end-to-end tests and demos.

Built from FranceConnect's published partner documentation (docs.partenaires.franceconnect.gouv.fr:
"Endpoints", "Scopes et claims", "Gestion des erreurs", "Déconnexion", "Évolutions v1 → v2") and
FranceConnect's own public code (france-connect/sources: core-fcp-low configuration;
france-connect/service-provider-example: the v1 flow), not from Gatehouse's code. Where the two
disagree the documentation wins; the choices are listed at the end of this docstring.

    .venv/bin/python sandbox/franceconnect.py --config cfg.json [--port 0] [--host 127.0.0.1] [--quiet]

Once listening it prints exactly one line to stdout and nothing after it:

    {"ready": true, "url": "http://127.0.0.1:PORT", "issuer": "http://127.0.0.1:PORT/api/v2",
     "id_token_iss": "http://127.0.0.1:PORT/api/v2", "version": "v2"}

`issuer` is what a client configures (v2: the OpenID issuer, discovery at
{issuer}/.well-known/openid-configuration; v1: the API base, endpoints {issuer}/authorize …);
`id_token_iss` is the `iss` of its ID tokens (v1: the bare origin, as FranceConnect v1 does).
Access log (method, path without query, status; never a secret) on stderr unless --quiet.
SIGTERM/SIGINT exit with status 0.

Config (JSON; every key but "clients" optional):

    {"version": "v2",                      # "v2" | "v1"
     "alg": "ES256",                       # v2 ID token and userinfo signature: "ES256" | "RS256"; v1: always HS256
     "prefix": "/api/v2",                  # default /api/v2 (v2), /api/v1 (v1)
     "access_token_lifetime": 60,          # seconds (FranceConnect: 60)
     "id_token_lifetime": 60, "code_lifetime": 30,
     "send_iss": true,                     # RFC 9207 `iss` on authorization responses (default: v2 yes, v1 no)
     "min_state_nonce_length": 32,         # v2 32 (documented), v1 1
     "accept_client_secret_basic": false,  # FranceConnect accepts client_secret_post (and private_key_jwt) only
     "clients": [{"client_id": "…", "client_secret_env": "FC_SECRET",   # or "client_secret": "…"
                  "redirect_uris": ["…"], "post_logout_redirect_uris": ["…"],
                  "scopes": ["openid", "given_name", …]}],               # allowed scopes (default: all below)
     "identities": [{…claims…}]}          # default: IDENTITIES below; `sub` is derived per client (pairwise)

Endpoints (P = prefix):

    v2  GET  P/.well-known/openid-configuration   discovery
        GET  P/jwks                                JWKS (an ES256 and an RS256 key; a rotated key once asked)
        GET|POST P/authorize                       validates, then 303 to P/interaction/{uid}; a malformed
                                                   request gets the HTML error page (400, "Y000400"), never a redirect
        GET  P/interaction/{uid}                   the login page: one radio button per identity, "Continuer", "Annuler"
        POST P/interaction/{uid}/login             identity=N → 303 redirect_uri?code&state[&iss]; sets the FC session cookie
        POST P/interaction/{uid}/abort             "Annuler" → 303 redirect_uri?error=access_denied&error_description&state[&iss]
        POST P/token                               authorization_code only; client_secret_post; code single use, 30 s;
                                                   {"access_token","token_type":"Bearer","expires_in":60,"id_token"}: no refresh_token
        GET|POST P/userinfo                        Bearer; 200 application/jwt (signed like the ID token:
                                                   {"sub", pivot claims as scoped, "iss", "aud"})
        GET  P/session/end                         id_token_hint, state, post_logout_redirect_uri all required, the URI registered;
                                                   else the HTML error page (400). Ends the session cookie, 303 to the URI ?state=
        POST P/token/revocation                    RFC 7009 (client_secret_post), 200
    v1  P/authorize, P/interaction/…, P/token, P/userinfo (200 application/json), P/logout (as session/end).
        ID token HS256 keyed with the client secret, `iss` = the origin (no /api/v1), no at_hash.

Control (for negative tests; not FranceConnect's):

    POST /_control  JSON, any of:
        {"id_token": NAME | [NAME, …]}     the next ID token(s) issued, one fault each: wrong_nonce, missing_nonce,
                                           wrong_aud, multiple_aud (no azp), wrong_iss, alg_none, hs256_public_key
                                           (HS256, the HMAC key = the PEM of the public key of the configured alg),
                                           hs256_wrong_secret (v1), expired, iat_future, unknown_kid (a key never
                                           published), rotated_kid (a new key, published from now on, signing this token only), bad_signature,
                                           wrong_acr, bad_at_hash, alg_mismatch (signed with the other published alg)
        {"userinfo": NAME | [NAME, …]}     the next userinfo answer(s): bad_signature, other_sub, unsigned (v2: JSON)
        {"callback": {"iss": URL} | "omit_iss"}   the next authorization response's `iss`
        {"authorize_error": CODE}          the next /authorize redirects at once with error=CODE (invalid_scope,
                                           invalid_request, server_error, temporarily_unavailable, access_denied)
        {"jwks": "unavailable" | "available"}     JWKS answers 503 while unavailable
        {"access_token_lifetime": SECONDS} tokens issued from now on
        {"expire_access_tokens": true}     every access token issued so far is dead from now on
        {"reset_stats": true}
    GET  /_control/stats  JSON counters: jwks_fetches, discovery_fetches, authorize (list: what was asked, with the
         lengths of state and nonce, never their values), token_requests, token_auth_methods, refresh_grants,
         userinfo_requests, userinfo_payloads (the exact JSON payload text of every userinfo answer),
         token_responses (bodies, for passthrough checks: they hold tokens), session_end (list: whether the
         hint was an ID token it issued, its sub and client, the state's length, the URI, the cookie, the outcome),
         last_access_token_alive,
         identities (the claims and sub per client), pending faults.

Secrets record: when GATEHOUSE_SECRETS_RECORD names a file, every secret this double is given or
gives out is appended to it as a JSON line {"kind", "value"}: client secrets, state and nonce of
every authorization request, PKCE verifiers, codes, access tokens, ID tokens (and hints), userinfo
JWTs, session cookies, interaction ids, logout states.

Choices where FranceConnect's sources differ or say nothing:
- state and nonce: the documentation says 32 characters minimum (POST table, callbacks); FranceConnect's
  code checks nonce ≥ 22 only. The double enforces 32 for both (v2).
- /session/end: the documentation marks id_token_hint, state and post_logout_redirect_uri required;
  FranceConnect's code only id_token_hint. The double requires all three. An expired id_token_hint is
  accepted (ID tokens live 60 s; logging out later must work), an unknown or forged one is not.
- `iss` on authorization responses (RFC 9207): not in the documentation's tables; FranceConnect runs
  node oidc-provider 9, which sends it. On by default in v2 (`send_iss`).
- PKCE: accepted and checked when the client sends code_challenge (S256), not required.
"""

import argparse
import base64
import hashlib
import hmac
import html
import json
import os
import secrets
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote_plus, urlencode, urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from cryptography.exceptions import InvalidSignature

try:  # imported from the sandbox package (tests, demos)
    from .secretsrecord import SecretsRecord, stop  # shared with Tests/Upstream/serve.py
    from .doubleprocess import run_double
except ImportError:  # run as a script: python sandbox/franceconnect.py
    from secretsrecord import SecretsRecord, stop
    from doubleprocess import run_double

#: The identity pivot scopes and the optional ones (docs: "Scopes et claims").
PIVOT_SCOPES = ["openid", "given_name", "family_name", "birthdate", "gender", "birthplace", "birthcountry"]
ALL_SCOPES = PIVOT_SCOPES + ["email", "preferred_username"]
CLAIMS = [scope for scope in ALL_SCOPES if scope != "openid"]

#: Made-up people, in FranceConnect's formats: given names separated by spaces, the birth name in
#: capitals, birthdate YYYY-MM-DD (YYYY-01-01 when the month is presumed), gender male|female,
#: birthplace a 5-character INSEE commune code (a letter for Corsica) or "" when born abroad,
#: birthcountry a 5-digit INSEE country code (France 99100).
IDENTITIES = [
    {"given_name": "Angela Claire Louise", "family_name": "DUBOIS", "birthdate": "1962-08-24", "gender": "female",
     "birthplace": "75107", "birthcountry": "99100", "email": "angela.dubois@example.test", "preferred_username": "MARTIN"},
    {"given_name": "Jérôme Éric", "family_name": "LEFÈVRE-ÉTIENNE", "birthdate": "1981-01-01", "gender": "male",
     "birthplace": "", "birthcountry": "99134", "email": "jerome.lefevre@example.test", "preferred_username": ""},
    {"given_name": "Paul-Marie", "family_name": "CASANOVA", "birthdate": "1990-03-01", "gender": "male",
     "birthplace": "2A004", "birthcountry": "99100", "email": "paul.casanova@example.test", "preferred_username": ""},
]

ID_TOKEN_FAULTS = {"wrong_nonce", "missing_nonce", "wrong_aud", "multiple_aud", "wrong_iss", "alg_none",
                   "hs256_public_key", "hs256_wrong_secret", "expired", "iat_future", "unknown_kid", "rotated_kid",
                   "bad_signature", "wrong_acr", "bad_at_hash", "alg_mismatch"}
USERINFO_FAULTS = {"bad_signature", "other_sub", "unsigned"}
CALLBACK_ERRORS = {"invalid_scope", "invalid_request", "server_error", "temporarily_unavailable", "access_denied"}
SESSION_COOKIE = "fc_double_session"  # cookies ignore ports: a name no other server of the suite uses


# --------------------------------------------------------------------------- JOSE (compact JWS)

def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def json_bytes(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


class SigningKey:
    """An ES256 (P-256) or RS256 (RSA 2048) private key with its kid."""

    def __init__(self, alg, kid=None):
        self.alg = alg
        self.kid = kid or f"{alg.lower()}-{secrets.token_hex(8)}"
        if alg == "ES256":
            self.private = ec.generate_private_key(ec.SECP256R1())
        elif alg == "RS256":
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            raise ValueError(alg)
        self.public = self.private.public_key()

    def sign(self, data):
        if self.alg == "ES256":
            r, s = decode_dss_signature(self.private.sign(data, ec.ECDSA(hashes.SHA256())))
            return r.to_bytes(32, "big") + s.to_bytes(32, "big")
        return self.private.sign(data, padding.PKCS1v15(), hashes.SHA256())

    def public_pem(self):
        return self.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def jwk(self):
        numbers = self.public.public_numbers()
        if self.alg == "ES256":
            return {"kty": "EC", "crv": "P-256", "x": b64url(numbers.x.to_bytes(32, "big")),
                    "y": b64url(numbers.y.to_bytes(32, "big")), "kid": self.kid, "use": "sig", "alg": "ES256"}
        n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
        e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
        return {"kty": "RSA", "n": b64url(n), "e": b64url(e), "kid": self.kid, "use": "sig", "alg": "RS256"}


def sign_jws(header, payload_bytes, key=None, hmac_key=None):
    """Compact JWS. `header["alg"]` decides: ES256/RS256 with `key`, HS256 with `hmac_key`, none."""
    signing_input = f"{b64url(json_bytes(header))}.{b64url(payload_bytes)}".encode()
    alg = header["alg"]
    if alg == "none":
        signature = b""
    elif alg == "HS256":
        signature = hmac.new(hmac_key, signing_input, hashlib.sha256).digest()
    else:
        signature = key.sign(signing_input)
    return f"{signing_input.decode()}.{b64url(signature)}"


def decode_jws(token):
    """(header, payload bytes, signing input, signature) of a compact JWS, unverified."""
    head, body, signature = token.split(".")
    return json.loads(b64url_decode(head)), b64url_decode(body), f"{head}.{body}".encode(), b64url_decode(signature)


def verify_jws(token, jwks=None, hmac_key=None, algorithms=("ES256", "RS256")):
    """Verifies a compact JWS against a JWKS (ES256, RS256) or an HMAC key (HS256); returns
    (header, payload dict). Raises ValueError naming what failed. For the tests' own checks."""
    header, payload, signing_input, signature = decode_jws(token)
    alg = header.get("alg")
    if alg not in algorithms:
        raise ValueError(f"alg {alg!r} not in {algorithms}")
    if alg == "HS256":
        if not hmac.compare_digest(hmac.new(hmac_key, signing_input, hashlib.sha256).digest(), signature):
            raise ValueError("signature")
        return header, json.loads(payload)
    candidates = [k for k in (jwks or {}).get("keys", []) if k.get("kid") == header.get("kid")]
    if not candidates:
        raise ValueError(f"kid {header.get('kid')!r} not in the JWKS")
    key = candidates[0]
    try:
        if alg == "ES256":
            if key["kty"] != "EC" or len(signature) != 64:
                raise ValueError("signature")
            public = ec.EllipticCurvePublicNumbers(int.from_bytes(b64url_decode(key["x"]), "big"),
                                                   int.from_bytes(b64url_decode(key["y"]), "big"),
                                                   ec.SECP256R1()).public_key()
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            public.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
        else:
            if key["kty"] != "RSA":
                raise ValueError("signature")
            public = rsa.RSAPublicNumbers(int.from_bytes(b64url_decode(key["e"]), "big"),
                                          int.from_bytes(b64url_decode(key["n"]), "big")).public_key()
            public.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise ValueError("signature") from None
    return header, json.loads(payload)


def half_hash(value):
    """at_hash (OpenID Connect Core 3.1.3.6) for SHA-256 algorithms."""
    return b64url(hashlib.sha256(value.encode()).digest()[:16])


# --------------------------------------------------------------------------- the provider

class Problem(Exception):
    """A request FranceConnect answers with its HTML error page."""

    def __init__(self, message, status=400, code="Y000400"):
        super().__init__(message)
        self.status, self.code = status, code


class FranceConnect:
    def __init__(self, config, record, origin):
        self.config = config
        self.version = config.get("version", "v2")
        assert self.version in ("v1", "v2"), self.version
        self.record = record
        self.origin = origin
        self.prefix = config.get("prefix", "/api/v2" if self.version == "v2" else "/api/v1")
        self.issuer = origin + self.prefix
        self.id_token_iss = self.issuer if self.version == "v2" else origin
        self.alg = "HS256" if self.version == "v1" else config.get("alg", "ES256")
        assert self.alg in ("ES256", "RS256", "HS256"), self.alg
        self.access_token_lifetime = int(config.get("access_token_lifetime", 60))
        self.id_token_lifetime = int(config.get("id_token_lifetime", 60))
        self.code_lifetime = int(config.get("code_lifetime", 30))
        self.send_iss = bool(config.get("send_iss", self.version == "v2"))
        self.min_length = int(config.get("min_state_nonce_length", 32 if self.version == "v2" else 1))
        self.accept_basic = bool(config.get("accept_client_secret_basic", False))
        self.identities = config.get("identities", IDENTITIES)
        self.clients = {}
        for client in config["clients"]:
            secret = client.get("client_secret") or os.environ[client["client_secret_env"]]
            record.add("upstream client secret", secret)
            self.clients[client["client_id"]] = {
                "client_id": client["client_id"], "secret": secret,
                "redirect_uris": list(client.get("redirect_uris", [])),
                "post_logout_redirect_uris": list(client.get("post_logout_redirect_uris", [])),
                "scopes": list(client.get("scopes", ALL_SCOPES)),
                "name": client.get("name", client["client_id"])}
        self.keys = {"ES256": SigningKey("ES256"), "RS256": SigningKey("RS256")}
        self.published = [self.keys["ES256"], self.keys["RS256"]]
        self.lock = threading.RLock()
        self.interactions, self.codes, self.access_tokens, self.sessions = {}, {}, {}, {}
        self.issued_id_tokens = {}  # id token -> {"client_id", "sub", "session"}
        self.faults = {"id_token": [], "userinfo": [], "callback": [], "authorize_error": []}
        self.jwks_available = True
        self.last_access_token = None
        self.reset_stats()

    # ----- helpers

    def reset_stats(self):
        self.stats = {"jwks_fetches": 0, "discovery_fetches": 0, "authorize": [], "token_requests": 0,
                      "token_auth_methods": [], "token_errors": [], "refresh_grants": 0, "userinfo_requests": 0,
                      "userinfo_payloads": [], "token_responses": [], "session_end": [], "logins": 0, "cancels": 0}

    def sub_for(self, client_id, index):
        """Pairwise subject: 64 hex characters and "v1", as FranceConnect's."""
        return hashlib.sha256(f"{client_id}|{index}|{self.origin}".encode()).hexdigest() + "v1"

    def public_stats(self):
        with self.lock:
            now = time.time()
            token = self.access_tokens.get(self.last_access_token) if self.last_access_token else None
            return {**json.loads(json.dumps(self.stats)),
                    "last_access_token_alive": bool(token and token["expires_at"] > now and not token["revoked"]),
                    "pending": {k: list(v) for k, v in self.faults.items()},
                    "jwks_available": self.jwks_available,
                    "issuer": self.issuer, "id_token_iss": self.id_token_iss, "alg": self.alg,
                    "identities": {client_id: [{**identity, "sub": self.sub_for(client_id, i)}
                                               for i, identity in enumerate(self.identities)]
                                   for client_id in self.clients}}

    def control(self, command):
        with self.lock:
            for name in ("id_token", "userinfo"):
                if name in command:
                    values = command[name] if isinstance(command[name], list) else [command[name]]
                    allowed = ID_TOKEN_FAULTS if name == "id_token" else USERINFO_FAULTS
                    unknown = [v for v in values if v not in allowed]
                    if unknown:
                        raise Problem(f"unknown {name} fault {unknown}")
                    self.faults[name] += values
            if "callback" in command:
                self.faults["callback"].append(command["callback"])
            if "authorize_error" in command:
                if command["authorize_error"] not in CALLBACK_ERRORS:
                    raise Problem(f"unknown error {command['authorize_error']}")
                self.faults["authorize_error"].append(command["authorize_error"])
            if "jwks" in command:
                self.jwks_available = command["jwks"] != "unavailable"
            if "access_token_lifetime" in command:
                self.access_token_lifetime = int(command["access_token_lifetime"])
            if command.get("expire_access_tokens"):
                for token in self.access_tokens.values():
                    token["expires_at"] = min(token["expires_at"], time.time() - 1)
            if command.get("reset_stats"):
                self.reset_stats()
            if command.get("clear_faults"):
                self.faults = {k: [] for k in self.faults}
                self.jwks_available = True

    def take_fault(self, name):
        with self.lock:
            return self.faults[name].pop(0) if self.faults[name] else None

    def endpoint(self, name):
        return f"{self.issuer}/{name}"

    # ----- discovery, JWKS

    def discovery(self):
        with self.lock:
            self.stats["discovery_fetches"] += 1
        document = {
            "issuer": self.issuer,
            "authorization_endpoint": self.endpoint("authorize"),
            "token_endpoint": self.endpoint("token"),
            "userinfo_endpoint": self.endpoint("userinfo"),
            "jwks_uri": self.endpoint("jwks"),
            "end_session_endpoint": self.endpoint("session/end"),
            "revocation_endpoint": self.endpoint("token/revocation"),
            "scopes_supported": ALL_SCOPES,
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "nonce", "acr", "amr", "auth_time", "at_hash", *CLAIMS],
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code"],
            "subject_types_supported": ["pairwise"],
            "acr_values_supported": ["eidas1"],
            "id_token_signing_alg_values_supported": ["ES256", "RS256"],
            "userinfo_signing_alg_values_supported": ["ES256", "RS256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt"],
            "revocation_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt"],
            "code_challenge_methods_supported": ["S256"],
            "claims_parameter_supported": True,
            "request_parameter_supported": False,
            "prompt_values_supported": ["login", "consent"],
            "authorization_response_iss_parameter_supported": self.send_iss,
        }
        return document

    def jwks(self):
        with self.lock:
            self.stats["jwks_fetches"] += 1
            if not self.jwks_available:
                return None
            return {"keys": [key.jwk() for key in self.published]}

    # ----- authorization

    def authorize(self, params):
        """Validates an authorization request (FranceConnect's checks, in its order); returns
        ("page", uid) to show the login page or ("redirect", url) for an immediate error."""
        single = {k: v[0] for k, v in params.items()}
        self.record.add("Gatehouse state toward the upstream", single.get("state"))
        self.record.add("OpenID nonce", single.get("nonce"))
        asked = {"client_id": single.get("client_id"), "redirect_uri": single.get("redirect_uri"),
                 "response_type": single.get("response_type"), "scope": single.get("scope"),
                 "acr_values": single.get("acr_values"), "prompt": single.get("prompt"),
                 "claims": single.get("claims"), "state_length": len(single.get("state", "")),
                 "nonce_length": len(single.get("nonce", "")),
                 "code_challenge_method": single.get("code_challenge_method"),
                 "has_code_challenge": "code_challenge" in single, "outcome": None}
        with self.lock:
            self.stats["authorize"].append(asked)
        try:
            duplicated = [k for k, v in params.items() if len(v) > 1]
            if duplicated:
                raise Problem(f"parameters given more than once: {duplicated}")
            client = self.clients.get(single.get("client_id", ""))
            if client is None:
                raise Problem("client_id is unknown", code="Y030106")
            redirect_uri = single.get("redirect_uri", "")
            if redirect_uri not in client["redirect_uris"]:
                raise Problem("redirect_uri is not registered for this client", code="Y030118")
            if single.get("response_type") != "code":
                raise Problem("response_type must be code")
            scopes = single.get("scope", "").split()
            if "openid" not in scopes:
                raise Problem("scope must contain openid")
            acr_values = single.get("acr_values")
            if acr_values is None and self.version == "v2":
                raise Problem("acr_values is required")
            if acr_values is not None:
                requested = acr_values.split()
                allowed = {"eidas1"} if self.version == "v2" else {"eidas1", "eidas2", "eidas3"}
                if not requested or not set(requested) <= allowed:
                    raise Problem(f"acr_values must be eidas1 (got {acr_values[:32]!r})")
            state, nonce = single.get("state", ""), single.get("nonce", "")
            if len(state) < self.min_length:
                raise Problem(f"state must be at least {self.min_length} characters")
            if len(nonce) < self.min_length:
                raise Problem(f"nonce must be at least {self.min_length} characters")
            prompt = single.get("prompt")
            if prompt is not None and not set(prompt.split()) <= {"login", "consent"}:
                raise Problem("prompt must be login and/or consent")
            if "code_challenge" in single and single.get("code_challenge_method") != "S256":
                raise Problem("code_challenge_method must be S256")
            claims_request = {}
            if "claims" in single:
                try:
                    claims_request = json.loads(single["claims"])
                    assert isinstance(claims_request, dict)
                except (ValueError, AssertionError):
                    raise Problem("claims is not a JSON object") from None
        except Problem as problem:
            asked["outcome"] = f"error page: {problem}"
            raise
        error = self.take_fault("authorize_error")
        if error is None:
            unknown = [s for s in scopes if s not in client["scopes"]]
            if unknown:
                error = "invalid_scope"
        if error is not None:
            asked["outcome"] = f"redirect {error}"
            return "redirect", self.callback_url(redirect_uri, {"error": error, "error_description": {
                "invalid_scope": "Scopes not allowed for this service provider",
                "access_denied": "User auth aborted"}.get(error, error.replace("_", " ")), "state": state})
        uid = secrets.token_urlsafe(24)
        self.record.add("FranceConnect interaction id", uid)
        with self.lock:
            self.interactions[uid] = {"client": client, "redirect_uri": redirect_uri, "state": state, "nonce": nonce,
                                      "scopes": scopes, "acr": "eidas1", "claims": claims_request,
                                      "code_challenge": single.get("code_challenge"), "created": time.time()}
        asked["outcome"] = "login page"
        return "page", uid

    def callback_url(self, redirect_uri, parameters):
        fault = self.take_fault("callback")
        if fault == "omit_iss":
            pass
        elif isinstance(fault, dict) and "iss" in fault:
            parameters["iss"] = fault["iss"]
        elif self.send_iss:
            parameters["iss"] = self.issuer
        separator = "&" if "?" in redirect_uri else "?"
        return redirect_uri + separator + urlencode(parameters)

    def interaction(self, uid):
        with self.lock:
            found = self.interactions.get(uid)
        if found is None:
            raise Problem("this sign-in is unknown or over", code="Y000004")
        return found

    def login_page(self, uid):
        interaction = self.interaction(uid)
        choices = "\n".join(
            f'<li><label><input type="radio" name="identity" value="{i}" id="identity-{i}"{" checked" if i == 0 else ""}>'
            f' {html.escape(p["given_name"])} {html.escape(p["family_name"])}</label></li>'
            for i, p in enumerate(self.identities))
        base = f"{self.prefix}/interaction/{uid}"
        return f"""<!doctype html>
<html lang="fr"><head><meta charset="utf-8"><title>FranceConnect (double de test)</title></head>
<body>
<h1>Je choisis un compte pour me connecter sur {html.escape(interaction["client"]["name"])}</h1>
<form method="post" action="{base}/login" id="login-form">
<fieldset><legend>Identité</legend><ul>
{choices}
</ul></fieldset>
<button type="submit" id="continue">Continuer</button>
</form>
<form method="post" action="{base}/abort" id="cancel-form">
<button type="submit" id="cancel">Annuler</button>
</form>
</body></html>
"""

    def login(self, uid, form, cookie):
        interaction = self.interaction(uid)
        try:
            index = int(form.get("identity", ["0"])[0])
            self.identities[index]
        except (ValueError, IndexError):
            raise Problem("no such identity") from None
        client = interaction["client"]
        code = secrets.token_urlsafe(32)
        self.record.add("upstream authorization code", code)
        with self.lock:
            del self.interactions[uid]
            session = cookie if cookie in self.sessions else None
            if session is None:
                session = secrets.token_urlsafe(32)
                self.record.add("FranceConnect session cookie", session)
                self.sessions[session] = {"created": time.time()}
            self.sessions[session]["sub"] = self.sub_for(client["client_id"], index)
            self.codes[code] = {**interaction, "identity": index, "expires_at": time.time() + self.code_lifetime,
                                "used": False, "session": session, "auth_time": int(time.time()), "tokens": []}
            self.stats["logins"] += 1
        return session, self.callback_url(interaction["redirect_uri"], {"code": code, "state": interaction["state"]})

    def abort(self, uid):
        interaction = self.interaction(uid)
        with self.lock:
            self.interactions.pop(uid, None)
            self.stats["cancels"] += 1
        return self.callback_url(interaction["redirect_uri"], {
            "error": "access_denied", "error_description": "User auth aborted", "state": interaction["state"]})

    # ----- token

    def client_authentication(self, form, authorization):
        """(client, method) or an OAuth error (status, body)."""
        if authorization.lower().startswith("basic "):
            try:
                decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
                client_id, secret = (unquote_plus(part) for part in decoded.split(":", 1))
            except (ValueError, UnicodeDecodeError):
                return None, (401, {"error": "invalid_client", "error_description": "malformed Basic credentials"})
            self.record.add("upstream client secret", secret)
            if "client_secret" in form:
                return None, (400, {"error": "invalid_request", "error_description": "several client authentications"})
            if not self.accept_basic:
                return None, (401, {"error": "invalid_client", "error_description":
                                    "client_secret_basic is not supported: use client_secret_post"})
            method = "client_secret_basic"
        else:
            client_id, secret = form.get("client_id", [""])[0], form.get("client_secret", [""])[0]
            self.record.add("upstream client secret", secret)
            method = "client_secret_post"
        client = self.clients.get(client_id)
        if client is None or not hmac.compare_digest(client["secret"].encode(), secret.encode()):
            return None, (401, {"error": "invalid_client", "error_description": "client authentication failed"})
        return client, method

    def token(self, form, authorization):
        for name in ("code", "code_verifier", "refresh_token", "client_secret"):
            self.record.add({"code": "upstream authorization code", "code_verifier": "Gatehouse PKCE verifier",
                             "refresh_token": "refresh token presented to the upstream",
                             "client_secret": "upstream client secret"}[name], *form.get(name, []))
        with self.lock:
            self.stats["token_requests"] += 1
            if form.get("grant_type") == ["refresh_token"]:
                self.stats["refresh_grants"] += 1
        client, method = self.client_authentication(form, authorization)
        if client is None:
            return self.token_error(*method)
        with self.lock:
            self.stats["token_auth_methods"].append(method)
        grant_type = form.get("grant_type", [""])[0]
        if grant_type != "authorization_code":
            return self.token_error(400, {"error": "unsupported_grant_type",
                                          "error_description": "only authorization_code is supported"})
        code = form.get("code", [""])[0]
        with self.lock:
            grant = self.codes.get(code)
            if grant is None or grant["client"]["client_id"] != client["client_id"]:
                return self.token_error(400, {"error": "invalid_grant", "error_description": "grant request is invalid"})
            if grant["used"]:
                for token in grant["tokens"]:  # a replayed code revokes what it gave (RFC 6749 4.1.2)
                    self.access_tokens[token]["revoked"] = True
                return self.token_error(400, {"error": "invalid_grant", "error_description": "grant request is invalid"})
            grant["used"] = True
        if grant["expires_at"] < time.time():
            return self.token_error(400, {"error": "invalid_grant", "error_description": "grant request is expired"})
        if form.get("redirect_uri", [""])[0] != grant["redirect_uri"]:
            return self.token_error(400, {"error": "invalid_grant", "error_description": "redirect_uri mismatch"})
        if grant["code_challenge"]:
            verifier = form.get("code_verifier", [""])[0]
            if b64url(hashlib.sha256(verifier.encode()).digest()) != grant["code_challenge"]:
                return self.token_error(400, {"error": "invalid_grant", "error_description": "PKCE verification failed"})
        access_token = secrets.token_urlsafe(32)
        sub = self.sub_for(client["client_id"], grant["identity"])
        with self.lock:
            lifetime = self.access_token_lifetime
            self.access_tokens[access_token] = {"client": client, "identity": grant["identity"], "sub": sub,
                                                "scopes": grant["scopes"], "expires_at": time.time() + lifetime,
                                                "revoked": False}
            grant["tokens"].append(access_token)
            self.last_access_token = access_token
        id_token = self.id_token(client, grant, sub, access_token)
        with self.lock:
            self.issued_id_tokens[id_token] = {"client_id": client["client_id"], "sub": sub, "session": grant["session"]}
        self.record.add("upstream access token", access_token)
        self.record.add("upstream ID token", id_token)
        body = json_bytes({"access_token": access_token, "token_type": "Bearer", "expires_in": lifetime,
                           "id_token": id_token})
        with self.lock:
            self.stats["token_responses"].append(body.decode())
        return 200, "application/json; charset=utf-8", body

    def token_error(self, status, body):
        with self.lock:
            self.stats["token_errors"].append(body["error"])
        return status, "application/json; charset=utf-8", json_bytes(body)

    def id_token(self, client, grant, sub, access_token):
        fault = self.take_fault("id_token")
        now = int(time.time())
        claims = {"iss": self.id_token_iss, "sub": sub, "aud": client["client_id"], "exp": now + self.id_token_lifetime,
                  "iat": now, "nonce": grant["nonce"], "acr": grant["acr"]}
        if self.version == "v2":
            claims["auth_time"] = grant["auth_time"]
            claims["at_hash"] = half_hash(access_token)
        else:
            claims["idp"] = "FC"
        if "amr" in (grant["claims"].get("id_token") or {}):
            claims["amr"] = ["pwd"]
        if self.version == "v1":
            header = {"typ": "JWT", "alg": "HS256"}
            key, hmac_key = None, client["secret"].encode()
        else:
            key = self.keys[self.alg]
            header = {"alg": self.alg, "typ": "JWT", "kid": key.kid}
            hmac_key = None
        if fault == "wrong_nonce":
            claims["nonce"] = secrets.token_urlsafe(32)
        elif fault == "missing_nonce":
            del claims["nonce"]
        elif fault == "wrong_aud":
            claims["aud"] = "another-service-provider-" + secrets.token_hex(8)
        elif fault == "multiple_aud":
            claims["aud"] = [client["client_id"], "another-service-provider"]
        elif fault == "wrong_iss":
            claims["iss"] = "https://fcp.example.invalid/api/v2"
        elif fault == "expired":
            claims["iat"], claims["exp"] = now - 3600, now - 3600 + self.id_token_lifetime
            claims["auth_time"] = claims["iat"] if "auth_time" in claims else None
            claims = {k: v for k, v in claims.items() if v is not None}
        elif fault == "iat_future":
            claims["iat"], claims["exp"] = now + 3600, now + 3600 + self.id_token_lifetime
        elif fault == "wrong_acr":
            claims["acr"] = "eidas2"
        elif fault == "bad_at_hash":
            claims["at_hash"] = half_hash(secrets.token_urlsafe(32))
        payload = json_bytes(claims)
        if fault == "alg_none":
            return sign_jws({"alg": "none", "typ": "JWT"}, payload)
        if fault == "hs256_public_key":
            public = self.keys[self.alg if self.alg != "HS256" else "RS256"]
            return sign_jws({"alg": "HS256", "typ": "JWT", "kid": public.kid}, payload, hmac_key=public.public_pem())
        if fault == "hs256_wrong_secret":
            return sign_jws({"typ": "JWT", "alg": "HS256"}, payload, hmac_key=secrets.token_bytes(32))
        if fault == "unknown_kid":
            stray = SigningKey(self.alg if self.alg != "HS256" else "ES256")
            return sign_jws({**header, "alg": stray.alg, "kid": stray.kid}, payload, key=stray)
        if fault == "rotated_kid":  # this token only; the usual key signs the next ones (tests stay independent)
            fresh = SigningKey(self.alg if self.alg != "HS256" else "ES256")
            with self.lock:
                self.published.append(fresh)
            return sign_jws({**header, "alg": fresh.alg, "kid": fresh.kid}, payload, key=fresh)
        if fault == "alg_mismatch":
            other = self.keys["RS256" if self.alg == "ES256" else "ES256"]
            return sign_jws({**header, "alg": other.alg, "kid": other.kid}, payload, key=other)
        token = sign_jws(header, payload, key=key, hmac_key=hmac_key)
        if fault == "bad_signature":
            head, body, signature = token.split(".")
            raw = bytearray(b64url_decode(signature))
            raw[len(raw) // 2] ^= 0x5A
            token = f"{head}.{body}.{b64url(bytes(raw))}"
        return token

    # ----- userinfo

    def userinfo(self, authorization):
        with self.lock:
            self.stats["userinfo_requests"] += 1
        if not authorization.startswith("Bearer "):
            return 401, {"WWW-Authenticate": 'Bearer realm="FranceConnect"'}, "application/json", \
                json_bytes({"error": "invalid_request", "error_description": "no access token"})
        presented = authorization[7:].strip()
        self.record.add("upstream access token", presented)
        with self.lock:
            token = self.access_tokens.get(presented)
            alive = token is not None and not token["revoked"] and token["expires_at"] > time.time()
        if not alive:
            return 401, {"WWW-Authenticate": 'Bearer realm="FranceConnect", error="invalid_token"'}, \
                "application/json", json_bytes({"error": "invalid_token", "error_description": "invalid token provided"})
        fault = self.take_fault("userinfo")
        identity = self.identities[token["identity"]]
        claims = {"sub": token["sub"]}
        for scope in token["scopes"]:
            if scope in identity:
                claims[scope] = identity[scope]
        if fault == "other_sub":
            claims["sub"] = self.sub_for(token["client"]["client_id"], token["identity"] + 1000)
        if self.version == "v1" or fault == "unsigned":
            body = json_bytes(claims)
            with self.lock:
                self.stats["userinfo_payloads"].append(body.decode())
            return 200, {}, "application/json; charset=utf-8", body
        claims["iss"] = self.issuer
        claims["aud"] = token["client"]["client_id"]
        payload = json_bytes(claims)
        key = self.keys[self.alg]
        jwt = sign_jws({"alg": self.alg, "typ": "JWT", "kid": key.kid}, payload, key=key)
        if fault == "bad_signature":
            head, body, signature = jwt.split(".")
            raw = bytearray(b64url_decode(signature))
            raw[len(raw) // 2] ^= 0x5A
            jwt = f"{head}.{body}.{b64url(bytes(raw))}"
        self.record.add("upstream userinfo JWT", jwt)
        with self.lock:
            self.stats["userinfo_payloads"].append(payload.decode())
        return 200, {}, "application/jwt; charset=utf-8", jwt.encode()

    def revoke(self, form, authorization):
        client, method = self.client_authentication(form, authorization)
        if client is None:
            return self.token_error(*method)
        token = form.get("token", [""])[0]
        self.record.add("upstream access token", token)
        with self.lock:
            found = self.access_tokens.get(token)
            if found is not None and found["client"]["client_id"] == client["client_id"]:
                found["revoked"] = True
        return 200, "application/json; charset=utf-8", b"{}"

    # ----- logout

    def end_session(self, params, cookie):
        single = {k: v[0] for k, v in params.items()}
        hint, state, uri = single.get("id_token_hint"), single.get("state"), single.get("post_logout_redirect_uri")
        self.record.add("upstream ID token", hint)
        self.record.add("Gatehouse logout state toward the upstream", state)
        with self.lock:
            issued = self.issued_id_tokens.get(hint) if hint else None
        entry = {"id_token_hint_issued": issued is not None,  # the hint and the state themselves stay out of stats
                 "sub": issued["sub"] if issued else None, "client_id": issued["client_id"] if issued else None,
                 "state_length": len(state or ""), "post_logout_redirect_uri": uri,
                 "had_session_cookie": bool(cookie and cookie in self.sessions), "outcome": None}
        with self.lock:
            self.stats["session_end"].append(entry)
        try:
            if not hint:
                raise Problem("id_token_hint is required")
            if issued is None:
                raise Problem("id_token_hint is not an ID token FranceConnect issued")
            if not state:
                raise Problem("state is required")
            if not uri:
                raise Problem("post_logout_redirect_uri is required")
            if uri not in self.clients[issued["client_id"]]["post_logout_redirect_uris"]:
                raise Problem("post_logout_redirect_uri is not registered for this client")
        except Problem as problem:
            entry["outcome"] = f"error page: {problem}"
            raise
        with self.lock:
            if cookie:
                self.sessions.pop(cookie, None)
            self.sessions.pop(issued["session"], None)
        entry["outcome"] = "redirect"
        separator = "&" if "?" in uri else "?"
        return uri + separator + urlencode({"state": state})


# --------------------------------------------------------------------------- HTTP

ERROR_PAGE = """<!doctype html>
<html lang="fr"><head><meta charset="utf-8"><title>Erreur - FranceConnect (double de test)</title></head>
<body><h1>Une erreur est survenue</h1><p>Code erreur : <strong>{code}</strong></p><p>{message}</p></body></html>
"""


def make_handler(fc, quiet):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "FranceConnectDouble/1"

        def log_message(self, *args):
            pass

        def log_line(self, status):
            if not quiet:
                path = urlsplit(self.path).path
                if "/interaction/" in path:  # the interaction id is in the path: never logged
                    head, _, tail = path.partition("/interaction/")
                    path = head + "/interaction/…" + ("/" + tail.split("/", 1)[1] if "/" in tail else "")
                sys.stderr.write(f"{self.command} {path} {status}\n")
                sys.stderr.flush()

        def send(self, status, content_type, body, headers=None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                if isinstance(value, list):
                    for v in value:
                        self.send_header(name, v)
                else:
                    self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.log_line(status)

        def redirect(self, location, headers=None, status=303):
            self.send(status, "text/plain; charset=utf-8", b"", {"Location": location, **(headers or {})})

        def error_page(self, problem):
            body = ERROR_PAGE.format(code=html.escape(problem.code), message=html.escape(str(problem))).encode()
            self.send(problem.status, "text/html; charset=utf-8", body)

        def send_json(self, status, value, headers=None):
            self.send(status, "application/json; charset=utf-8", json_bytes(value), headers)

        def cookie(self):
            for header in self.headers.get_all("Cookie", []):
                for part in header.split(";"):
                    name, _, value = part.strip().partition("=")
                    if name == SESSION_COOKIE:
                        return value
            return None

        def read_form(self):
            length = int(self.headers.get("Content-Length", 0) or 0)
            body = self.rfile.read(length) if length else b""
            return body, parse_qs(body.decode(errors="replace"), keep_blank_values=True)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            self.route("GET", parse_qs(urlsplit(self.path).query, keep_blank_values=True), None)

        def do_POST(self):
            body, form = self.read_form()
            self.route("POST", form, body)

        def route(self, method, params, body):
            path = urlsplit(self.path).path
            try:
                self.dispatch(method, path, params, body)
            except Problem as problem:
                self.error_page(problem)
            except Exception as error:  # a bug of the double: say so loudly, never a secret
                sys.stderr.write(f"franceconnect double: {type(error).__name__} on {method} {path}\n")
                import traceback
                traceback.print_exc()
                self.send(500, "text/plain; charset=utf-8", b"internal error of the double")

        def dispatch(self, method, path, params, body):
            if path == "/_control" and method == "POST":
                try:
                    command = json.loads(body or b"{}")
                except ValueError:
                    raise Problem("control body is not JSON") from None
                fc.control(command)
                return self.send_json(200, {"ok": True})
            if path == "/_control/stats":
                return self.send_json(200, fc.public_stats())
            if not path.startswith(fc.prefix + "/"):
                raise Problem("not found", status=404, code="Y000404")
            rest = path[len(fc.prefix):]
            v2 = fc.version == "v2"
            if v2 and rest == "/.well-known/openid-configuration" and method == "GET":
                return self.send_json(200, fc.discovery())
            if v2 and rest == "/jwks" and method == "GET":
                keys = fc.jwks()
                if keys is None:
                    return self.send_json(503, {"error": "temporarily_unavailable"})
                return self.send_json(200, keys)
            if rest == "/authorize" and method in ("GET", "POST"):
                kind, value = fc.authorize(params)
                if kind == "page":
                    return self.redirect(f"{fc.prefix}/interaction/{value}")
                return self.redirect(value)
            if rest.startswith("/interaction/"):
                parts = rest.split("/")  # "", "interaction", uid[, action]
                uid = parts[2] if len(parts) > 2 else ""
                action = parts[3] if len(parts) > 3 else None
                if action is None and method == "GET":
                    return self.send(200, "text/html; charset=utf-8", fc.login_page(uid).encode())
                if action == "login" and method == "POST":
                    session, location = fc.login(uid, params, self.cookie())
                    return self.redirect(location, {"Set-Cookie": f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Lax"})
                if action == "abort" and method in ("GET", "POST"):
                    return self.redirect(fc.abort(uid))
            if rest == "/token" and method == "POST":
                status, content_type, payload = fc.token(params, self.headers.get("Authorization", ""))
                return self.send(status, content_type, payload, {"Pragma": "no-cache"})
            if rest == "/token/revocation" and method == "POST":
                status, content_type, payload = fc.revoke(params, self.headers.get("Authorization", ""))
                return self.send(status, content_type, payload)
            if rest == "/userinfo" and method in ("GET", "POST"):
                status, headers, content_type, payload = fc.userinfo(self.headers.get("Authorization", ""))
                return self.send(status, content_type, payload, headers)
            if rest == ("/session/end" if v2 else "/logout") and method == "GET":
                cookie = self.cookie()
                location = fc.end_session(params, cookie)
                return self.redirect(location, {"Set-Cookie": f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax"})
            raise Problem("not found", status=404, code="Y000404")

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


# --------------------------------------------------------------------------- for the tests

class Double:
    """A running double seen from a test: `url`, `issuer`, `id_token_iss`, `control(**command)`,
    `stats()`, `fault(...)` shorthands. Start one with `start(workdir, name, config, env)`."""

    def __init__(self, ready, process, log_path):
        self.url, self.issuer, self.id_token_iss, self.version = ready["url"], ready["issuer"], ready["id_token_iss"], ready["version"]
        self.process, self.log_path = process, log_path

    def control(self, **command):
        import urllib.request
        request = urllib.request.Request(self.url + "/_control", data=json.dumps(command).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        return self

    def stats(self):
        import urllib.request
        with urllib.request.urlopen(self.url + "/_control/stats", timeout=10) as response:
            return json.loads(response.read())

    def identity(self, client_id, index=0):
        """The claims (and pairwise `sub`) identity `index` has toward `client_id`."""
        return self.stats()["identities"][client_id][index]


class Browser:
    """A person at a browser, simulated with requests: follows redirects; on the double's login
    page picks identity `identity` and presses "Continuer" (or "Annuler" when `cancel`). Keeps
    cookies (the FranceConnect session cookie among them) across calls. `visited` lists the
    paths it went through (no query: no secret)."""

    def __init__(self, identity=0, cancel=False):
        import requests
        self.session = requests.Session()
        self.identity, self.cancel = identity, cancel
        self.visited = []
        self.login_pages = 0

    def follow(self, url, stop_prefix):
        """The first URL starting with `stop_prefix` reached (a string), or the first answer that
        is neither a redirect nor the login page (a requests.Response)."""
        import re
        from urllib.parse import urljoin
        for _ in range(20):
            response = self.session.get(url, allow_redirects=False, timeout=30)
            self.visited.append(f"GET {urlsplit(url).netloc}{urlsplit(url).path} {response.status_code}")
            if response.status_code in (301, 302, 303, 307):
                url = urljoin(url, response.headers["Location"])
                if url.startswith(stop_prefix):
                    return url
                continue
            if response.status_code == 200 and 'id="login-form"' in response.text:
                self.login_pages += 1
                action = re.search(r'<form method="post" action="([^"]+)" id="%s"' %
                                   ("cancel-form" if self.cancel else "login-form"), response.text).group(1)
                target = urljoin(url, html.unescape(action))
                answer = self.session.post(target, data={} if self.cancel else {"identity": str(self.identity)},
                                           allow_redirects=False, timeout=30)
                self.visited.append(f"POST {urlsplit(target).netloc}{urlsplit(target).path} {answer.status_code}")
                if answer.status_code not in (302, 303):
                    return answer
                url = urljoin(target, answer.headers["Location"])
                if url.startswith(stop_prefix):
                    return url
                continue
            return response
        raise AssertionError(f"too many redirects: {self.visited}")

    def cookie(self):
        return self.session.cookies.get(SESSION_COOKIE)


def gatehouse_upstream(name, double, client_id, secret_env, extra=""):
    """The `upstreams:` entry of a Gatehouse configuration in front of this double (YAML, indented as a list item)."""
    return f"""
  - name: {name}
    kind: franceconnect
    version: {double.version}
    issuer: {double.issuer}
    client_id: {client_id}
    client_secret_env: {secret_env}
    timeout: 5s{extra}"""


def start(workdir, name, config, env=None, python=None):
    """Context manager: runs this file as a process with `config` (dict), its log in WORKDIR/NAME.log;
    yields a Double. The environment must hold the clients' secrets (client_secret_env)."""
    return run_double(__file__, workdir, name, config, "FranceConnect double", Double, env=env, python=python,
                      arguments=("--port", "0"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--quiet", action="store_true")
    arguments = parser.parse_args()
    config = json.loads(open(arguments.config).read())
    record = SecretsRecord(os.environ.get("GATEHOUSE_SECRETS_RECORD"))
    server = Server((arguments.host, arguments.port), lambda *a: None)
    origin = f"http://{arguments.host}:{server.server_address[1]}"
    fc = FranceConnect(config, record, origin)
    server.RequestHandlerClass = make_handler(fc, arguments.quiet)

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"ready": True, "url": origin, "issuer": fc.issuer, "id_token_iss": fc.id_token_iss,
                      "version": fc.version}), flush=True)
    sys.stdout = sys.stderr  # the ready line is the only stdout output
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
