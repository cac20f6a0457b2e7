"""The central look-alike's Apple stand-in: the JWKS it publishes and the RS256 identity tokens
/_control makes (signed with a published key or one never published). A part of Central (provider.py)."""

import json
import secrets

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from .constants import APPLE_ISSUER
from .javascript import b64url


class Apple:
    """The Apple stand-in (mixed into Central)."""

    # ----- Apple stand-in

    def apple_jwk(self, kid, key):
        numbers = key.public_key().public_numbers()
        n = numbers.n.to_bytes((numbers.n.bit_length() + 7) // 8, "big")
        e = numbers.e.to_bytes((numbers.e.bit_length() + 7) // 8, "big")
        return {"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": b64url(n), "e": b64url(e)}

    def apple_jwks(self):
        with self.lock:
            self.stats["requests"]["apple_keys"] += 1
            self.stats["apple_keys_fetches"] += 1
            return {"keys": [self.apple_jwk(kid, self.apple_keys[kid]) for kid in self.apple_published]}

    def apple_token(self, command):
        claims_in = command.get("claims") or {}
        if not isinstance(claims_in, dict):
            raise ValueError("claims must be an object")
        now = self.now_ms() // 1000
        aud = self.apple_bundle_ids.get(command.get("app")) if command.get("app") else None
        if aud is None and len(self.apple_bundle_ids) == 1:
            aud = next(iter(self.apple_bundle_ids.values()))
        claims = {"iss": APPLE_ISSUER, "aud": aud, "exp": now + 600, "iat": now,
                  "sub": "000" + secrets.token_hex(3) + "." + secrets.token_hex(16) + ".0" + secrets.token_hex(2),
                  "email": "apple.user@example.test", "email_verified": True, "auth_time": now, "nonce_supported": True}
        claims.update(claims_in)
        claims = {k: v for k, v in claims.items() if v is not None}
        sign_with = command.get("sign_with", "known")
        if sign_with == "unknown":
            key, kid = self.apple_unknown_key, command.get("kid", "apple-test-unknown")
        elif sign_with == "known":
            kid = command.get("kid", "apple-test-1")
            if kid not in self.apple_keys:
                raise ValueError(f"no Apple key {kid!r} (have {sorted(self.apple_keys)})")
            key = self.apple_keys[kid]
        else:
            raise ValueError("sign_with: known | unknown")
        header = {"kid": kid, "alg": "RS256"}
        signing_input = (b64url(json.dumps(header, separators=(",", ":")).encode()) + "." +
                         b64url(json.dumps(claims, separators=(",", ":"), ensure_ascii=False).encode()))
        signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        if command.get("tamper"):
            signature = bytes([signature[0] ^ 1]) + signature[1:]
        token = signing_input + "." + b64url(signature)
        self.record.add("apple identity token", token)
        return {"token": token, "claims": claims}
