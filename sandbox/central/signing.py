"""RSA as the published S2S signer and verifier use it (Node's privateEncrypt and OpenSSL's
RSA_public_decrypt with PKCS#1 v1.5 type 1), PEM loading, and `sign_s2s`: the headers the
published signer sends."""

import time

from cryptography.hazmat.primitives import serialization

from .javascript import b64url, canonical_payload, sha256_hex


class PaddingError(ValueError):
    """The reason OpenSSL would give (its RSA_R_* names)."""


def rsa_public_decrypt(public_key, signature):
    """RSA_public_decrypt with RSA_PKCS1_PADDING: m = s^e mod n, then RSA_padding_check_PKCS1_type_1:
    00 01, at least 8 bytes FF, 00, data. Returns the data. double: `signature` must be modulus-sized."""
    numbers = public_key.public_numbers()
    k = (numbers.n.bit_length() + 7) // 8
    if len(signature) != k:
        raise PaddingError(f"signature is {len(signature)} bytes, the modulus {k}")
    c = int.from_bytes(signature, "big")
    if c >= numbers.n:
        raise PaddingError("DATA_TOO_LARGE_FOR_MODULUS")
    em = pow(c, numbers.e, numbers.n).to_bytes(k, "big")
    if em[0] != 0x00:
        raise PaddingError("INVALID_PADDING (first byte not 00)")
    if em[1] != 0x01:
        raise PaddingError("BLOCK_TYPE_IS_NOT_01")
    i = 2
    while i < k and em[i] == 0xFF:
        i += 1
    if i == k:
        raise PaddingError("NULL_BEFORE_BLOCK_MISSING")
    if em[i] != 0x00:
        raise PaddingError("BAD_FIXED_HEADER_DECRYPT")
    if i - 2 < 8:
        raise PaddingError("BAD_PAD_BYTE_COUNT")
    return em[i + 1:]


def rsa_private_encrypt(private_key, data):
    """RSA_private_encrypt with RSA_PKCS1_PADDING (Node crypto.privateEncrypt's default): deterministic."""
    numbers = private_key.private_numbers()
    n = numbers.public_numbers.n
    k = (n.bit_length() + 7) // 8
    if len(data) > k - 11:
        raise ValueError("data too large for the key")
    em = b"\x00\x01" + b"\xff" * (k - 3 - len(data)) + b"\x00" + data
    return pow(int.from_bytes(em, "big"), numbers.d, n).to_bytes(k, "big")


def load_private_key(pem):
    return serialization.load_pem_private_key(pem.encode() if isinstance(pem, str) else pem, password=None)


def load_public_key(pem):
    return serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)


def sign_s2s(private_key_pem, app_id, path, body, timestamp=None):
    """The headers the published signer (contract.ts) sends with `body` (text) to contract path `path`."""
    timestamp = str(int(time.time() * 1000)) if timestamp is None else timestamp
    digest = sha256_hex(canonical_payload(app_id, path, timestamp, body))
    signature = rsa_private_encrypt(load_private_key(private_key_pem), digest.encode())
    return {"Content-Type": "application/json", "x-amz-content-sha256": sha256_hex(body),
            "x-ba-request-timestamp": timestamp, "x-ba-app": app_id, "x-ba-signature": b64url(signature)}
