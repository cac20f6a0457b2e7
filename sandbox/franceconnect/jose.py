"""Compact JWS for the FranceConnect look-alike: its ES256 and RS256 signing keys and their JWKs,
signing (ES256, RS256, HS256, none), decoding, verifying (the tests check Gatehouse's and the
look-alike's tokens with it), and at_hash."""

import base64
import hashlib
import hmac
import json
import secrets

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature


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
