"""What the client (Gatehouse) calls at the FranceConnect look-alike: /token with
client_secret_post, the ID token it signs (and each fault /_control can put in it), the signed
/userinfo, and revocation. A part of FranceConnect (provider.py): it uses its state."""

import base64
import hashlib
import hmac
import secrets
import time
from urllib.parse import unquote_plus

from .jose import SigningKey, b64url, b64url_decode, half_hash, json_bytes, sign_jws


class Tokens:
    """FranceConnect's client-facing endpoints (mixed into FranceConnect)."""

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
