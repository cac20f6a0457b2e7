"""Encodings as the published JavaScript does them, for the central look-alike: base64url,
JSON.stringify's strings and the signer's canonical payload, SHA-256 hex, parseInt, and
random.ts's tokens and ids."""

import base64
import hashlib
import math
import re
import secrets


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode_strict(text):
    """Unpadded base64url only (what Buffer.toString("base64url") makes); ValueError otherwise."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text) or len(text) % 4 == 1:
        raise ValueError("not unpadded base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def js_json_string(value):
    """A string as JavaScript's JSON.stringify writes it (ES2019 well-formed): \\" \\\\ \\b \\f \\n \\r \\t,
    other U+0000–U+001F as \\u00xx, lone surrogates as \\udxxx (lowercase hex); all else raw."""
    out = ['"']
    short = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    for char in value:
        code = ord(char)
        if char in short:
            out.append(short[char])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def canonical_payload(app_id, path, timestamp, body=None):
    """JSON.stringify(payload, Object.keys(payload).sort()) of {appId, path, timestamp[, body]} (all strings)."""
    payload = {"appId": app_id, "path": path, "timestamp": timestamp}
    if body is not None:
        payload["body"] = body
    return "{" + ",".join(f"{js_json_string(k)}:{js_json_string(payload[k])}" for k in sorted(payload)) + "}"


def sha256_hex(data):
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def js_parse_int(text):
    """JavaScript parseInt(text) (no radix): leading white space, a sign, 0x → hex, else decimal digits;
    None for NaN."""
    text = text.lstrip(" \t\n\r\v\f\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
                       "\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff")
    sign = 1
    if text[:1] in ("+", "-"):
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    base, digits = 10, "0123456789"
    if text[:2].lower() == "0x":
        base, digits, text = 16, "0123456789abcdefABCDEF", text[2:]
    n = 0
    while n < len(text) and text[n] in digits:
        n += 1
    return sign * int(text[:n], base) if n else None


def random_token(length=32):
    """random.token of framework/shared/src/random.ts: `length` base36 characters."""
    data = secrets.token_bytes(math.ceil(length * math.log2(36) / 8))
    number, chars = int.from_bytes(data, "big"), ""
    while number:
        number, digit = divmod(number, 36)
        chars = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + chars
    return chars.rjust(length, "0")[:length]


def random_id(now_ms):
    """random.id: base36 milliseconds padded to 9, then 11 random base36 characters."""
    stamp, number = "", now_ms
    while number:
        number, digit = divmod(number, 36)
        stamp = "0123456789abcdefghijklmnopqrstuvwxyz"[digit] + stamp
    return stamp.rjust(9, "0") + random_token(11)
