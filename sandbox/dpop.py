"""DPoP proofs (RFC 9449 §4.2) built the way an app builds them, with PyJWT and cryptography:
independent of Gatehouse's own code. `Key("ES256")` makes a key pair; `key.proof(method, url,
access_token=…, nonce=…, iat=…, jti=…)` signs a proof; `key.thumbprint` is its RFC 7638 thumbprint."""

import base64
import hashlib
import json
import secrets
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int_bytes(number, length=None):
    length = length or (number.bit_length() + 7) // 8
    return number.to_bytes(length, "big")


class Key:
    def __init__(self, alg="ES256"):
        self.alg = alg
        if alg == "ES256":
            self.private = ec.generate_private_key(ec.SECP256R1())
            numbers = self.private.public_key().public_numbers()
            self.jwk = {"kty": "EC", "crv": "P-256", "x": b64url(_int_bytes(numbers.x, 32)), "y": b64url(_int_bytes(numbers.y, 32))}
            required = ("crv", "kty", "x", "y")
        elif alg in ("RS256", "PS256"):
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            numbers = self.private.public_key().public_numbers()
            self.jwk = {"kty": "RSA", "n": b64url(_int_bytes(numbers.n)), "e": b64url(_int_bytes(numbers.e))}
            required = ("e", "kty", "n")
        elif alg == "EdDSA":
            self.private = ed25519.Ed25519PrivateKey.generate()
            from cryptography.hazmat.primitives import serialization
            raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            self.jwk = {"kty": "OKP", "crv": "Ed25519", "x": b64url(raw)}
            required = ("crv", "kty", "x")
        else:
            raise ValueError(alg)
        canonical = json.dumps({name: self.jwk[name] for name in required}, separators=(",", ":"), sort_keys=True)
        self.thumbprint = b64url(hashlib.sha256(canonical.encode()).digest())

    def proof(self, method, url, access_token=None, nonce=None, iat=None, jti=None, typ="dpop+jwt", jwk=None, extra=None):
        claims = {"htm": method, "htu": url, "iat": int(time.time()) if iat is None else iat, "jti": jti or secrets.token_urlsafe(16)}
        if access_token is not None:
            claims["ath"] = b64url(hashlib.sha256(access_token.encode()).digest())
        if nonce is not None:
            claims["nonce"] = nonce
        claims.update(extra or {})
        return jwt.encode(claims, self.private, algorithm=self.alg, headers={"typ": typ, "jwk": jwk or self.jwk})
