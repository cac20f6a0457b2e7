"""The `central` upstream kind end to end (issue 10): the gatehouse binary as the backend of
broccoliapps-style apps, in front of a central-provider double built from the published contract
(sandbox/central/: it checks every server-to-server request the way the published verifier
does, Node-compatible public-key decryption of the signature, the 15 s request age, the body hash;
single-use one-minute codes; five emails an hour per address).

One Gatehouse of this module's own (SQLite) has six `central` upstreams: `tasquito` (the app, with
its /auth/* endpoints, Sign in with Apple, a relay route), `otherapp` (a second app at the same
provider, refresh rotation `after_80_percent`), `mismatch` (signs with a key the provider does not
have for it), `gone` (the provider's port is closed), `silent` (the provider never answers) and
`noprefix` (an api_base without the provider's /api). It trusts 127.0.0.1 as a proxy, so a test
names its client address in X-Forwarded-For (the magic-link limit per client address).
More Gatehouses are started by single tests: one with a one-second refresh grace, one restarted
three times over one store to rotate its JWT signing keys, one restarted over one store to replay
an Apple identity token, two on one PostgreSQL database (when GATEHOUSE_TEST_POSTGRES is set), and
one whose app does not require Apple nonces.

Every access token is verified with PyJWT (an independent library) from Gatehouse's JWKS; the key
ids are checked against RFC 7638 thumbprints computed here from the fixture keys.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import jwt  # PyJWT
import pytest
import requests
from cryptography.hazmat.primitives import serialization

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the sandbox package

from sandbox import central as centrald  # noqa: E402
from conftest import SilentServer  # noqa: E402  (an upstream that never answers)
from sandbox.backends import EchoBackend  # noqa: E402
from sandbox.gatelog import served_by  # noqa: E402
from sandbox.nativeapp import App, free_port, query  # noqa: E402
from processes import run_gatehouse, session_keys  # noqa: E402

FIXTURES = ROOT / "Tests/Fixtures/central"
APP = "tasquito"
CLIENT = "tasquito-app"
OTHER_APP = "otherapp"
REDIRECT = "com.broccoliapps.tasquito:/oauth2redirect"
BUNDLE = "com.broccoliapps.tasquito"
APPLE_ISSUER = "https://appleid.apple.com"
MAX_BODY = 4096
REFRESH_TOKEN = re.compile(r"[A-Za-z0-9_-]{128}")
ACCESS_LIFETIME, REFRESH_LIFETIME = 5 * 60, 60 * 60  # environment: development
RATE_LIMITED = {"status": 429, "message": "Too many requests. Please try again later."}
CODE_NOT_FOUND = {"status": 404, "message": "Auth code not found"}
INVALID_REFRESH = {"status": 403, "message": "Invalid refresh token"}


# --------------------------------------------------------------------------- keys

def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def private_key(name):
    return serialization.load_pem_private_key((FIXTURES / name).read_bytes(), None)


def public_pem(name):
    return private_key(name).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def thumbprint(name):
    """RFC 7638 JWK thumbprint of the RSA key in FIXTURES/name, computed here (not read from Gatehouse)."""
    numbers = private_key(name).public_key().public_numbers()

    def integer(value):
        return b64url(value.to_bytes((value.bit_length() + 7) // 8, "big"))

    canonical = json.dumps({"e": integer(numbers.e), "kty": "RSA", "n": integer(numbers.n)}, separators=(",", ":"), sort_keys=True)
    return b64url(hashlib.sha256(canonical.encode()).digest())


def pem_body_lines(name):
    return [line for line in (FIXTURES / name).read_text().splitlines() if line and not line.startswith("-----")]


KID_A, KID_B = thumbprint("jwt-a.pem"), thumbprint("jwt-b.pem")


def forge(claims, key="jwt-a.pem", kid=None, alg="RS256"):
    """A JWT signed here with a fixture key (or alg none / HS256 by hand)."""
    header = {"alg": alg, "kid": kid or thumbprint(key), "typ": "JWT"}
    if alg == "RS256":
        pem = (FIXTURES / key).read_bytes()
        return jwt.encode(claims, pem, algorithm="RS256", headers={"kid": header["kid"]})
    signing_input = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
    if alg == "none":
        return signing_input + "."
    # HS256 keyed with the RSA public key (PEM): the classic algorithm confusion.
    signature = hmac.new(public_pem(key).encode(), signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64url(signature)


def resign(token, alg, secret_key_pem=None):
    """`token`'s header and claims under another algorithm: "none", or "HS256" keyed with `secret_key_pem`."""
    head, body, _ = token.split(".")
    header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    header["alg"] = alg
    signing_input = b64url(json.dumps(header).encode()) + "." + body
    if alg == "none":
        return signing_input + "."
    return signing_input + "." + b64url(hmac.new(secret_key_pem.encode(), signing_input.encode(), hashlib.sha256).digest())


def tamper(token):
    """The same token with one byte of its signature changed."""
    head, body, signature = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[len(raw) // 2] ^= 0x01
    return f"{head}.{body}.{b64url(bytes(raw))}"


def claims_of(token):
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


# --------------------------------------------------------------------------- processes

def wait_until(predicate, timeout, what):
    """Polls an observable condition (never a fixed sleep) until it holds; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout}s: {what}")
        time.sleep(0.02)


def central_upstream(name, app_id, key_file, api_base, web_base, path, signing=("jwt-a.pem",), rotation="every_use",
                     apple_jwks=None, timeout="3s", require_nonce=None):
    keys = ", ".join(str(FIXTURES / key) for key in signing)
    text = f"""
  - name: {name}
    kind: central
    client_id: {app_id}
    s2s_private_key_file: {FIXTURES / key_file}
    api_base: {api_base}
    web_base: {web_base}
    provider: google
    environment: development
    refresh_rotation: {rotation}
    signing_key_files: [{keys}]
    token_issuer: {app_id}
    magic_link_limit: 5
    timeout: {timeout}
    app_api:
      path: {path}
      client: {name}-app"""
    if apple_jwks:
        text += f"""
    apple:
      bundle_id: {BUNDLE}
      jwks_url: {apple_jwks}"""
        if require_nonce is not None:
            text += f"""
      require_nonce: {"true" if require_nonce else "false"}"""
    return text


def central_client(name, redirect=REDIRECT):
    return f"""
  - client_id: {name}-app
    upstream: {name}
    redirect_uris: ["{redirect}"]"""


def central_route(prefix, backend, upstream):
    return f"""
  - prefix: {prefix}
    backend: {backend}
    upstream: {upstream}
    identity_headers:
      X-User-Id: subject
      X-User-Email: email
      X-User-Provider: provider"""


def server_section(port, store):
    """The `server:` (with a small body limit) and `store:` sections of a Gatehouse on 127.0.0.1:PORT."""
    return f"""
server:
  public_base_url: http://127.0.0.1:{port}
  host: 127.0.0.1
  port: {port}
  max_body_bytes: {MAX_BODY}
store:
  sqlite_path: {store}"""


def single_app_config(port, store, keys, double, backend, signing=("jwt-a.pem",), grace=None, apple=False):
    """A Gatehouse with the `tasquito` upstream only (and its relay route; Sign in with Apple when `apple`)."""
    sessions = f"""
sessions:
  encryption_keys_file: {keys}"""
    if grace:
        sessions += f"""
  refresh_grace: {grace}"""
    return server_section(port, store) + f"""
upstreams:{central_upstream(APP, APP, "app-private.pem", double.api_base, double.web_base, "/auth", signing,
                             apple_jwks=double.apple_jwks_url if apple else None)}
clients:{central_client(APP)}
routes:{central_route("/api/central", backend.url + "/central", APP)}
{sessions}
"""


@contextmanager
def own_gatehouse(workdir, name, config):
    """A Gatehouse of a single test's (its log WORKDIR/NAME.log is scanned like every other)."""
    with run_gatehouse(workdir, name, config, dict(os.environ), log_level="debug") as gatehouse:
        yield gatehouse


@pytest.fixture(scope="module")
def central(workdir, seen):
    """The central-provider double, an echo backend and this module's Gatehouse in front of them."""
    for name in ("app-private.pem", "other-private.pem", "apple-1-private.pem", "apple-2-private.pem", "jwt-a.pem", "jwt-b.pem"):
        seen.add(*pem_body_lines(name), kind="central fixture private key (PEM line)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    backend, silent, closed = EchoBackend(), SilentServer(), free_port()
    keys = session_keys(workdir, "central-session-keys", seen)
    double_config = {
        "apps": {
            APP: {"publicKeyPem": (FIXTURES / "app-public.pem").read_text(), "baseUrl": base, "mobileScheme": "tasquito"},
            OTHER_APP: {"publicKeyPem": (FIXTURES / "other-public.pem").read_text(), "baseUrl": base, "mobileScheme": "otherapp"},
            # Registered with the tasquito key: Gatehouse's `mismatch` upstream signs with other-private.pem.
            "mismatch": {"publicKeyPem": (FIXTURES / "app-public.pem").read_text(), "baseUrl": base},
        },
        "appleBundleIds": {APP: BUNDLE},
    }
    try:
        with centrald.start(workdir, "central-double", double_config) as double:
            api, web = double.api_base, double.web_base
            config = server_section(port, workdir / "central-gatehouse.sqlite") + f"""
upstreams:{central_upstream(APP, APP, "app-private.pem", api, web, "/auth", apple_jwks=double.apple_jwks_url)}\
{central_upstream(OTHER_APP, OTHER_APP, "other-private.pem", api, web, "/other/auth", rotation="after_80_percent")}\
{central_upstream("mismatch", "mismatch", "other-private.pem", api, web, "/mismatch/auth")}\
{central_upstream("gone", "gone", "app-private.pem", f"http://127.0.0.1:{closed}/api", web, "/gone/auth")}\
{central_upstream("silent", "silent", "app-private.pem", f"http://127.0.0.1:{silent.port}/api", web, "/silent/auth", timeout="1s")}\
{central_upstream("noprefix", "noprefix", "app-private.pem", double.url, web, "/noprefix/auth")}
clients:{central_client(APP)}{central_client(OTHER_APP, "com.broccoliapps.otherapp:/oauth2redirect")}{central_client("mismatch")}\
{central_client("gone")}{central_client("silent")}{central_client("noprefix")}
routes:{central_route("/api/central", backend.url + "/central", APP)}
sessions:
  encryption_keys_file: {keys}
rate_limits:
  trusted_proxies: [127.0.0.1/32]   # the tests say which client address a request is from (X-Forwarded-For)
"""
            with own_gatehouse(workdir, "central-gatehouse", config) as gatehouse:
                yield Central(gatehouse, double, backend, seen, workdir)
    finally:
        backend.stop()
        silent.stop()


# --------------------------------------------------------------------------- the app's side

class Central:
    """This module's Gatehouse seen from an app (and the double behind it)."""

    def __init__(self, gatehouse, double, backend, seen, workdir):
        self.gatehouse, self.double, self.backend, self.seen, self.workdir = gatehouse, double, backend, seen, workdir
        self.url = gatehouse["url"]

    # the double
    def mint(self, email=None, name="Zoë Ünal", provider="google", app=APP):
        email = email or f"user-{secrets.token_hex(6)}@example.test"
        code = self.double.mint_code(app, email, name, provider)
        self.seen.add(code, kind="central auth code")
        return code, {"email": email, "name": name, "provider": provider}

    def stats(self):
        return self.double.stats()

    # Gatehouse
    def post(self, path, body, base=None, **kwargs):
        """POST a JSON body (a Python value, or bytes sent as they are) to Gatehouse."""
        headers = kwargs.pop("headers", {"Content-Type": "application/json"})
        data = body if isinstance(body, (bytes, str)) else json.dumps(body, ensure_ascii=False).encode()  # raw UTF-8
        answer = requests.post((base or self.url) + path, data=data, headers=headers, timeout=30, **kwargs)
        assert answer.status_code != 500, f"POST {path}: 500 {answer.text[:300]}"
        if answer.headers.get("Content-Type", "").startswith("application/json"):
            self.remember(answer)
        return answer

    def remember(self, answer):
        try:
            value = answer.json()
        except ValueError:
            return
        if isinstance(value, dict):
            self.seen.add(value.get("accessToken"), kind="central access token (Gatehouse JWT)")
            self.seen.add(value.get("refreshToken"), kind="central refresh token")
            self.seen.add(value.get("access_token"), kind="central access token (Gatehouse JWT)")
            self.seen.add(value.get("refresh_token"), kind="central refresh token")

    def exchange(self, code, base=None, path="/auth"):
        return self.post(f"{path}/exchange", {"code": code}, base)

    def refresh(self, token, base=None, path="/auth"):
        return self.post(f"{path}/refresh", {"refreshToken": token}, base)

    def signed_in(self, base=None, path="/auth", app=APP, **who):
        code, person = self.mint(app=app, **who)
        answer = self.exchange(code, base, path)
        assert answer.status_code == 200, answer.text
        return answer.json(), person

    def relay(self, token, path="/api/central/profile", base=None):
        return requests.get((base or self.url) + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def jwks(base):
    answer = requests.get(base + "/.well-known/jwks.json", timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["keys"]


def verify(base, token, issuer=APP):
    """PyJWT's verification of a token Gatehouse minted, with the key its `kid` names in Gatehouse's JWKS
    (`iss` and `aud` are both the app id by default)."""
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "RS256" and header.get("typ") == "JWT" and header.get("kid"), header
    keys = [key for key in jwks(base) if key.get("kid") == header["kid"]]
    assert len(keys) == 1, f"kid {header['kid']} is {len(keys)} times in the JWKS"
    key = keys[0]
    assert key["kty"] == "RSA" and key.get("alg") == "RS256" and key.get("use") == "sig", key
    assert not set(key) & {"d", "p", "q", "dp", "dq", "qi"}, "the JWKS holds a private key"
    claims = jwt.decode(token, jwt.PyJWK(key).key, algorithms=["RS256"], issuer=issuer, audience=issuer,
                        options={"require": ["exp", "iat", "sub", "iss", "aud"]})
    return header, claims


def assert_error(answer, status, message=None):
    """The seed's error shape: {"status", "message", "details"?} (details only for 400), no-store."""
    assert answer.status_code == status, f"expected {status}, got {answer.status_code}: {answer.text[:300]}"
    assert answer.headers.get("Content-Type", "").startswith("application/json"), answer.headers.get("Content-Type")
    body = answer.json()
    assert isinstance(body, dict) and set(body) <= {"status", "message", "details"}, body
    assert body["status"] == status and isinstance(body["message"], str) and body["message"], body
    if message is not None:
        assert body["message"] == message, body
    if status == 400:
        assert isinstance(body.get("details"), list) and body["details"], body
        assert all(isinstance(item, str) for item in body["details"]), body
    else:
        assert "details" not in body or status == 401, body
    assert "no-store" in answer.headers.get("Cache-Control", ""), answer.headers
    return body


def retry_after(answer):
    value = answer.headers.get("Retry-After")
    assert value is not None and re.fullmatch(r"\d+", value) and int(value) > 0, f"Retry-After: {value!r}"
    return int(value)


# --------------------------------------------------------------------------- the double's statistics

def s2s_log(stats, endpoint=None):
    """Every S2S request the double received (on `endpoint`: verify, email, verify-native), oldest first:
    {endpoint, urlPath, app, timestamp, body, contentType, contentSha256Header, outcome, status, message…}."""
    return [entry for entry in stats["s2s"]["log"] if endpoint is None or entry["endpoint"] == endpoint]


def s2s_since(before, after, endpoint=None):
    """The S2S requests received between two snapshots of the stats."""
    return s2s_log(after, endpoint)[len(s2s_log(before, endpoint)):]


def s2s_counts(stats, endpoint):
    """(accepted, refused): requests on `endpoint` whose S2S signature the double's verifier accepted
    (whatever the handler answered then), and those it refused."""
    entries = s2s_log(stats, endpoint)
    return (sum(entry.get("outcome") in ("accepted", "fault") for entry in entries),
            sum(entry.get("outcome") == "refused" for entry in entries))


def s2s_total(stats):
    return len(s2s_log(stats))


def accepted(stats, endpoint):
    return s2s_counts(stats, endpoint)[0]


# --------------------------------------------------------------------------- /auth/exchange

def test_exchange_gives_the_seeds_response_with_a_verified_s2s_call(central):
    code, person = central.mint()
    before = central.stats()
    answer = central.exchange(code)
    after = central.stats()
    assert answer.status_code == 200, answer.text
    assert "no-store" in answer.headers.get("Cache-Control", "")
    body = answer.json()
    assert set(body) == {"accessToken", "accessTokenExpiresAt", "refreshToken", "refreshTokenExpiresAt", "user"}, sorted(body)
    user = body["user"]
    assert set(user) == {"id", "userId", "email", "name", "provider", "isNewUser"}, sorted(user)
    assert user["email"] == person["email"] and user["name"] == person["name"] and user["provider"] == "google", user
    assert user["id"] == user["userId"] and isinstance(user["userId"], str) and user["userId"], user
    assert isinstance(user["isNewUser"], bool)
    assert REFRESH_TOKEN.fullmatch(body["refreshToken"]), len(body["refreshToken"])
    assert isinstance(body["accessTokenExpiresAt"], int) and isinstance(body["refreshTokenExpiresAt"], int)
    # One verify, accepted by the double's verifier (signature, age, body hash) and answered 200.
    new = s2s_since(before, after)
    assert [(e["endpoint"], e["outcome"], e.get("status")) for e in new] == [("verify", "accepted", 200)], \
        [(e["endpoint"], e["outcome"], e.get("message"), e.get("detail")) for e in new]
    assert json.loads(new[0]["body"]) == {"app": APP, "code": code}
    _, claims = verify(central.url, body["accessToken"])
    assert claims["sub"] == user["userId"]
    assert claims["data"] == {"userId": user["userId"], "email": person["email"], "name": person["name"], "provider": "google"}
    # The same code again, and a code of another app: the provider's 404, passed on.
    again = central.exchange(code)
    assert_error(again, 404, CODE_NOT_FOUND["message"])
    assert again.json() == CODE_NOT_FOUND
    other, _ = central.mint(app=OTHER_APP)
    assert central.exchange(other).json() == CODE_NOT_FOUND
    unknown = central.exchange(secrets.token_urlsafe(32))
    assert unknown.status_code == 404 and unknown.json() == CODE_NOT_FOUND


def test_the_access_token_verifies_with_pyjwt_and_has_the_development_lifetimes(central):
    started = time.time()
    body, person = central.signed_in()
    header, claims = verify(central.url, body["accessToken"])
    assert header["kid"] == KID_A, "the kid is not the RFC 7638 thumbprint of the signing key"
    assert claims["iss"] == APP
    assert claims["data"]["email"] == person["email"] and claims["sub"] == claims["data"]["userId"]
    assert started - 5 <= claims["iat"] <= time.time() + 5
    assert abs(claims["exp"] - (claims["iat"] + ACCESS_LIFETIME)) <= 2, claims
    assert abs(body["accessTokenExpiresAt"] / 1000 - (started + ACCESS_LIFETIME)) <= 10, body["accessTokenExpiresAt"]
    assert abs(body["refreshTokenExpiresAt"] / 1000 - (started + REFRESH_LIFETIME)) <= 10, body["refreshTokenExpiresAt"]
    assert REFRESH_TOKEN.fullmatch(body["refreshToken"])
    # The JWKS lists the central key with its thumbprint, and no other key verifies the token.
    kids = {key.get("kid") for key in jwks(central.url)}
    assert KID_A in kids and KID_B not in kids, kids
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(body["accessToken"], private_key("jwt-b.pem").public_key(), algorithms=["RS256"], issuer=APP)


# --------------------------------------------------------------------------- refresh

def test_refresh_rotates_on_every_use_and_a_retry_within_grace_gets_the_same_pair(central):
    before = s2s_total(central.stats())
    first, _ = central.signed_in()
    base_s2s = s2s_total(central.stats())
    renewed = central.refresh(first["refreshToken"])
    assert renewed.status_code == 200, renewed.text
    pair = renewed.json()
    assert {"accessToken", "accessTokenExpiresAt", "refreshToken", "refreshTokenExpiresAt", "user"} <= set(pair), sorted(pair)
    assert pair["refreshToken"] != first["refreshToken"] and REFRESH_TOKEN.fullmatch(pair["refreshToken"])
    verify(central.url, pair["accessToken"])
    retry = central.refresh(first["refreshToken"])
    assert retry.status_code == 200, retry.text
    same = (retry.json()["accessToken"], retry.json()["refreshToken"]) == (pair["accessToken"], pair["refreshToken"])
    assert same, "a retry within the grace window got another pair"
    third = central.refresh(pair["refreshToken"])
    assert third.status_code == 200 and third.json()["refreshToken"] not in (first["refreshToken"], pair["refreshToken"])
    assert s2s_total(central.stats()) == base_s2s == before + 1, "refreshing asked the central provider"
    assert_error(central.refresh(secrets.token_urlsafe(96)), 403, INVALID_REFRESH["message"])


def test_fifty_concurrent_refreshes_with_one_token_share_one_new_pair(central):
    first, _ = central.signed_in()
    barrier = threading.Barrier(50)

    def refresh(_):
        barrier.wait()
        return requests.post(central.url + "/auth/refresh", json={"refreshToken": first["refreshToken"]}, timeout=60)

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(refresh, range(50)))
    for answer in answers:
        central.remember(answer)
    assert [a.status_code for a in answers] == [200] * 50, sorted({a.status_code for a in answers})
    pairs = {(a.json()["accessToken"], a.json()["refreshToken"]) for a in answers}
    assert len(pairs) == 1, f"{len(pairs)} different pairs"
    (access, refresh_token), = pairs
    assert refresh_token != first["refreshToken"]
    verify(central.url, access)
    assert central.refresh(refresh_token).status_code == 200


def test_reuse_after_the_grace_window_revokes_the_family(central, workdir, seen):
    port = free_port()
    keys = session_keys(workdir, "central-grace-session-keys", seen)
    config = single_app_config(port, workdir / "central-grace.sqlite", keys, central.double, central.backend, grace="1s")
    with own_gatehouse(workdir, "central-grace-gatehouse", config) as gatehouse:
        base = gatehouse["url"]
        first, _ = central.signed_in(base=base)
        renewed = central.refresh(first["refreshToken"], base=base)
        rotated_at = time.monotonic()
        assert renewed.status_code == 200, renewed.text
        newest = renewed.json()["refreshToken"]
        assert newest != first["refreshToken"]
        # Past the one-second window (the clock is polled; nothing else is waited for).
        wait_until(lambda: time.monotonic() > rotated_at + 1.5, 5, "the grace window passed")
        reused = central.refresh(first["refreshToken"], base=base)
        assert_error(reused, 403, INVALID_REFRESH["message"])
        assert reused.json() == INVALID_REFRESH
        # The whole family is revoked: the newest refresh token of the session is refused too.
        assert_error(central.refresh(newest, base=base), 403, INVALID_REFRESH["message"])
        # Another session of the same Gatehouse is not touched.
        other, _ = central.signed_in(base=base)
        assert central.refresh(other["refreshToken"], base=base).status_code == 200


def test_after_80_percent_rotation_gives_the_same_refresh_token_back_early_in_its_life(central):
    first, _ = central.signed_in(path="/other/auth", app=OTHER_APP)
    _, claims = verify(central.url, first["accessToken"], issuer=OTHER_APP)
    renewed = central.refresh(first["refreshToken"], path="/other/auth")
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["refreshToken"] == first["refreshToken"], "after_80_percent rotated a young refresh token"
    verify(central.url, renewed.json()["accessToken"], issuer=OTHER_APP)
    # The every_use upstream of the same Gatehouse does rotate (the setting is per upstream).
    own, _ = central.signed_in()
    assert central.refresh(own["refreshToken"]).json()["refreshToken"] != own["refreshToken"]


# --------------------------------------------------------------------------- key rotation

def test_jwt_signing_key_rotation_keeps_old_tokens_valid_until_the_old_key_is_dropped(central, workdir, seen):
    port = free_port()
    keys = session_keys(workdir, "central-rotation-session-keys", seen)
    store = workdir / "central-rotation.sqlite"

    def config(signing):
        return single_app_config(port, store, keys, central.double, central.backend, signing=signing)

    with own_gatehouse(workdir, "central-rotation-1", config(("jwt-a.pem",))) as gatehouse:
        base = gatehouse["url"]
        first, _ = central.signed_in(base=base)
        t1 = first["accessToken"]
        assert verify(base, t1)[0]["kid"] == KID_A
        kids = {key.get("kid") for key in jwks(base)}
        assert KID_A in kids and KID_B not in kids, kids
        assert central.relay(t1, base=base).status_code == 200

    with own_gatehouse(workdir, "central-rotation-2", config(("jwt-b.pem", "jwt-a.pem"))) as gatehouse:
        kids = {key.get("kid") for key in jwks(base)}
        assert {KID_A, KID_B} <= kids, kids
        header, claims = verify(base, t1)  # PyJWT, the old token, from the new JWKS
        assert header["kid"] == KID_A
        relayed = central.relay(t1, base=base)
        assert relayed.status_code == 200, relayed.text
        assert relayed.json()["headers"]["x-user-id"] == claims["sub"]
        second, _ = central.signed_in(base=base)
        t2 = second["accessToken"]
        assert verify(base, t2)[0]["kid"] == KID_B, "the first key of signing_key_files does not sign"
        # The session of the first run lives on (same store, same key ring): its refresh is signed with the new key.
        renewed = central.refresh(first["refreshToken"], base=base)
        assert renewed.status_code == 200, renewed.text
        assert verify(base, renewed.json()["accessToken"])[0]["kid"] == KID_B

    with own_gatehouse(workdir, "central-rotation-3", config(("jwt-b.pem",))) as gatehouse:
        kids = {key.get("kid") for key in jwks(base)}
        assert KID_B in kids and KID_A not in kids, kids
        calls = central.backend.calls
        assert central.relay(t1, base=base).status_code == 401, "a token of a dropped key was relayed"
        assert central.backend.calls == calls
        assert central.relay(t2, base=base).status_code == 200


# --------------------------------------------------------------------------- magic link

def test_magic_link_sends_are_limited_to_five_an_hour_per_address(central):
    address = f"limit-{secrets.token_hex(5)}@example.test"
    before = central.stats()
    for _ in range(5):
        answer = central.post("/auth/send-magic-link", {"email": address, "platform": "mobile"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"success": True}
    after_five = central.stats()
    assert accepted(after_five, "email") - accepted(before, "email") == 5
    sent = [json.loads(entry["body"]) for entry in s2s_since(before, after_five, "email")]
    assert sent == [{"app": APP, "email": address, "platform": "mobile"}] * 5, sent
    sixth = central.post("/auth/send-magic-link", {"email": address, "platform": "mobile"})
    assert_error(sixth, 429, RATE_LIMITED["message"])
    assert sixth.json() == RATE_LIMITED
    assert retry_after(sixth) <= 3600
    after_six = central.stats()
    assert sum(s2s_counts(after_six, "email")) == sum(s2s_counts(after_five, "email")), "the 6th reached the central provider"
    other = central.post("/auth/send-magic-link", {"email": f"other-{secrets.token_hex(5)}@example.test"})
    assert other.status_code == 200 and other.json() == {"success": True}, other.text


def test_magic_link_limit_counts_an_address_case_insensitively(central):
    local = f"Case-{secrets.token_hex(5)}"
    spellings = [f"{local}@Example.test", f"{local.lower()}@example.test", f"{local.upper()}@EXAMPLE.TEST",
                 f"{local}@example.TEST", f"{local.lower()}@Example.Test"]
    before = central.stats()
    for address in spellings:
        answer = central.post("/auth/send-magic-link", {"email": address})
        assert answer.status_code == 200, answer.text
    counted = sum(s2s_counts(central.stats(), "email"))
    sixth = central.post("/auth/send-magic-link", {"email": f"{local.lower()}@example.test"})
    assert_error(sixth, 429, RATE_LIMITED["message"])
    retry_after(sixth)
    assert sum(s2s_counts(central.stats(), "email")) == counted == sum(s2s_counts(before, "email")) + 5


def client_address():
    """A client address of one test's own (198.18.0.0/15, for benchmarks), said by the trusted proxy 127.0.0.1."""
    return f"198.18.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def send_magic_link(central, address, sender):
    return central.post("/auth/send-magic-link", {"email": address},
                        headers={"Content-Type": "application/json", "X-Forwarded-For": sender})


def test_sixteen_spellings_of_one_mailbox_from_one_address_reach_it_at_most_five_times(central):
    """Case, `+tag` and (for Gmail) dots and googlemail.com all reach one mailbox: they share its
    limit of five an hour, so sixteen spellings sent from one address give five e-mails, not sixteen."""
    local = f"victim{secrets.token_hex(4)}"
    dotted = ".".join(local[:3]) + "." + local[3:]
    spellings = [f"{local}+{n}@gmail.com" for n in range(1, 7)] + [
        f"{dotted}@gmail.com", f"{local.upper()}@GMAIL.COM", f"{local}@googlemail.com", f"{dotted}+x@googlemail.com",
        f"{local[:4]}.{local[4:]}@gmail.com", f"{local.capitalize()}+news@Gmail.com", f"{local[:1]}.{local[1:]}@gmail.com",
        f"{dotted.upper()}@GoogleMail.com", f"{local}+a+b@gmail.com", f"{local[:2]}.{local[2:]}+z@googlemail.com"]
    assert len(set(spellings)) == 16 and len({a.lower() for a in spellings}) == 16
    sender = client_address()
    before = central.stats()
    answers = [send_magic_link(central, address, sender) for address in spellings]
    after = central.stats()
    assert [a.status_code for a in answers] == [200] * 5 + [429] * 11, [a.status_code for a in answers]
    for refused in answers[5:]:
        assert refused.json() == RATE_LIMITED
        retry_after(refused)
    sent = [json.loads(entry["body"])["email"] for entry in s2s_since(before, after, "email")]
    assert sent == spellings[:5], sent  # what reached the provider: five sends, as the app spelled them


def test_one_client_address_is_limited_whatever_the_mailboxes(central):
    """`magic_link_address_limit` (20 an hour by default): one client address cannot spray links to many
    mailboxes; another address is not held back by it."""
    sender = client_address()
    before = central.stats()
    for index in range(20):
        answer = send_magic_link(central, f"spray{index}-{secrets.token_hex(4)}@example.test", sender)
        assert answer.status_code == 200, (index, answer.text)
    refused = send_magic_link(central, f"spray-last-{secrets.token_hex(4)}@example.test", sender)
    assert_error(refused, 429, RATE_LIMITED["message"])
    retry_after(refused)
    assert accepted(central.stats(), "email") - accepted(before, "email") == 20, "the 21st reached the provider"
    other = send_magic_link(central, f"spray-last-{secrets.token_hex(4)}@example.test", client_address())
    assert other.status_code == 200, other.text


def test_magic_link_end_to_end(central):
    address = f"magic-{secrets.token_hex(5)}@example.test"
    answer = central.post("/auth/send-magic-link", {"email": address, "platform": "mobile"})
    assert answer.status_code == 200, answer.text
    link = central.double.last_magic_link(address)
    assert link["platform"] == "mobile", link
    central.seen.add(link["token"], kind="central magic link token")
    clicked = requests.get(central.double.url + "/auth/email-callback", params={"token": link["token"]},
                           allow_redirects=False, timeout=10)
    assert clicked.status_code in (302, 303), clicked.text[:300]
    location = clicked.headers["Location"]
    assert location.startswith("tasquito://auth/callback?"), location.split("?")[0]
    code = query(location)["code"]
    central.seen.add(code, kind="central auth code")
    exchanged = central.exchange(code)
    assert exchanged.status_code == 200, exchanged.text
    user = exchanged.json()["user"]
    assert user["email"].lower() == address
    _, claims = verify(central.url, exchanged.json()["accessToken"])
    assert claims["data"]["email"].lower() == address


# --------------------------------------------------------------------------- Sign in with Apple

def apple_token(central, **claims):
    options = {key: claims.pop(key) for key in ("kid", "sign_with") if key in claims}
    token = central.double.apple_token(claims, **options)
    central.seen.add(token, kind="Apple identity token")
    return token


def apple_nonce():
    """(raw nonce, the token's `nonce` claim): as Apple documents it, the app asks with SHA-256 of a
    random raw nonce (lowercase hex), Apple writes that into the token, and the app sends the raw one."""
    raw = secrets.token_urlsafe(24)
    return raw, hashlib.sha256(raw.encode()).hexdigest()


def apple_claims(**overrides):
    now = int(time.time())
    claims = {"iss": APPLE_ISSUER, "aud": BUNDLE, "sub": f"001234.{secrets.token_hex(16)}.0123",
              "email": f"apple-{secrets.token_hex(5)}@privaterelay.appleid.com", "iat": now, "exp": now + 600}
    claims.update(overrides)
    return claims


def verify_apple(central, token, user, base=None, **extra):
    code = "c" + secrets.token_hex(24)
    central.seen.add(code, kind="Apple authorization code")
    return central.post("/auth/verify-apple", {"identityToken": token, "authorizationCode": code, "user": user, **extra}, base=base)


def test_sign_in_with_apple_gives_tokens_and_the_name_reaches_verify_native(central):
    raw, hashed = apple_nonce()
    claims = apple_claims(nonce=hashed)
    token = apple_token(central, **claims)
    before = central.stats()
    answer = verify_apple(central, token, claims["sub"], nonce=raw, fullName={"givenName": "Zoë", "familyName": "Ünal"})
    after = central.stats()
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"accessToken", "accessTokenExpiresAt", "refreshToken", "refreshTokenExpiresAt", "user"}, sorted(body)
    assert body["user"]["email"] == claims["email"] and body["user"]["name"] == "Zoë Ünal" and body["user"]["provider"] == "apple"
    assert accepted(after, "verify-native") - accepted(before, "verify-native") == 1
    native = json.loads(s2s_log(after, "verify-native")[-1]["body"])
    assert native == {"app": APP, "email": claims["email"], "name": "Zoë Ünal", "provider": "apple"}, native
    _, jwt_claims = verify(central.url, body["accessToken"])
    assert jwt_claims["data"]["provider"] == "apple" and jwt_claims["data"]["email"] == claims["email"]
    # Without fullName (Apple gives it on the first sign-in only); Apple's JWKS is not fetched again (cached).
    fetches = central.stats()["apple_keys_fetches"]
    assert fetches >= 1
    raw2, hashed2 = apple_nonce()
    again = verify_apple(central, apple_token(central, **apple_claims(sub=claims["sub"], email=claims["email"], nonce=hashed2)),
                         claims["sub"], nonce=raw2)
    assert again.status_code == 200, again.text
    assert again.json()["user"]["userId"] == body["user"]["userId"]
    assert central.stats()["apple_keys_fetches"] == fetches, "Apple's JWKS was fetched for every sign-in"
    # The same identity token a second time (replayed or captured): refused, and no new session.
    before = central.stats()
    replayed = verify_apple(central, token, claims["sub"], nonce=raw)
    assert replayed.status_code == 401 and replayed.json()["details"] == ["replay: this identity token was already used"], replayed.text
    assert accepted(central.stats(), "verify-native") == accepted(before, "verify-native")


def _apple_negative(central, case):
    """(identity token, body extras, user) for one negative case: each one wrong in that respect only
    (the right raw nonce is sent unless the case is about the nonce)."""
    raw, hashed = apple_nonce()
    claims = apple_claims(nonce=hashed)
    user = claims["sub"]
    extra = {"nonce": raw}
    if case == "expired":
        token = apple_token(central, **apple_claims(sub=user, nonce=hashed, iat=int(time.time()) - 7200, exp=int(time.time()) - 3600))
    elif case == "wrong aud":
        token = apple_token(central, **apple_claims(sub=user, nonce=hashed, aud="com.example.someone-else"))
    elif case == "wrong iss":
        token = apple_token(central, **apple_claims(sub=user, nonce=hashed, iss="https://appleid.apple.com.evil.example"))
    elif case == "bad signature":
        token = tamper(apple_token(central, **claims))
    elif case == "unknown kid":
        token = apple_token(central, **claims, kid="unknown-" + secrets.token_hex(4), sign_with="unknown")
    elif case == "nonce sent, none in the token":
        token = apple_token(central, **{**claims, "nonce": None})  # null: left out of the token
    elif case == "wrong nonce":
        token, extra = apple_token(central, **claims), {"nonce": apple_nonce()[0]}
    elif case == "no nonce sent":
        token, extra = apple_token(central, **claims), {}
    elif case == "the claim sent instead of the raw nonce":
        token, extra = apple_token(central, **claims), {"nonce": hashed}
    elif case == "sub is not the user":
        token, user = apple_token(central, **claims), f"001234.{secrets.token_hex(16)}.0123"
    elif case == "no email":
        token = apple_token(central, **{**claims, "email": None})  # null: left out of the token
    elif case == "alg none":
        token = resign(apple_token(central, **claims), "none")
    elif case == "HS256 keyed with the public key":
        good = apple_token(central, **claims)
        kid = jwt.get_unverified_header(good)["kid"]
        keys = requests.get(central.double.url + "/apple/auth/keys", timeout=10).json()["keys"]
        public = jwt.PyJWK([k for k in keys if k["kid"] == kid][0]).key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        token = resign(good, "HS256", public)
    else:
        raise AssertionError(case)
    return token, extra, user


@pytest.mark.parametrize("case", ["expired", "wrong aud", "wrong iss", "bad signature", "unknown kid",
                                  "nonce sent, none in the token", "wrong nonce", "no nonce sent",
                                  "the claim sent instead of the raw nonce", "sub is not the user", "no email",
                                  "alg none", "HS256 keyed with the public key"])
def test_an_apple_identity_token_failing_a_check_is_401_and_never_reaches_verify_native(central, case):
    token, extra, user = _apple_negative(central, case)
    before = central.stats()
    answer = verify_apple(central, token, user, **extra)
    after = central.stats()
    body = assert_error(answer, 401, "Invalid Apple identity token")
    assert isinstance(body.get("details"), list) and body["details"], body
    if "nonce" in case:
        assert body["details"][0].startswith("nonce: "), body
    assert sum(s2s_counts(after, "verify-native")) == sum(s2s_counts(before, "verify-native")), "verify-native was called"


def signed_in_with_apple(central, base):
    """(identity token, raw nonce, user) of a first, accepted Sign in with Apple on `base`."""
    raw, hashed = apple_nonce()
    claims = apple_claims(nonce=hashed)
    token = apple_token(central, **claims)
    answer = central.post("/auth/verify-apple", {"identityToken": token, "authorizationCode": "c" + secrets.token_hex(24),
                                                 "user": claims["sub"], "nonce": raw}, base=base)
    assert answer.status_code == 200, answer.text
    return token, raw, claims["sub"]


def assert_replay_refused(central, base, token, raw, user):
    before = central.stats()
    replayed = central.post("/auth/verify-apple", {"identityToken": token, "authorizationCode": "c" + secrets.token_hex(24),
                                                   "user": user, "nonce": raw}, base=base)
    body = assert_error(replayed, 401, "Invalid Apple identity token")
    assert body["details"] == ["replay: this identity token was already used"], body
    assert sum(s2s_counts(central.stats(), "verify-native")) == sum(s2s_counts(before, "verify-native")), "a replay reached verify-native"


def test_an_apple_identity_token_replayed_after_a_restart_is_refused(central, workdir, seen):
    """The used identity tokens are in the store (until each token's exp), not in the process: a
    Gatehouse stopped and started again on the same SQLite file still refuses a replay."""
    port = free_port()
    keys = session_keys(workdir, "central-apple-restart-session-keys", seen)
    config = single_app_config(port, workdir / "central-apple-restart.sqlite", keys, central.double, central.backend, apple=True)
    with own_gatehouse(workdir, "central-apple-restart-1", config) as gatehouse:
        token, raw, user = signed_in_with_apple(central, gatehouse["url"])
    with own_gatehouse(workdir, "central-apple-restart-2", config) as gatehouse:
        assert_replay_refused(central, gatehouse["url"], token, raw, user)
        # A new token of the same person is still welcome after the restart.
        signed_in_with_apple(central, gatehouse["url"])


def test_an_apple_identity_token_used_on_one_instance_is_refused_by_another(central, workdir, seen):
    """Two Gatehouses on one PostgreSQL database: the token taken by the first is a replay to the second."""
    if "GATEHOUSE_TEST_POSTGRES" not in os.environ:
        pytest.skip("needs GATEHOUSE_TEST_POSTGRES (scripts/test starts PostgreSQL)")
    host, pg_port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    database = "central_" + secrets.token_hex(4)
    subprocess.run(["psql", "-h", host, "-p", pg_port, "-U", "gatehouse", "-d", "gatehouse", "-tAc", f"CREATE DATABASE {database}"],
                   capture_output=True, check=True, timeout=30)
    keys = session_keys(workdir, "central-apple-pg-session-keys", seen)

    def config(port):
        text = single_app_config(port, workdir / "unused.sqlite", keys, central.double, central.backend, apple=True)
        return text.replace(f"store:\n  sqlite_path: {workdir / 'unused.sqlite'}",
                            f"store:\n  postgres: {{host: {host}, port: {pg_port}, database: {database}, username: gatehouse}}")

    first_config, second_config = config(free_port()), config(free_port())
    assert "postgres:" in first_config and "sqlite_path" not in first_config
    with own_gatehouse(workdir, "central-apple-pg-1", first_config) as first, \
            own_gatehouse(workdir, "central-apple-pg-2", second_config) as second:
        token, raw, user = signed_in_with_apple(central, first["url"])
        assert_replay_refused(central, second["url"], token, raw, user)
        assert_replay_refused(central, first["url"], token, raw, user)


def test_a_missing_nonce_is_accepted_only_where_the_app_does_not_require_one(central, workdir, seen):
    """`apple.require_nonce: false` lets an app that sends no nonce sign in; a nonce it does send is
    still checked against the token's claim (SHA-256 of the raw nonce)."""
    port = free_port()
    keys = session_keys(workdir, "central-apple-optional-session-keys", seen)
    config = server_section(port, workdir / "central-apple-optional.sqlite") + f"""
upstreams:{central_upstream(APP, APP, "app-private.pem", central.double.api_base, central.double.web_base, "/auth",
                             apple_jwks=central.double.apple_jwks_url, require_nonce=False)}
clients:{central_client(APP)}
sessions:
  encryption_keys_file: {keys}
"""
    with own_gatehouse(workdir, "central-apple-optional", config) as gatehouse:
        claims = apple_claims()
        answer = verify_apple(central, apple_token(central, **claims), claims["sub"], base=gatehouse["url"])
        assert answer.status_code == 200, answer.text
        raw, hashed = apple_nonce()
        claims = apple_claims(nonce=hashed)
        wrong = verify_apple(central, apple_token(central, **claims), claims["sub"], nonce=hashed, base=gatehouse["url"])
        assert assert_error(wrong, 401)["details"][0].startswith("nonce: "), wrong.text


# --------------------------------------------------------------------------- strict validation

VALID_BODIES = {
    "exchange": {"code": "a" * 40},
    "refresh": {"refreshToken": "a" * 128},
    "send-magic-link": {"email": "valid@example.test"},
    "verify-apple": {"identityToken": "x.y.z", "authorizationCode": "abc", "user": "001234.abc"},
}
MAIN_FIELD = {"exchange": "code", "refresh": "refreshToken", "send-magic-link": "email", "verify-apple": "user"}
OVERSIZE = {"exchange": {"code": "a" * 1025}, "refresh": {"refreshToken": "a" * 1025},
            "send-magic-link": {"email": "a" * 250 + "@example.test"}}


def invalid_request(endpoint, case):
    """(body bytes, content type, expected status, field the details must name or None)."""
    valid, field = VALID_BODIES[endpoint], MAIN_FIELD[endpoint]
    if case == "not JSON":
        return b'{"' + field.encode() + b'": ', "application/json", 400, None
    if case == "wrong content type":
        return json.dumps(valid).encode(), "text/plain", 415, None
    if case == "form encoded":
        return f"{field}=x".encode(), "application/x-www-form-urlencoded", 415, None
    if case == "JSON array":
        return json.dumps([valid]).encode(), "application/json", 400, None
    if case == "unknown field":
        return json.dumps({**valid, "surprise": "x"}).encode(), "application/json", 400, "surprise"
    if case == "wrong type":
        return json.dumps({**valid, field: 12345}).encode(), "application/json", 400, field
    if case == "missing field":
        return json.dumps({k: v for k, v in valid.items() if k != field}).encode(), "application/json", 400, field
    if case == "oversize value":
        return json.dumps(OVERSIZE[endpoint]).encode(), "application/json", 400, field
    if case == "body over the server limit":
        return json.dumps({**valid, field: "a" * (MAX_BODY + 100)}).encode(), "application/json", 413, None
    raise AssertionError(case)


MALFORMED = ["not JSON", "wrong content type", "form encoded", "JSON array", "unknown field", "wrong type", "missing field",
             "oversize value", "body over the server limit"]


@pytest.mark.parametrize("endpoint, case", [(endpoint, case) for endpoint in VALID_BODIES for case in MALFORMED
                                            if case != "oversize value" or endpoint in OVERSIZE])
def test_app_endpoints_refuse_malformed_requests_precisely(central, endpoint, case):
    body, content_type, status, field = invalid_request(endpoint, case)
    before = s2s_total(central.stats())
    answer = requests.post(f"{central.url}/auth/{endpoint}", data=body, headers={"Content-Type": content_type}, timeout=30)
    error = assert_error(answer, status)
    if field is not None:
        assert any(field in detail for detail in error["details"]), error
    assert s2s_total(central.stats()) == before, "the central provider was asked"


def test_app_endpoint_extra_checks(central):
    """Values of the right type that the contract still refuses."""
    before = s2s_total(central.stats())
    for path, body, field in [
        ("/auth/exchange", {"code": ""}, "code"),
        ("/auth/send-magic-link", {"email": "not-an-address"}, "email"),
        ("/auth/send-magic-link", {"email": "valid@example.test", "platform": "desktop"}, "platform"),
        ("/auth/verify-apple", {**VALID_BODIES["verify-apple"], "fullName": "Zoë Ünal"}, "fullName"),
        ("/auth/exchange", {"code": None}, "code"),
    ]:
        answer = central.post(path, body)
        error = assert_error(answer, 400)
        assert any(field in detail for detail in error["details"]), (path, body, error)
    assert s2s_total(central.stats()) == before
    assert requests.get(central.url + "/auth/exchange", timeout=10).status_code in (404, 405)


# --------------------------------------------------------------------------- the standard face

def begin_standard_sign_in(central):
    """/oauth/authorize for the central app, then the double's /auth: (app, cookie, Gatehouse callback URL)."""
    app = App({"url": central.url}, central.seen, client_id=CLIENT, redirect_uri=REDIRECT)
    started = requests.get(app.authorize_url(scope=None), allow_redirects=False, timeout=10)
    assert started.status_code == 302, started.text[:300]
    toward = started.headers["Location"]
    assert toward.startswith(central.double.url + "/auth?"), toward
    asked = query(toward)
    assert asked.get("app") == APP and asked.get("provider") == "google", asked
    set_cookie = started.headers.get("Set-Cookie", "")
    match = re.search(r"__Secure-gatehouse-signin=([^;]+)", set_cookie)
    assert match, f"no sign-in cookie: {set_cookie.split('=')[0]}"
    attributes = {part.strip().split("=")[0].lower(): part.strip().lower() for part in set_cookie.split(";")[1:]}
    assert "secure" in attributes and "httponly" in attributes, attributes
    assert attributes.get("path") == "path=/app/auth/callback" and attributes.get("samesite") == "samesite=lax", attributes
    assert attributes.get("max-age") == "max-age=600", attributes
    cookie = match.group(1)
    central.seen.add(cookie, kind="central sign-in cookie (Gatehouse state)")
    back = requests.get(toward, allow_redirects=False, timeout=10)
    assert back.status_code in (302, 303), back.text[:300]
    callback = back.headers["Location"]
    assert callback.startswith(central.url + "/app/auth/callback?"), callback.split("?")[0]
    central.seen.add(query(callback).get("code"), kind="central auth code")
    return app, cookie, callback


def finish(callback, cookie=None):
    headers = {"Accept": "text/html"}
    if cookie is not None:
        headers["Cookie"] = f"__Secure-gatehouse-signin={cookie}"  # requests keeps Secure cookies off http
    return requests.get(callback, headers=headers, allow_redirects=False, timeout=30)


def test_standard_face_authorize_callback_token_and_refresh(central):
    app, cookie, callback = begin_standard_sign_in(central)
    before = central.stats()
    done = finish(callback, cookie)
    assert done.status_code == 302, done.text[:300]
    assert accepted(central.stats(), "verify") == accepted(before, "verify") + 1
    location = done.headers["Location"]
    assert location.startswith(REDIRECT + "?"), location.split("?")[0]
    received = query(location)
    central.seen.add(received.get("code"), kind="Gatehouse code")
    assert received.get("state") == app.state and received.get("iss") == central.url and received.get("code"), sorted(received)
    cleared = done.headers.get("Set-Cookie", "")
    assert "__Secure-gatehouse-signin=" in cleared and re.search(r"max-age=0|expires=thu, 01 jan 1970", cleared, re.I), \
        "the sign-in cookie was not cleared"
    tokens = app.redeem(received["code"])
    assert tokens.status_code == 200, tokens.text
    pair = tokens.json()
    central.remember(tokens)
    assert pair["token_type"] == "Bearer" and abs(pair["expires_in"] - ACCESS_LIFETIME) <= 5, {k: pair[k] for k in ("token_type", "expires_in")}
    assert REFRESH_TOKEN.fullmatch(pair["refresh_token"])
    _, claims = verify(central.url, pair["access_token"])
    assert claims["iss"] == APP and claims["data"]["provider"] == "google"
    relayed = central.relay(pair["access_token"])
    assert relayed.status_code == 200 and relayed.json()["headers"]["x-user-id"] == claims["sub"], relayed.text
    renewed = app.refresh(pair["refresh_token"])
    assert renewed.status_code == 200, renewed.text
    central.remember(renewed)
    assert renewed.json()["refresh_token"] != pair["refresh_token"] and REFRESH_TOKEN.fullmatch(renewed.json()["refresh_token"])
    verify(central.url, renewed.json()["access_token"])
    # The code is single use, and so is the cookie.
    assert app.redeem(received["code"]).status_code == 400
    _, _, second_callback = begin_standard_sign_in(central)
    before = central.stats()
    reused = finish(second_callback, cookie)
    assert reused.status_code >= 400 and "Location" not in reused.headers, (reused.status_code, reused.headers.get("Location"))
    assert accepted(central.stats(), "verify") == accepted(before, "verify"), "a used cookie got the code verified"


def test_revoking_a_central_refresh_token_ends_its_session(central):
    """RFC 7009 on a central app's refresh token: its session ends, so the token (and any other of
    the family) no longer refreshes; another app cannot revoke it."""
    app, cookie, callback = begin_standard_sign_in(central)
    done = finish(callback, cookie)
    received = query(done.headers["Location"])
    central.seen.add(received.get("code"), kind="Gatehouse code")
    tokens = app.redeem(received["code"])
    assert tokens.status_code == 200, tokens.text
    central.remember(tokens)
    refresh_token = tokens.json()["refresh_token"]
    revoke = central.url + "/oauth/revoke"
    other = requests.post(revoke, data={"token": refresh_token, "client_id": "com.example.app"}, timeout=10)
    assert other.status_code in (200, 401), other.status_code
    still = app.refresh(refresh_token)
    assert still.status_code == 200, "another client's revocation ended the session"
    central.remember(still)
    current = still.json()["refresh_token"]
    revoked = requests.post(revoke, data={"token": current, "client_id": CLIENT}, timeout=10)
    assert revoked.status_code == 200, revoked.text
    after = app.refresh(current)
    assert after.status_code == 400 and after.json()["error"] == "invalid_grant", after.text


def test_standard_face_callback_without_the_cookie_is_an_error_page(central):
    app, cookie, callback = begin_standard_sign_in(central)
    before = central.stats()
    for attempt in (finish(callback), finish(callback, "x" + cookie[1:]), finish(callback, secrets.token_urlsafe(32))):
        assert attempt.status_code >= 400 and attempt.status_code != 500, attempt.status_code
        assert "Location" not in attempt.headers, attempt.headers.get("Location")
        assert attempt.headers.get("Content-Type", "").startswith("text/html"), attempt.headers.get("Content-Type")
    assert s2s_total(central.stats()) == s2s_total(before), "the code was sent to the central provider without the cookie"
    # The real cookie still works afterwards: the refusals did not use the transaction up.
    done = finish(callback, cookie)
    assert done.status_code == 302 and done.headers["Location"].startswith(REDIRECT + "?"), done.status_code
    central.seen.add(query(done.headers["Location"]).get("code"), kind="Gatehouse code")


# --------------------------------------------------------------------------- the relay

def test_the_relay_sets_identity_headers_from_the_minted_jwt(central, relay_path):
    body, person = central.signed_in()
    token = body["accessToken"]
    if relay_path == "fast":
        warm = central.relay(token, "/api/central/warm")
        assert warm.status_code == 200, warm.text
    answer = central.relay(token, "/api/central/profile?x=1")
    assert answer.status_code == 200, answer.text
    assert served_by(central.gatehouse, answer) == relay_path
    headers = answer.json()["headers"]
    assert headers["x-user-id"] == body["user"]["userId"]
    assert headers["x-user-email"] == person["email"]
    assert headers["x-user-provider"] == "google"
    assert answer.json()["path"] == "/central/profile?x=1"


def _bad_relay_token(central, case):
    now = int(time.time())
    data = {"userId": "u-" + secrets.token_hex(8), "email": "mallory@example.test", "name": "Mallory", "provider": "google"}
    claims = {"data": data, "sub": data["userId"], "iss": APP, "aud": APP, "iat": now, "exp": now + 300}
    if case == "expired":
        return forge({**claims, "iat": now - 7200, "exp": now - 3600})
    if case == "signed by an unconfigured key":
        return forge(claims, key="jwt-b.pem")
    if case == "signed by an unconfigured key under the configured kid":
        return forge(claims, key="jwt-b.pem", kid=KID_A)
    if case == "another issuer (forged)":
        return forge({**claims, "iss": "someone-else"})
    if case == "another audience (right key and issuer)":
        return forge({**claims, "aud": "someone-else"})
    if case == "another app's token (same key, its own issuer)":
        return central.signed_in(path="/other/auth", app=OTHER_APP)[0]["accessToken"]
    if case == "alg none":
        return forge(claims, alg="none", kid=KID_A)
    if case == "HS256 keyed with the public key":
        return forge(claims, alg="HS256", kid=KID_A)
    if case == "tampered claims":
        good = central.signed_in()[0]["accessToken"]
        head, _, signature = good.split(".")
        return f"{head}.{b64url(json.dumps({**claims_of(good), 'sub': 'someone-else'}).encode())}.{signature}"
    if case == "a refresh token":
        return central.signed_in()[0]["refreshToken"]
    if case == "garbage":
        return "not-a-jwt." + secrets.token_urlsafe(24)
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["expired", "signed by an unconfigured key", "signed by an unconfigured key under the configured kid",
                                  "another issuer (forged)", "another audience (right key and issuer)", "another app's token (same key, its own issuer)", "alg none",
                                  "HS256 keyed with the public key", "tampered claims", "a refresh token", "garbage"])
def test_the_relay_refuses_bad_tokens_before_the_backend(central, relay_path, case):
    if relay_path == "fast":  # the upstream's identities are cached and the fast path live
        good = central.signed_in()[0]["accessToken"]
        assert central.relay(good).status_code == 200
        warm = central.relay(good)
        assert warm.status_code == 200 and served_by(central.gatehouse, warm) == "fast"
    calls = central.backend.calls
    # Two different tokens of the kind (the second cannot be answered from a cached refusal of the first),
    # then the second again.
    tokens = [_bad_relay_token(central, case) for _ in range(2)]
    for token in tokens + tokens[-1:]:
        answer = central.relay(token)
        assert answer.status_code == 401, f"{case}: {answer.status_code} {answer.text[:200]}"
    assert central.backend.calls == calls, "the backend saw a request"


def test_a_token_expiring_while_its_identity_is_cached_is_refused(central):
    """The relay's identity cache (and with it the fast path) lives no longer than the JWT's `exp`."""
    now = time.time()
    data = {"userId": "u-" + secrets.token_hex(8), "email": "brief@example.test", "name": "Brief", "provider": "google"}
    exp = int(now) + 2
    token = forge({"data": data, "sub": data["userId"], "iss": APP, "aud": APP, "iat": int(now), "exp": exp})
    first, second = central.relay(token), central.relay(token)
    assert first.status_code == 200 and second.status_code == 200, (first.status_code, second.status_code)
    assert served_by(central.gatehouse, second) == "fast"
    assert second.json()["headers"]["x-user-id"] == data["userId"]
    wait_until(lambda: time.time() > exp + 0.2, 5, "the token's exp passed")
    calls = central.backend.calls
    for _ in range(2):
        answer = central.relay(token)
        assert answer.status_code == 401, f"expired {time.time() - exp:.1f}s ago: {answer.status_code}"
    assert central.backend.calls == calls


# --------------------------------------------------------------------------- failures of the central provider

def test_the_s2s_request_carries_the_five_headers_and_a_signature_the_provider_verifies(central):
    code, _ = central.mint()
    before = central.stats()
    sent_at = time.time() * 1000
    assert central.exchange(code).status_code == 200
    new = s2s_since(before, central.stats())
    assert len(new) == 1, new
    last = new[0]
    # x-ba-app, x-ba-request-timestamp and x-ba-signature: "accepted" means the double's verifier found all
    # three and the signature right; x-amz-content-sha256 and Content-Type are recorded as received.
    assert last["urlPath"] == "/api/v1/auth/verify" and last["outcome"] == "accepted", last
    assert last["app"] == APP
    assert re.fullmatch(r"\d{13}", last["timestamp"]) and abs(int(last["timestamp"]) - sent_at) < 5000, last["timestamp"]
    assert last["contentType"].split(";")[0].strip() == "application/json", last["contentType"]
    assert last["contentSha256Header"] == hashlib.sha256(last["body"].encode()).hexdigest()


def test_every_s2s_call_signs_the_path_it_is_sent_to(central):
    """api_base is the provider's /api: each of the three S2S calls arrives on its real route
    /api/v1/auth/… and the double verifies the signature against that arrival path (as the published
    verifier checks against the route it registered), so each is accepted."""
    code, _ = central.mint()
    raw, hashed = apple_nonce()
    claims = apple_claims(nonce=hashed)
    before = central.stats()
    assert central.exchange(code).status_code == 200
    assert central.post("/auth/send-magic-link", {"email": f"path-{secrets.token_hex(5)}@example.test"},
                        headers={"Content-Type": "application/json", "X-Forwarded-For": client_address()}).status_code == 200
    assert verify_apple(central, apple_token(central, **claims), claims["sub"], nonce=raw).status_code == 200
    new = s2s_since(before, central.stats())
    assert [(e["urlPath"], e["outcome"]) for e in new] == [
        ("/api/v1/auth/verify", "accepted"), ("/api/v1/auth/email", "accepted"), ("/api/v1/auth/verify-native", "accepted")], new


def gatehouse_log(central):
    return (central.workdir / "central-gatehouse.log").read_text(errors="replace")


def log_since(central, offset, marker, what):
    """The log lines written after `offset` (a length of the log), once `marker` is among them."""
    wait_until(lambda: marker in gatehouse_log(central)[offset:], 5, what)
    return gatehouse_log(central)[offset:]


def test_an_api_base_without_the_providers_api_prefix_is_502_not_an_unknown_code(central):
    """`api_base` without /api reaches no route of the provider (Hono's text 404, not the provider's
    JSON error): Gatehouse answers 502 and says what to check in its log, never to the app; the
    magic-link call fails the same way (a wrong api_base fails every call)."""
    code, _ = central.mint()
    before, offset = central.stats(), len(gatehouse_log(central))
    answer = central.exchange(code, path="/noprefix/auth")
    body = assert_error(answer, 502)
    assert "api_base" not in json.dumps(body), body
    mail = central.post("/noprefix/auth/send-magic-link", {"email": "someone@example.test"})
    assert_error(mail, 502)
    assert s2s_since(before, central.stats()) == [], "a request without /api reached an S2S route"
    lines = log_since(central, offset, "/v1/auth/email", "the api_base hint of the magic link in the log")
    assert lines.count("check api_base") >= 2, lines


SPENT_CODES = ["replayed", "expired", "unknown", "other app's", "duplicate members"]


@pytest.mark.parametrize("case", SPENT_CODES)
def test_a_spent_or_unknown_code_is_the_providers_404_not_a_502(central, case):
    """verify.ts answers an unknown, expired, used or other app's code with 404 {"status":404,
    "message":"Auth code not found"} (its HttpError as api-router.ts writes it). The app gets the seed's
    404 with that body, exactly; Gatehouse's log has no api_base hint (the route is there: the
    provider answered its own JSON)."""
    code, _ = central.mint()
    if case == "replayed":
        assert central.exchange(code).status_code == 200
    elif case == "expired":
        central.double.control("age", what="codes", seconds=61)
    elif case == "unknown":
        code = secrets.token_urlsafe(32)
    elif case == "other app's":
        code, _ = central.mint(app=OTHER_APP)
    before, offset = central.stats(), len(gatehouse_log(central))
    codes = {code}
    if case == "duplicate members":  # one code spent, the other unknown: whichever member is read, not found
        assert central.exchange(code).status_code == 200
        before = central.stats()
        unknown = secrets.token_urlsafe(32)
        codes.add(unknown)
        answer = central.post("/auth/exchange", b'{"code":"' + unknown.encode() + b'","code":"' + code.encode() + b'"}')
    else:
        answer = central.exchange(code)
    assert_error(answer, 404, CODE_NOT_FOUND["message"])
    assert answer.json() == CODE_NOT_FOUND
    sent = s2s_since(before, central.stats())
    assert [(e["endpoint"], e["outcome"], e.get("status"), e.get("message")) for e in sent] == [
        ("verify", "accepted", 404, "Auth code not found")], sent
    body = json.loads(sent[0]["body"])
    assert body["app"] == APP and body["code"] in codes and set(body) == {"app", "code"}, body
    lines = log_since(central, offset, "central api request refused", "the refusal in the log")
    assert "check api_base" not in lines, lines


def test_a_spent_code_on_the_standard_face_is_a_refused_sign_in_not_a_bad_gateway(central):
    """The provider's 404 for a code at Gatehouse's callback (a replayed return): the app is told the
    code was not accepted (the description says so), not that the provider answered HTTP 404."""
    app, cookie, callback = begin_standard_sign_in(central)
    code = query(callback)["code"]
    central.seen.add(code, kind="central auth code")
    assert central.exchange(code).status_code == 200  # spent before the browser comes back
    before = central.stats()
    done = finish(callback, cookie)
    assert done.status_code == 302, done.text[:300]
    received = query(done.headers["Location"])
    assert received.get("state") == app.state and "code" not in received, sorted(received)
    assert received.get("error") == "server_error", received
    assert "does not know the code" in received.get("error_description", ""), received
    assert "404" not in received["error_description"] and "api_base" not in received["error_description"], received
    assert [(e["outcome"], e.get("status")) for e in s2s_since(before, central.stats())] == [("accepted", 404)]


@pytest.mark.parametrize("kind, hint", [("403", "s2s_private_key_file"), ("400", "Validation Error")])
def test_the_providers_other_refusals_of_a_code_are_502_with_the_reason_in_the_log(central, kind, hint):
    """verify.ts's other answers: 403 "Auth code could not be verified" (the code's RSA envelope did
    not open: Gatehouse's key) and api-router.ts's 400 "Validation Error": not the app's doing, so
    502 to the app with nothing of the provider's words, the reason in the log, no api_base hint."""
    code, _ = central.mint()
    central.double.fault("verify", kind, times=1)
    before, offset = central.stats(), len(gatehouse_log(central))
    try:
        answer = central.exchange(code)
    finally:
        central.double.fault("verify", "none")
    assert_error(answer, 502, "Bad Gateway")
    assert [(e["outcome"], e.get("fault")) for e in s2s_since(before, central.stats())] == [("fault", kind)]
    lines = log_since(central, offset, "central api request failed", "the failure in the log")
    assert hint in lines and "check api_base" not in lines, lines


@pytest.mark.parametrize("kind, status", [("down", 503), ("garbage", 502), ("500", None)])
def test_a_failing_central_provider_is_502_or_503_never_500(central, kind, status):
    code, _ = central.mint()
    central.double.fault("verify", kind)
    before = central.stats()
    try:
        answer = central.exchange(code)
    finally:
        central.double.fault("verify", "none")
    new = s2s_since(before, central.stats())
    assert new and all(e["outcome"] == "fault" for e in new), [(e["outcome"], e.get("message")) for e in new]
    if status is None:
        assert answer.status_code in (502, 503), answer.status_code
        status = answer.status_code
    assert_error(answer, status)
    if status == 503:
        retry_after(answer)


@pytest.mark.parametrize("path, status", [("/gone/auth", 503), ("/silent/auth", 504)],
                         ids=["port closed", "never answers (timeout 1s)"])
def test_an_unreachable_or_silent_central_provider_is_503_or_504(central, path, status):
    """An unreachable provider is 503 with Retry-After; one that never answers is 504 once the
    upstream's timeout has passed (as /oauth/token answers a silent upstream), never a hang or a 500."""
    started = time.monotonic()
    answer = central.exchange(secrets.token_urlsafe(24), path=path)
    assert_error(answer, status)
    if status == 503:
        retry_after(answer)
    assert time.monotonic() - started < 10, f"{path}: {time.monotonic() - started:.1f}s"


def test_a_signature_the_central_provider_refuses_is_502(central):
    code, _ = central.mint(app="mismatch")
    before = central.stats()
    answer = central.exchange(code, path="/mismatch/auth")
    assert_error(answer, 502)
    new = s2s_since(before, central.stats())
    assert [(e["outcome"], e.get("message")) for e in new] == [("refused", "Invalid signature")], new


# --------------------------------------------------------------------------- secrets

def test_no_central_secret_in_gatehouses_logs_or_stores(central, workdir, seen):
    """Every refresh token, code, magic-link token, Apple token and key PEM line this module saw, in any
    form, in none of its Gatehouses' logs (debug level) nor stores. (test_zz scans them again.)"""
    seen.harvest()
    kinds = set(seen.kinds.values())
    for kind in ("central refresh token", "central auth code", "central fixture private key (PEM line)"):
        assert kind in kinds, f"this module recorded no {kind}"
    logs = sorted(workdir.glob("central-*.log"))
    assert any(path.name == "central-gatehouse.log" for path in logs), [p.name for p in logs]
    assert "gatehouse is ready" in (workdir / "central-gatehouse.log").read_text()
    leaks = [f"{path.name}: {kind} ({form})" for path in logs for kind, form in seen.find(path.read_bytes())]
    assert leaks == []
    stores = sorted(workdir.glob("central-*.sqlite"))
    assert stores
    assert [leak for store in stores for leak in seen.find_in_sqlite(store)] == []


# --------------------------------------------------------------------------- the double itself

def test_the_central_double_behaves_as_the_published_verifier():
    """The double's own self-check (no Gatehouse): requests signed by Node's crypto and the committed
    vectors accepted, every tampered one refused, and make-vectors.mjs reproducing the fixtures."""
    answer = subprocess.run([sys.executable, str(ROOT / "sandbox/check_central.py")],
                            capture_output=True, text=True, timeout=300)
    assert answer.returncode == 0, answer.stdout[-2000:] + answer.stderr[-4000:]
    assert re.search(r"^\d+ checks passed, 0 failed$", answer.stdout, re.M), answer.stdout
