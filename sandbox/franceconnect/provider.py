"""The FranceConnect look-alike's state: its configuration and clients, the signing keys it
publishes, what is in flight (interactions, codes, tokens, sessions), the faults queued by
/_control, the stats, discovery and the JWKS. The flows are its two halves: Authorization (what
the browser visits) and Tokens (what the client calls)."""

import hashlib
import json
import os
import threading
import time

from .authorization import Authorization
from .catalog import ALL_SCOPES, CALLBACK_ERRORS, CLAIMS, ID_TOKEN_FAULTS, IDENTITIES, USERINFO_FAULTS
from .jose import SigningKey
from .problem import Problem
from .tokens import Tokens


class FranceConnect(Authorization, Tokens):
    """One FranceConnect (v2 or v1) at `origin`, configured by `config` (the package's docstring),
    every secret it is given or gives out added to `record`."""

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
