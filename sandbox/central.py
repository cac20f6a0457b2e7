"""A "central" sign-in provider look-alike ("double", broccoliapps style) for Gatehouse's end-to-end tests and demos.

Built from the published broccoliapps code (github.com/mehmetatas/broccoliapps), not from
Gatehouse's: the S2S verifier framework/backend/src/http/s2s.ts and api-router.ts, the signer
framework/shared/src/contract.ts and crypto.ts, the central handlers
broccoliapps.com/src/api/handlers/auth/{verify,email,verify-native}.ts, the pages
broccoliapps.com/src/ui/server/pages/{auth.tsx,auth-callback.ts,email-callback.ts}, the DTOs
framework/shared/src/central-auth.dto.ts. Where the double goes further than the published code
it says so below ("double:").

    .venv/bin/python sandbox/central.py --config cfg.json [--port 0] [--host 127.0.0.1]
                                         [--record secrets.jsonl] [--quiet]

Once listening it prints exactly one line to stdout and nothing after it:

    {"ready": true, "url": "http://127.0.0.1:PORT", "port": PORT, "api_base": "http://127.0.0.1:PORT/api",
     "web_base": "http://127.0.0.1:PORT", "apple_jwks_url": "http://127.0.0.1:PORT/apple/auth/keys"}

Access log on stderr unless --quiet: method, path without query, status, and for a refused S2S
request its reason (never a code, token or signature). SIGTERM/SIGINT exit with status 0.

Config (JSON):

    {"apps": {"tasquito": {"publicKeyPem": "-----BEGIN PUBLIC KEY-----…",   # or "publicKeyFile": path
                           "baseUrl": "http://127.0.0.1:GH",                # Gatehouse's public base URL
                           "mobileScheme": "tasquito"}},                    # optional
     "appleBundleIds": {"tasquito": "com.broccoliapps.tasquito"},          # optional: default `aud` of apple_token
     "appleKeyFiles": ["…/apple-1-private.pem", "…/apple-2-private.pem"],   # default: Tests/Fixtures/central/
     "magicLinkLimit": 5,                                                   # published: 5 per address per hour
     "defaultUser": {"email": "ada.lovelace@example.test", "name": "Ada Lovelace"}}

Endpoints:

    POST /api/v1/auth/verify          S2S {"app","code"} → 200 {"user":{"userId","email","name","provider"}};
                                      unknown, expired (60 s), used, or other app's code → 404 "Auth code not found"
    POST /api/v1/auth/email           S2S {"app","email","platform"?:"mobile"} → 200 {"success":true}; the 6th
                                      accepted send for one address within an hour → 429
    POST /api/v1/auth/verify-native   S2S {"app","email","name","provider":"apple"} → 200 {"user":{…}} (get-or-create)
         (the routes are the contract paths: central-auth.ts declares them with `api(…, "/v1/auth/…")`,
          and contract.ts's `api` prefixes "/api"; the published signer posts to {baseUrl}/api/v1/auth/…
          and signs that same "/api/v1/auth/…". Without the prefix there is no route: 404. The signature
          is checked against the path the request arrived on (the raw request target, query dropped),
          never against anything the caller says about it.)
    GET  /auth?app&provider[&platform=mobile]   signs in the next user at once (no Cognito): a 60 s single-use
                                      code, 302 to {baseUrl}/app/auth/callback?code=… (or {mobileScheme}://auth/callback?code=…)
    GET  /auth/email-callback?token=  magic link (15 min, single use; unknown 404, expired 410) → code → 302 as above
    GET  /apple/auth/keys             the Apple stand-in's JWKS (RS256 keys "apple-test-1", "apple-test-2")

Every API error is api-router.ts's JSON {"status","message"[,"details"]} with the HTTP status
(verify.ts: `throw new HttpError(404, "Auth code not found")` → 404 {"status":404,"message":"Auth
code not found"}). A request no route matches (a path without /api, a GET on an S2S route) gets
Hono's default answer instead: 404 text/plain "404 Not Found".

S2S verification, in the published order (api-router.ts, s2s.ts), every refusal 401 {"status":401,"message":…}:
    any of x-ba-app, x-ba-request-timestamp, x-ba-signature missing or empty → "Missing S2S headers";
    app not configured → "Unknown app"; Date.now() - parseInt(timestamp) NaN or > 15000 → "Request expired"
    (a timestamp in the future passes, as published); RSA public "decrypt" of the base64url signature, the
    PKCS#1 v1.5 type-1 block checked as OpenSSL's RSA_padding_check_PKCS1_type_1 does, must give the
    64 hex characters of SHA-256(JSON.stringify({appId, body, path, timestamp}, sorted keys)) → else
    "Invalid signature". Then (double: CloudFront's check in production, not the verifier's)
    x-amz-content-sha256 must be the lowercase hex SHA-256 of the raw body → else "Invalid content hash".
    double: the signature must be exactly modulus-sized unpadded base64url (the published signer always
    makes that; Node would also take padded or short input). Then the body is validated as the DTOs say
    → 400 {"status":400,"message":"Validation Error","details":["field: problem", …]}; double: the body's
    `app` must equal x-ba-app (the published code does not compare them) → 400 "Validation Error",
    details ["app: does not match x-ba-app"]. Every refusal's reason (and a finer detail) is in stats.

Control (not the central provider's): POST /_control with a JSON object {"op": …}; answers 200 JSON
(400 {"error"} for a bad command, 404 {"error"} for last_magic_link with none):

    {"op":"next_user","email","name","provider"?}   queue the identity the next GET /auth signs in
                                                    (provider default: the query's); empty queue → defaultUser
    {"op":"mint_code","app","email","name","provider"}  → {"code","userId"} (get-or-create the user, as /auth does)
    {"op":"last_magic_link","email"}      → {"token","platform","app","url","used"} of the latest link sent to it
    {"op":"apple_token","claims":{…},"kid"?,"sign_with"?:"known"|"unknown","tamper"?:true,"app"?}
                                          → {"token"}: RS256 Apple-style identity token. Defaults: iss
                                          https://appleid.apple.com, aud appleBundleIds[app] (or the only one),
                                          iat now, exp now+600, auth_time, sub, email, email_verified; a claim
                                          given as null is left out. "known" (default) signs with the published key
                                          of `kid` (default apple-test-1); "unknown" with a key never published.
    {"op":"apple_jwks","publish":["apple-test-1", …]}   which Apple keys GET /apple/auth/keys lists
    {"op":"stats"}                        → the counters (also GET /_control/stats)
    {"op":"reset"}                        forget users, codes, links, sends, faults, clock, stats, queue
    {"op":"fault","endpoint":E,"kind":K,"times"?:N,"seconds"?:S}   E: verify | email | verify-native | auth |
                                          email-callback | apple_keys; K: down (connection closed, no answer),
                                          500, garbage (200, not JSON), wrong_shape (200 JSON of another shape),
                                          401 (Invalid signature), 403 ("Auth code could not be verified": verify.ts
                                          before the S2S signature), 400 (a "Validation Error" with details), 429, slow (answers after S seconds, default 30;
                                          a held request is dropped unanswered by reset or the fault's "none"),
                                          none (clears). Every request while set (or the next N). S2S requests are
                                          still verified first (stats say whether Gatehouse signed right).
    {"op":"clock","offset_ms":X} | {"op":"clock","now_ms":T}   the double's clock (S2S age, code and link
                                          expiry, the email window) = real time + X; "freeze": true stops it
                                          there (until the next clock op or reset); → {"now_ms","offset_ms","frozen"}
    {"op":"age","what":"codes"|"magic_links"|"emails"|"all","seconds":S}   make what exists S seconds older
    {"op":"users"}                        → {"users":[…]}

Stats ({"op":"stats"}): requests per endpoint; s2s {accepted, refused, reasons {message: n},
details {detail: n}, log [every S2S request: endpoint, urlPath, app, timestamp, body (raw text),
contentType, contentSha256Header, outcome, status, message, detail]}; codes {issued, redeemed,
refused {unknown, expired, other_app}}; magic_links {sent, rate_limited, by_email}; auth (list of
/auth sign-ins); email_callbacks; apple_keys_fetches; users; faults; clock.

Secrets record: --record FILE, else the file named by GATEHOUSE_SECRETS_RECORD: every auth code,
magic-link token and Apple identity token this double gives out is appended as {"kind","value"}.

Choices where the published code says nothing or the double differs:
- The email rate limit is a sliding hour of accepted sends per address (exact string, as published);
  published: fixed hour windows of a DynamoDB counter that also counts refused attempts.
- /auth takes `platform` from the query (published: a cookie set by the sign-in page).
- A failed /auth or /auth/email-callback answers a small HTML page with the status, as the page router.
"""

import argparse
import base64
import hashlib
import json
import math
import os
import re
import secrets
import signal
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

try:  # imported from the sandbox package (tests, demos)
    from .secretsrecord import SecretsRecord, stop  # shared with franceconnect.py
    from .doubleprocess import run_double
except ImportError:  # run as a script: python sandbox/central.py
    from secretsrecord import SecretsRecord, stop
    from doubleprocess import run_double

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "Tests" / "Fixtures" / "central"  # test keys, shared with the Swift tests

MAX_TIMESTAMP_AGE_MS = 15_000          # s2s.ts: Duration.seconds(15)
CODE_LIFETIME_MS = 60_000              # auth-callback.ts / email-callback.ts: Duration.minutes(1)
MAGIC_LINK_LIFETIME_MS = 15 * 60_000   # email.ts: Duration.minutes(15)
RATE_PERIOD_MS = 3_600_000             # email.ts: period "1h"
APPLE_ISSUER = "https://appleid.apple.com"
S2S_ROUTES = {"/api/v1/auth/verify": "verify", "/api/v1/auth/email": "email", "/api/v1/auth/verify-native": "verify-native"}
FAULT_ENDPOINTS = {"verify", "email", "verify-native", "auth", "email-callback", "apple_keys"}
FAULT_KINDS = {"down", "500", "garbage", "wrong_shape", "401", "403", "400", "429", "slow", "none"}
# Hono's own answer to a request no route matches (app.notFound's default): text, not the API's JSON.
HONO_NOT_FOUND = b"404 Not Found"
# valibot's EMAIL_REGEX (the `u` flag keeps \w ASCII).
EMAIL_REGEX = re.compile(r"^[\w+-]+(?:\.[\w+-]+)*@[\da-z]+(?:[.-][\da-z]+)*\.[a-z]{2,}$", re.ASCII | re.IGNORECASE)


# --------------------------------------------------------------------------- encodings (as JavaScript does them)

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


# --------------------------------------------------------------------------- RSA "private encrypt" / "public decrypt"

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


# --------------------------------------------------------------------------- validation (valibot-like messages)

def _received(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if value is None:
        return "null"
    if value is _MISSING:
        return "undefined"
    return "Array" if isinstance(value, list) else "Object"


_MISSING = object()


def _picklist(options):
    names = [json.dumps(o) for o in options]
    return names[0] if len(names) == 1 else "(" + " | ".join(names) + ")"


def validate(schema, data, apps):
    """schema: list of (key, kind); kind in app | code | email | name | platform | provider. Returns
    the valibot-style issue list ("key: message")."""
    issues = []
    for key, kind in schema:
        value = data.get(key, _MISSING)
        if kind == "platform":
            if value is _MISSING:
                continue
            if value != "mobile":
                issues.append(f'{key}: Invalid type: Expected ("mobile" | undefined) but received {_received(value)}')
            continue
        if kind == "provider":
            if value != "apple":
                issues.append(f'{key}: Invalid type: Expected "apple" but received {_received(value)}')
            continue
        if value is _MISSING:
            issues.append(f'{key}: Invalid key: Expected "{key}" but received undefined')
            continue
        if not isinstance(value, str):
            issues.append(f"{key}: Invalid type: Expected string but received {_received(value)}")
            continue
        if kind == "app" and value not in apps:
            issues.append(f"{key}: Invalid type: Expected {_picklist(sorted(apps))} but received {_received(value)}")
        elif kind == "code" and len(value.encode("utf-16-le")) // 2 > 1024:
            issues.append(f"{key}: Invalid length: Expected <=1024 but received {len(value.encode('utf-16-le')) // 2}")
        elif kind == "email" and not EMAIL_REGEX.match(value):
            issues.append(f"{key}: Invalid email: Received {_received(value)}")
    return issues


VERIFY_SCHEMA = [("app", "app"), ("code", "code")]
EMAIL_SCHEMA = [("app", "app"), ("email", "email"), ("platform", "platform")]
NATIVE_SCHEMA = [("app", "app"), ("email", "email"), ("name", "name"), ("provider", "provider")]


def derive_name_from_email(email):
    """email-callback.ts: john.doe@gmail.com → "John Doe"."""
    local = email.split("@")[0]
    return " ".join(part[:1].upper() + part[1:].lower() for part in re.split(r"[._-]+", local))


# --------------------------------------------------------------------------- the provider

class Answer(Exception):
    """An API error in the published shape {"status","message"[,"details"]}."""

    def __init__(self, status, message, details=None, reason=None, detail=None):
        super().__init__(message)
        self.status, self.message, self.details = status, message, details
        self.reason, self.detail = reason, detail

    def body(self):
        value = {"status": self.status, "message": self.message}
        if self.details is not None:
            value["details"] = self.details
        return value


class PageAnswer(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


class Central:
    def __init__(self, config, record, origin):
        self.record, self.origin = record, origin
        self.apps = {}
        for app_id, app in config.get("apps", {}).items():
            pem = app.get("publicKeyPem") or Path(app["publicKeyFile"]).read_text()
            self.apps[app_id] = {"public_key": load_public_key(pem), "baseUrl": app["baseUrl"].rstrip("/"),
                                 "mobileScheme": app.get("mobileScheme")}
        self.apple_bundle_ids = dict(config.get("appleBundleIds", {}))
        self.magic_link_limit = int(config.get("magicLinkLimit", 5))
        self.default_user = config.get("defaultUser", {"email": "ada.lovelace@example.test", "name": "Ada Lovelace"})
        key_files = config.get("appleKeyFiles") or [str(FIXTURES / "apple-1-private.pem"), str(FIXTURES / "apple-2-private.pem")]
        self.apple_keys = {f"apple-test-{i + 1}": load_private_key(Path(f).read_bytes()) for i, f in enumerate(key_files)}
        self.apple_unknown_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.lock = threading.RLock()
        self.release = threading.Event()  # set on reset: "slow" answers stop waiting
        self.reset()

    def reset(self):
        with self.lock:
            self.release.set()
            self.release = threading.Event()
            self.users = {}            # email → {"id","email","name","signInProvider","createdAt"}
            self.codes = {}            # code → {"app","email","name","provider","userId","expiresAt"}
            self.magic_links = {}      # token → {"email","app","platform","createdAt","expiresAt","used"}
            self.sends = {}            # email → [ms of accepted sends]
            self.next_users = []
            self.faults = {}           # endpoint → {"kind","times","seconds"}
            self.offset_ms = 0
            self.frozen_ms = None      # the clock stands still at this time when set
            self.apple_published = list(self.apple_keys)
            self.stats = {"requests": {name: 0 for name in sorted(FAULT_ENDPOINTS)},
                          "s2s": {"accepted": 0, "refused": 0, "reasons": {}, "details": {}, "log": []},
                          "codes": {"issued": 0, "redeemed": 0, "refused": {"unknown": 0, "expired": 0, "other_app": 0}},
                          "magic_links": {"sent": 0, "rate_limited": 0, "by_email": {}},
                          "auth": [], "email_callbacks": [], "apple_keys_fetches": 0}

    def now_ms(self):
        return self.frozen_ms if self.frozen_ms is not None else int(time.time() * 1000) + self.offset_ms

    # ----- users and codes (broccoliapps.com/src/auth/users.ts, auth-callback.ts)

    def get_or_create_user(self, email, name, provider):
        user = self.users.get(email)
        if user is None:
            now = self.now_ms()
            user = {"id": random_id(now), "email": email, "name": name, "signInProvider": provider, "createdAt": now}
            self.users[email] = user
        return user

    def new_code(self, app, email, name, provider, lifetime_ms=CODE_LIFETIME_MS):
        user = self.get_or_create_user(email, name, provider)
        code = random_token()
        self.codes[code] = {"app": app, "email": email, "name": name, "provider": provider,
                            "userId": user["id"], "expiresAt": self.now_ms() + lifetime_ms}
        self.record.add("central auth code", code)
        self.stats["codes"]["issued"] += 1
        return code, user

    def redirect_for(self, app, platform, code):
        config = self.apps[app]
        if platform == "mobile" and config["mobileScheme"]:
            return f"{config['mobileScheme']}://auth/callback?code={code}"
        return f"{config['baseUrl']}/app/auth/callback?code={code}"

    # ----- faults

    def take_fault(self, endpoint):
        with self.lock:
            fault = self.faults.get(endpoint)
            if not fault:
                return None
            if fault["times"] is not None:
                fault["times"] -= 1
                if fault["times"] <= 0:
                    del self.faults[endpoint]
            return dict(fault, release=self.release)

    # ----- S2S (api-router.ts + s2s.ts)

    def s2s(self, endpoint, url_path, headers, raw):
        """Returns (status, JSON value) or raises Answer. Records the request in stats. `url_path` is
        the path the request arrived on; the signature must cover exactly it."""
        app_id = headers.get("x-ba-app") or ""
        timestamp = headers.get("x-ba-request-timestamp") or ""
        signature = headers.get("x-ba-signature") or ""
        content_hash = headers.get("x-amz-content-sha256")
        text = raw.decode("utf-8", errors="replace")  # Request.text(): UTF-8, U+FFFD for bad bytes, BOM dropped
        if text.startswith("\ufeff"):
            text = text[1:]
        entry = {"endpoint": endpoint, "urlPath": url_path, "app": app_id, "timestamp": timestamp, "body": text,
                 "contentType": headers.get("content-type"), "contentSha256Header": content_hash}
        with self.lock:
            self.stats["requests"][endpoint] += 1
            self.stats["s2s"]["log"].append(entry)
        try:
            self.verify_s2s(app_id, timestamp, signature, url_path, text, raw, content_hash)
        except Answer as refusal:
            with self.lock:
                s2s = self.stats["s2s"]
                s2s["refused"] += 1
                s2s["reasons"][refusal.message] = s2s["reasons"].get(refusal.message, 0) + 1
                detail = refusal.detail or refusal.message
                s2s["details"][detail] = s2s["details"].get(detail, 0) + 1
                entry.update(outcome="refused", status=refusal.status, message=refusal.message, detail=detail)
            raise
        with self.lock:
            self.stats["s2s"]["accepted"] += 1
            entry.update(outcome="accepted")
        fault = self.take_fault(endpoint)
        if fault:
            entry.update(outcome="fault", fault=fault["kind"])
            return "fault", dict(fault, text=text, app_id=app_id, entry=entry)
        return self.s2s_handle(endpoint, app_id, text, entry)

    def s2s_handle(self, endpoint, app_id, text, entry):
        """After verification: api-router.ts's deserializeRequest (JSON.parse, {} when it fails), the DTO
        validation, then the handler. Returns (status, JSON value) or raises Answer."""
        try:
            data = json.loads(text)
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        schema = {"verify": VERIFY_SCHEMA, "email": EMAIL_SCHEMA, "verify-native": NATIVE_SCHEMA}[endpoint]
        with self.lock:
            issues = validate(schema, data, self.apps)
            if issues:
                entry.update(status=400, message="Validation Error", detail="; ".join(issues))
                raise Answer(400, "Validation Error", issues)
            if data["app"] != app_id:  # double: the published code does not compare them
                entry.update(status=400, message="Validation Error", detail="body app differs from x-ba-app")
                reasons = self.stats["s2s"]["reasons"]
                reasons["app mismatch"] = reasons.get("app mismatch", 0) + 1
                raise Answer(400, "Validation Error", ["app: does not match x-ba-app"])
            try:
                status, value = getattr(self, "handle_" + endpoint.replace("-", "_"))(data)
            except Answer as answer:
                entry.update(status=answer.status, message=answer.message, detail=answer.detail)
                raise
            entry.update(status=status)
            return status, value

    def verify_s2s(self, app_id, timestamp, signature, path, text, raw, content_hash):
        if not app_id or not timestamp or not signature:
            missing = [n for n, v in (("x-ba-app", app_id), ("x-ba-request-timestamp", timestamp),
                                      ("x-ba-signature", signature)) if not v]
            raise Answer(401, "Missing S2S headers", detail="missing " + ", ".join(missing))
        app = self.apps.get(app_id)
        if app is None:
            raise Answer(401, "Unknown app", detail="unknown app")
        sent = js_parse_int(timestamp)
        if sent is None:
            raise Answer(401, "Request expired", detail="timestamp is not a number")
        age = self.now_ms() - sent
        if age > MAX_TIMESTAMP_AGE_MS:
            raise Answer(401, "Request expired", detail=f"timestamp {age} ms old")
        digest = sha256_hex(canonical_payload(app_id, path, timestamp, text))
        try:
            decoded = b64url_decode_strict(signature)
        except ValueError:
            raise Answer(401, "Invalid signature", detail="signature is not unpadded base64url") from None
        try:
            decrypted = rsa_public_decrypt(app["public_key"], decoded)
        except PaddingError as error:
            raise Answer(401, "Invalid signature", detail=f"public decrypt failed: {error}") from None
        if decrypted.decode("utf-8", errors="replace") != digest:
            raise Answer(401, "Invalid signature", detail="decrypted value is not the hash of the canonical payload")
        if content_hash != sha256_hex(raw):  # double: CloudFront's check
            raise Answer(401, "Invalid content hash",
                         detail="x-amz-content-sha256 missing" if content_hash is None else "x-amz-content-sha256 is not sha256(body)")

    def handle_verify(self, data):
        """verify.ts: the code must exist, be unexpired and belong to `app`; it is deleted once used."""
        code = self.codes.get(data["code"])
        refused = self.stats["codes"]["refused"]
        if code is None:
            refused["unknown"] += 1
            raise Answer(404, "Auth code not found", detail="unknown or used code")
        if code["expiresAt"] < self.now_ms():
            refused["expired"] += 1
            raise Answer(404, "Auth code not found", detail="expired code")
        if code["app"] != data["app"]:
            refused["other_app"] += 1
            raise Answer(404, "Auth code not found", detail="code of another app")
        del self.codes[data["code"]]
        self.stats["codes"]["redeemed"] += 1
        return 200, {"user": {"userId": code["userId"], "email": code["email"], "name": code["name"],
                              "provider": code["provider"]}}

    def handle_email(self, data):
        """email.ts: 5 per address per hour, then a 64-character token living 15 minutes."""
        email, now = data["email"], self.now_ms()
        window = [t for t in self.sends.get(email, []) if t > now - RATE_PERIOD_MS]
        self.sends[email] = window
        if len(window) >= self.magic_link_limit:
            self.stats["magic_links"]["rate_limited"] += 1
            raise Answer(429, "Too many requests. Please try again later.", detail="rate limited")
        window.append(now)
        token = random_token(64)
        self.magic_links[token] = {"email": email, "app": data["app"], "platform": data.get("platform"),
                                   "createdAt": now, "expiresAt": now + MAGIC_LINK_LIFETIME_MS, "used": False}
        self.record.add("central magic link token", token)
        ml = self.stats["magic_links"]
        ml["sent"] += 1
        ml["by_email"][email] = ml["by_email"].get(email, 0) + 1
        return 200, {"success": True}

    def handle_verify_native(self, data):
        """verify-native.ts: get-or-create by email; the stored user's fields (its first provider)."""
        user = self.get_or_create_user(data["email"], data["name"], data["provider"])
        return 200, {"user": {"userId": user["id"], "email": user["email"], "name": user["name"],
                              "provider": user["signInProvider"]}}

    # ----- pages

    def auth_page(self, params):
        app, provider, platform = params.get("app"), params.get("provider"), params.get("platform")
        with self.lock:
            self.stats["requests"]["auth"] += 1
            if app not in self.apps or provider not in ("google", "apple") or platform not in (None, "mobile"):
                raise PageAnswer(400, "Validation Error")
            person = self.next_users.pop(0) if self.next_users else dict(self.default_user)
            provider = person.get("provider") or provider
            code, user = self.new_code(app, person["email"], person["name"], provider)
            self.stats["auth"].append({"app": app, "provider": provider, "platform": platform,
                                       "email": person["email"], "userId": user["id"]})
            return self.redirect_for(app, platform, code)

    def email_callback(self, params):
        token = params.get("token")
        with self.lock:
            self.stats["requests"]["email-callback"] += 1
            link = self.magic_links.get(token) if token else None
            if token is None:
                raise PageAnswer(400, "Validation Error")
            if link is None or link["used"]:
                self.stats["email_callbacks"].append({"outcome": "not found"})
                raise PageAnswer(404, "Invalid or expired link")
            link["used"] = True  # single use (published: deleted)
            if link["expiresAt"] < self.now_ms():
                self.stats["email_callbacks"].append({"outcome": "expired"})
                raise PageAnswer(410, "This link has expired. Please request a new one.")
            name = derive_name_from_email(link["email"])
            code, user = self.new_code(link["app"], link["email"], name, "email")
            self.stats["email_callbacks"].append({"outcome": "signed in", "email": link["email"], "userId": user["id"]})
            return self.redirect_for(link["app"], link["platform"], code)

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

    # ----- control

    def control(self, command):
        op = command.get("op")
        with self.lock:
            if op == "next_user":
                if not isinstance(command.get("email"), str) or not isinstance(command.get("name"), str):
                    raise ValueError("next_user needs email and name")
                self.next_users.append({"email": command["email"], "name": command["name"],
                                        "provider": command.get("provider")})
                return 200, {"queued": len(self.next_users)}
            if op == "mint_code":
                for key in ("app", "email", "name", "provider"):
                    if not isinstance(command.get(key), str):
                        raise ValueError(f"mint_code needs {key}")
                lifetime = int(command.get("lifetime_ms", CODE_LIFETIME_MS))
                code, user = self.new_code(command["app"], command["email"], command["name"], command["provider"], lifetime)
                return 200, {"code": code, "userId": user["id"]}
            if op == "last_magic_link":
                found = [(t, link) for t, link in self.magic_links.items() if link["email"] == command.get("email")]
                if not found:
                    return 404, {"error": "no magic link for that address"}
                token, link = max(found, key=lambda item: item[1]["createdAt"])
                return 200, {"token": token, "platform": link["platform"], "app": link["app"], "used": link["used"],
                             "url": f"{self.origin}/auth/email-callback?token={token}"}
            if op == "apple_token":
                return 200, self.apple_token(command)
            if op == "apple_jwks":
                publish = command.get("publish")
                if not isinstance(publish, list) or any(kid not in self.apple_keys for kid in publish):
                    raise ValueError(f"publish: a list of {sorted(self.apple_keys)}")
                self.apple_published = list(publish)
                return 200, {"published": self.apple_published}
            if op == "stats":
                return 200, self.public_stats()
            if op == "reset":
                self.reset()
                return 200, {"ok": True}
            if op == "fault":
                endpoint, kind = command.get("endpoint"), command.get("kind")
                if endpoint not in FAULT_ENDPOINTS or kind not in FAULT_KINDS:
                    raise ValueError(f"fault: endpoint in {sorted(FAULT_ENDPOINTS)}, kind in {sorted(FAULT_KINDS)}")
                if kind == "none":
                    self.faults.pop(endpoint, None)
                    self.release.set()  # requests held by "slow" end now, unanswered
                    self.release = threading.Event()
                else:
                    times = command.get("times")
                    self.faults[endpoint] = {"kind": kind, "times": int(times) if times is not None else None,
                                             "seconds": float(command.get("seconds", 30))}
                return 200, {"faults": self.faults}
            if op == "clock":
                if "now_ms" in command:
                    self.offset_ms = int(command["now_ms"]) - int(time.time() * 1000)
                elif "offset_ms" in command:
                    self.offset_ms = int(command["offset_ms"])
                self.frozen_ms = None
                if command.get("freeze"):
                    self.frozen_ms = int(command["now_ms"]) if "now_ms" in command else self.now_ms()
                return 200, {"now_ms": self.now_ms(), "offset_ms": self.offset_ms, "frozen": self.frozen_ms is not None}
            if op == "age":
                what, shift = command.get("what"), int(float(command.get("seconds", 0)) * 1000)
                if what not in ("codes", "magic_links", "emails", "all"):
                    raise ValueError("age: what in codes | magic_links | emails | all")
                if what in ("codes", "all"):
                    for code in self.codes.values():
                        code["expiresAt"] -= shift
                if what in ("magic_links", "all"):
                    for link in self.magic_links.values():
                        link["createdAt"] -= shift
                        link["expiresAt"] -= shift
                if what in ("emails", "all"):
                    self.sends = {email: [t - shift for t in sends] for email, sends in self.sends.items()}
                return 200, {"ok": True}
            if op == "users":
                return 200, {"users": list(self.users.values())}
            raise ValueError(f"unknown op {op!r}")

    def public_stats(self):
        with self.lock:
            return {**json.loads(json.dumps(self.stats)),
                    "users": list(self.users.values()),
                    "faults": json.loads(json.dumps(self.faults)),
                    "clock": {"now_ms": self.now_ms(), "offset_ms": self.offset_ms, "frozen": self.frozen_ms is not None},
                    "apple_published": list(self.apple_published),
                    "next_users": len(self.next_users)}


# --------------------------------------------------------------------------- HTTP

ERROR_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Error - central sign-in (test double)</title></head>
<body><h1>{status}</h1><p>{message}</p></body></html>
"""


def make_handler(central, quiet):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "CentralDouble/1"

        def log_message(self, *args):
            pass

        def log_line(self, status, note=""):
            if not quiet:
                sys.stderr.write(f"{self.command} {urlsplit(self.path).path} {status}{' ' + note if note else ''}\n")
                sys.stderr.flush()

        def send(self, status, content_type, body, headers=None, note=""):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.log_line(status, note)

        def send_json(self, status, value, headers=None, note=""):
            self.send(status, "application/json", json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(),
                      headers, note)

        def page_error(self, answer):
            import html
            body = ERROR_PAGE.format(status=answer.status, message=html.escape(answer.message)).encode()
            self.send(answer.status, "text/html; charset=utf-8", body)

        def read_body(self):
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length", 0) or 0)
            return self.rfile.read(length) if length else b""

        def drop_connection(self):
            """The "down" fault: no answer, the connection reset."""
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            self.close_connection = True
            self.log_line("-", "(fault down: connection dropped)")

        def apply_fault(self, fault, endpoint):
            """True when the fault answered (or dropped) the request."""
            kind = fault["kind"]
            if kind == "down":
                self.drop_connection()
                return True
            if kind == "slow":
                if fault["release"].wait(fault["seconds"]):  # released by reset, fault none or shutdown: no answer
                    self.drop_connection()
                    return True
                return False  # answers normally, late
            if kind == "500":
                self.send_json(500, {"status": 500, "message": "Internal Server Error"}, note="(fault 500)")
            elif kind == "garbage":
                self.send(200, "application/json", b"<html>not json\x00\xff", note="(fault garbage)")
            elif kind == "wrong_shape":
                self.send_json(200, {"unexpected": True}, note="(fault wrong_shape)")
            elif kind == "401":
                self.send_json(401, {"status": 401, "message": "Invalid signature"}, note="(fault 401)")
            elif kind == "403":  # verify.ts before the S2S signature: the RSA-encrypted code did not decrypt
                self.send_json(403, {"status": 403, "message": "Auth code could not be verified"}, note="(fault 403)")
            elif kind == "400":  # api-router.ts's answer to a body the DTO refuses
                self.send_json(400, {"status": 400, "message": "Validation Error",
                                     "details": ["code: Invalid length: Expected <=1024 but received 1025"]}, note="(fault 400)")
            elif kind == "429":
                self.send_json(429, {"status": 429, "message": "Too many requests. Please try again later."},
                               note="(fault 429)")
            else:
                raise ValueError(kind)
            return True

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            self.route("GET", b"")

        def do_POST(self):
            self.route("POST", self.read_body())

        def do_PUT(self):
            self.route("PUT", self.read_body())

        def do_DELETE(self):
            self.route("DELETE", self.read_body())

        def route(self, method, body):
            path = urlsplit(self.path).path
            try:
                self.dispatch(method, path, body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                self.log_line("-", "(the client went away)")
            except Exception as error:  # a bug of the double: say so loudly, never a secret
                sys.stderr.write(f"central double: {type(error).__name__} on {method} {path}\n")
                import traceback
                traceback.print_exc()
                self.send(500, "text/plain; charset=utf-8", b"internal error of the double")

        def dispatch(self, method, path, body):
            params = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query, keep_blank_values=True).items()}
            if path == "/_control" and method == "POST":
                try:
                    command = json.loads(body or b"{}")
                    if not isinstance(command, dict):
                        raise ValueError("the command must be a JSON object")
                    status, value = central.control(command)
                except (ValueError, TypeError, KeyError) as error:
                    return self.send_json(400, {"error": str(error)})
                return self.send_json(status, value)
            if path == "/_control/stats" and method == "GET":
                return self.send_json(200, central.public_stats())
            if path in S2S_ROUTES:
                if method != "POST":
                    return self.not_found()
                # api-router.ts verifies against the route it registered, which is the path this
                # request arrived on: the raw request target's path, never a re-encoded one.
                return self.s2s(S2S_ROUTES[path], path, body)
            if path == "/auth" and method == "GET":
                return self.page("auth", central.auth_page, params)
            if path == "/auth/email-callback" and method == "GET":
                return self.page("email-callback", central.email_callback, params)
            if path == "/apple/auth/keys" and method == "GET":
                fault = central.take_fault("apple_keys")
                if fault and self.apply_fault(fault, "apple_keys"):
                    with central.lock:
                        central.stats["requests"]["apple_keys"] += 1
                    return None
                return self.send_json(200, central.apple_jwks())
            return self.not_found()

        def not_found(self):
            """No route: Hono's default notFound (`c.text("404 Not Found", 404)`), never the API's JSON error."""
            return self.send(404, "text/plain; charset=UTF-8", HONO_NOT_FOUND)

        def s2s(self, endpoint, url_path, body):
            headers = {name.lower(): self.headers.get(name) for name in self.headers.keys()}
            try:
                status, value = central.s2s(endpoint, url_path, headers, body)
            except Answer as answer:
                note = f"{answer.message} ({answer.detail or answer.message})" if answer.status == 401 else ""
                return self.send_json(answer.status, answer.body(), note=note)
            if status == "fault":
                if self.apply_fault(value, endpoint):
                    return None
                try:  # "slow": answer normally afterwards
                    status, value = central.s2s_handle(endpoint, value["app_id"], value["text"], value["entry"])
                except Answer as answer:
                    return self.send_json(answer.status, answer.body())
            return self.send_json(status, value)

        def page(self, endpoint, handler, params):
            fault = central.take_fault(endpoint)
            if fault and self.apply_fault(fault, endpoint):
                with central.lock:
                    central.stats["requests"][endpoint] += 1
                return None
            try:
                location = handler(params)
            except PageAnswer as answer:
                return self.page_error(answer)
            return self.send(302, "text/plain; charset=utf-8", b"", {"Location": location})

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


# --------------------------------------------------------------------------- for the tests

class ControlError(Exception):
    def __init__(self, status, value):
        super().__init__(f"/_control answered {status}: {value}")
        self.status, self.value = status, value


class Double:
    """A running central double seen from a test: `url`, `port`, `api_base`, `web_base`,
    `apple_jwks_url`; `control(op, **fields)` → the answer (dict; ControlError when not 200), and
    shorthands. Start one with `start(workdir, name, config)`."""

    def __init__(self, ready, process=None, log_path=None):
        self.url, self.port = ready["url"], ready["port"]
        self.api_base, self.web_base, self.apple_jwks_url = ready["api_base"], ready["web_base"], ready["apple_jwks_url"]
        self.process, self.log_path = process, log_path

    def control(self, op, **fields):
        import urllib.error
        import urllib.request
        request = urllib.request.Request(self.url + "/_control", data=json.dumps({"op": op, **fields}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise ControlError(error.code, error.read().decode(errors="replace")) from None

    def stats(self):
        return self.control("stats")

    def reset(self):
        return self.control("reset")

    def next_user(self, email, name, provider=None):
        return self.control("next_user", email=email, name=name, provider=provider)

    def mint_code(self, app, email, name, provider="google", **extra):
        return self.control("mint_code", app=app, email=email, name=name, provider=provider, **extra)["code"]

    def last_magic_link(self, email):
        return self.control("last_magic_link", email=email)

    def apple_token(self, claims=None, **extra):
        return self.control("apple_token", claims=claims or {}, **extra)["token"]

    def fault(self, endpoint, kind, **extra):
        return self.control("fault", endpoint=endpoint, kind=kind, **extra)

    def clock(self, **fields):
        return self.control("clock", **fields)

    def age(self, what, seconds):
        return self.control("age", what=what, seconds=seconds)


def app_config(base_url, public_key_file=FIXTURES / "app-public.pem", mobile_scheme=None):
    """One entry of the config's "apps"."""
    entry = {"publicKeyPem": Path(public_key_file).read_text(), "baseUrl": base_url}
    if mobile_scheme:
        entry["mobileScheme"] = mobile_scheme
    return entry


def gatehouse_upstream(name, double, app_id, key_file=FIXTURES / "app-private.pem", extra=""):
    """The `upstreams:` entry of a Gatehouse configuration in front of this double (YAML list item)."""
    return f"""
  - name: {name}
    kind: central
    client_id: {app_id}
    s2s_private_key_file: {key_file}
    api_base: {double.api_base}
    web_base: {double.web_base}
    timeout: 5s{extra}"""


def start(workdir, name, config, env=None, python=None, record=None, port=0):
    """Context manager: runs this file as a process with `config` (dict), its log in WORKDIR/NAME.log;
    yields a Double. Secrets go to `record` (a path), else to GATEHOUSE_SECRETS_RECORD of `env`."""
    arguments = ("--port", str(port)) + (("--record", str(record)) if record else ())
    return run_double(__file__, workdir, name, config, "central double", Double, env=env, python=python, arguments=arguments)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--record", default=None, help="secrets record file (default: $GATEHOUSE_SECRETS_RECORD)")
    parser.add_argument("--quiet", action="store_true")
    arguments = parser.parse_args()
    config = json.loads(Path(arguments.config).read_text())
    record = SecretsRecord(arguments.record or os.environ.get("GATEHOUSE_SECRETS_RECORD"))
    server = Server((arguments.host, arguments.port), lambda *a: None)
    port = server.server_address[1]
    origin = f"http://{arguments.host}:{port}"
    central = Central(config, record, origin)
    server.RequestHandlerClass = make_handler(central, arguments.quiet)

    def shutdown(*_):
        central.release.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    print(json.dumps({"ready": True, "url": origin, "port": port, "api_base": origin + "/api", "web_base": origin,
                      "apple_jwks_url": origin + "/apple/auth/keys"}), flush=True)
    sys.stdout = sys.stderr  # the ready line is the only stdout output
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
