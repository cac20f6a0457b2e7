"""Self-check of the central-provider double, with no Gatehouse: exits non-zero on the first failure.

    python3 sandbox/check_central.py        (or .venv/bin/python …)

- The committed vectors (Tests/Fixtures/central/s2s-vectors.json) reproduce: make-vectors.mjs, run
  again in a scratch copy, writes a byte-identical file (PKCS#1 v1.5 type 1 is deterministic); the
  double's Python canonical JSON, hashes and signer give the vectors' values.
- Requests signed by Node (`node -e`, crypto.privateEncrypt, as the published signer) and the
  vectors' own headers are accepted; each bad one is refused with the published message, and the
  reason lands in stats: wrong key, altered body, altered path, old timestamp, a missing header (each
  of the three), unknown app, wrong or missing content hash, DigestInfo-style and badly padded
  signatures, padded base64.
- Codes: single use, bound to their app, 60 s (aged with the "age" knob, never slept on).
- Magic links: 15 min, single use, 5 sends per address per hour (the 6th is 429).
- /auth, /auth/email-callback redirects; verify-native get-or-create; validation errors; the Apple
  JWKS stand-in and its tokens; every fault kind; the secrets record.
"""

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the sandbox package

from sandbox import central as cd  # noqa: E402

FIXTURES = cd.FIXTURES
APP, OTHER = "tasquito", "otherapp"
APP_KEY, OTHER_KEY = FIXTURES / "app-private.pem", FIXTURES / "other-private.pem"
WEB = "http://127.0.0.1:9"  # never contacted: redirects only
CHECKS = []

NODE_SIGNER = r"""
const { createHash, privateEncrypt } = require("node:crypto");
const { readFileSync } = require("node:fs");
const sha256 = (text) => createHash("sha256").update(text).digest("hex");
const requests = JSON.parse(readFileSync(0, "utf8"));
const out = requests.map((r) => {
  const body = r.body;
  const timestamp = r.timestamp ?? String(Date.now());
  const payload = { appId: r.appId, path: r.path, timestamp };
  if (body !== undefined) payload.body = body;
  const sorted = JSON.stringify(payload, Object.keys(payload).sort());
  const signature = privateEncrypt(readFileSync(r.keyFile, "utf8"), Buffer.from(sha256(sorted), "utf8")).toString("base64url");
  return { "Content-Type": "application/json", "x-amz-content-sha256": sha256(body), "x-ba-request-timestamp": timestamp,
           "x-ba-app": r.appId, "x-ba-signature": signature };
});
process.stdout.write(JSON.stringify(out));
"""


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    CHECKS.append(what)


def node_sign(*items):
    """Headers from Node for each (app_id, path, body[, key_file[, timestamp]])."""
    requests_ = []
    for item in items:
        app_id, path, body = item[:3]
        key_file = item[3] if len(item) > 3 and item[3] else APP_KEY
        entry = {"appId": app_id, "path": path, "body": body, "keyFile": str(key_file)}
        if len(item) > 4:
            entry["timestamp"] = item[4]
        requests_.append(entry)
    result = subprocess.run(["node", "-e", NODE_SIGNER], input=json.dumps(requests_).encode(),
                            capture_output=True, check=True, timeout=30)
    return json.loads(result.stdout)


def body_of(**fields):
    """JSON.stringify of an object literal (key order as given; JS escaping)."""
    return "{" + ",".join(f"{cd.js_json_string(k)}:{cd.js_json_string(v)}" for k, v in fields.items()) + "}"


def post(double, path, body, headers):
    return requests.post(f"{double.url}{path}", data=body.encode() if isinstance(body, str) else body,
                         headers=headers, timeout=10, allow_redirects=False)


def s2s(double, path, body, key_file=None, app_id=APP, **extra):
    headers = node_sign((app_id, path, body, key_file))[0]
    return post(double, path, body, headers, **extra)


def expect(response, status, message=None, what=""):
    check(response.status_code == status, f"{what}: {status} (got {response.status_code} {response.text[:200]})")
    if message is not None:
        value = response.json()
        check(value["status"] == status and value["message"] == message, f"{what}: message {message!r} (got {value})")
    return response


def reason_count(double, message):
    return double.stats()["s2s"]["reasons"].get(message, 0)


def query(url):
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


# --------------------------------------------------------------------------- vectors

def check_vectors(workdir):
    committed = FIXTURES / "s2s-vectors.json"
    scratch = workdir / "vectors"
    scratch.mkdir()
    for name in ("make-vectors.mjs", "app-private.pem"):
        shutil.copy(FIXTURES / name, scratch / name)
    subprocess.run(["node", str(scratch / "make-vectors.mjs")], check=True, timeout=60)
    check((scratch / "s2s-vectors.json").read_bytes() == committed.read_bytes(),
          "make-vectors.mjs reproduces s2s-vectors.json byte for byte")
    document = json.loads(committed.read_text())
    check(document["appId"] == APP and document["privateKeyFile"] == "app-private.pem", "vector file header")
    names = {v["name"] for v in document["vectors"]}
    check({"verify", "email-mobile", "verify-native-non-ascii", "verify-native-escapes"} <= names, "the listed vectors exist")
    escapes = next(v for v in document["vectors"] if v["name"] == "verify-native-escapes")
    check(all(s in escapes["body"] for s in ('\\"', "\\\\", "/", "\\n", "\\t", "\\u0001", "\u2028")),
          "the escapes vector holds \" \\ / newline tab U+0001 U+2028")
    check("Zoë Ünal 山田" in next(v for v in document["vectors"] if v["name"] == "verify-native-non-ascii")["body"],
          "the non-ASCII vector")
    private_pem = (FIXTURES / document["privateKeyFile"]).read_bytes()
    public = cd.load_public_key((FIXTURES / "app-public.pem").read_bytes())
    for v in document["vectors"]:
        canonical = cd.canonical_payload(document["appId"], v["path"], v["timestamp"], v["body"])
        check(canonical == v["canonical"], f"vector {v['name']}: Python canonical JSON = JSON.stringify's")
        check(cd.sha256_hex(canonical) == v["hash"], f"vector {v['name']}: hash")
        check(cd.sha256_hex(v["body"]) == v["contentSha256"], f"vector {v['name']}: content hash")
        headers = cd.sign_s2s(private_pem, document["appId"], v["path"], v["body"], v["timestamp"])
        check(headers["x-ba-signature"] == v["signature"], f"vector {v['name']}: the Python signer gives Node's signature")
        check(cd.rsa_public_decrypt(public, cd.b64url_decode_strict(v["signature"])) == v["hash"].encode(),
              f"vector {v['name']}: public decrypt gives the hash")
    # Node, now, agrees with the vectors too (same key, same timestamp).
    v = document["vectors"][0]
    check(node_sign((APP, v["path"], v["body"], None, v["timestamp"]))[0]["x-ba-signature"] == v["signature"],
          "node -e signing = the vector")
    return document


def send_vectors(double, document):
    # The vectors on the real routes ("/api/v1/auth/…") are accepted where they are sent. Those signed
    # for the path without "/api" pin the canonical JSON only: sent to the route, their signature does
    # not cover the path they arrived on, so each is refused (and their bodies never reach a handler).
    expected = {"api-verify": (404, "Auth code not found"), "api-email": (200, None), "api-email-mobile": (200, None),
                "api-verify-native-non-ascii": (200, None), "api-verify-native-escapes": (200, None)}
    routed = [v for v in document["vectors"] if v["path"].startswith("/api/")]
    check({v["name"] for v in routed} == set(expected), "the vectors on the real routes are the listed ones")
    last = []
    for v in document["vectors"]:
        double.clock(now_ms=int(v["timestamp"]) + 2000)  # the vectors' time, 2 s later
        headers = {"Content-Type": "application/json", "x-amz-content-sha256": v["contentSha256"],
                   "x-ba-request-timestamp": v["timestamp"], "x-ba-app": document["appId"], "x-ba-signature": v["signature"]}
        if v in routed:
            status, message = expected[v["name"]]
            expect(post(double, v["path"], v["body"], headers), status, message, f"vector {v['name']} is accepted")
            entry = double.stats()["s2s"]["log"][-1]
            check(entry["urlPath"] == v["path"] and entry["outcome"] == "accepted", f"vector {v['name']}: signature accepted")
            last.append(entry)
        else:
            expect(post(double, "/api" + v["path"], v["body"], headers), 401, "Invalid signature",
                   f"vector {v['name']} (signed for {v['path']}) sent to /api{v['path']} is refused")
    native = next(e for e in last if "yuki" in e["body"])
    check(native["status"] == 200, "non-ASCII verify-native answered")
    user = next(u for u in double.control("users")["users"] if u["email"] == "yuki.yamada@example.test")
    check(user["name"] == "Yūki Ünal 山田", "the non-ASCII name arrived intact")
    odd = next(u for u in double.control("users")["users"] if u["email"] == "esc.api@example.test")
    check(odd["name"] == "a\"b\\c/d\ne\tf\u0001g\u2028h\u2029i\u001fj\u007fk\U0001F966l", "the escaped name arrived intact")
    check(all(u["email"] not in ("zoe.unal@example.test", "esc@example.test") for u in double.control("users")["users"]),
          "no body of a refused vector reached a handler")
    # 16 s after a vector's time: expired.
    v = next(v for v in document["vectors"] if v["name"] == "api-email")
    double.clock(now_ms=int(v["timestamp"]) + 15_001, freeze=True)
    headers = {"Content-Type": "application/json", "x-amz-content-sha256": v["contentSha256"],
               "x-ba-request-timestamp": v["timestamp"], "x-ba-app": APP, "x-ba-signature": v["signature"]}
    expect(post(double, v["path"], v["body"], headers), 401, "Request expired", "a vector 15.001 s later")
    double.clock(now_ms=int(v["timestamp"]) + 15_000, freeze=True)
    expect(post(double, v["path"], v["body"], headers), 200, None, "a vector exactly 15 s later (the limit is > 15000)")
    double.clock(now_ms=int(v["timestamp"]) - 3_600_000)
    expect(post(double, v["path"], v["body"], headers), 200, None, "a timestamp an hour in the future passes (as published)")
    double.reset()


# --------------------------------------------------------------------------- S2S refusals

def check_s2s(double):
    code = double.mint_code(APP, "ada@example.test", "Ada", "google")
    body = body_of(app=APP, code=code)
    good = node_sign((APP, "/api/v1/auth/verify", body))[0]
    check(len(good["x-ba-signature"]) == 342 and "=" not in good["x-ba-signature"], "Node's signature: 342 base64url chars")

    def refused(headers, message, what, path="/api/v1/auth/verify", send_body=body):
        before = reason_count(double, message)
        expect(post(double, path, send_body, headers), 401, message, what)
        check(reason_count(double, message) == before + 1, f"{what}: reason counted in stats")

    # Each refusal leaves the code unused.
    refused(node_sign((APP, "/api/v1/auth/verify", body, OTHER_KEY))[0], "Invalid signature", "wrong key")
    altered = body_of(app=APP, code=code + "x")
    refused(dict(good, **{"x-amz-content-sha256": cd.sha256_hex(altered)}), "Invalid signature", "altered body",
            send_body=altered)
    other_path = node_sign((APP, "/api/v1/auth/email", body))[0]
    refused(other_path, "Invalid signature", "altered path (signed for /v1/auth/email)")
    old = node_sign((APP, "/api/v1/auth/verify", body, None, str(int(time.time() * 1000) - 16_000)))[0]
    refused(old, "Request expired", "old timestamp (16 s)")
    refused(dict(good, **{"x-ba-request-timestamp": "abc"}), "Request expired", "timestamp not a number")
    for header in ("x-ba-app", "x-ba-request-timestamp", "x-ba-signature"):
        refused({k: v for k, v in good.items() if k != header}, "Missing S2S headers", f"missing {header}")
    refused(dict(good, **{"x-ba-signature": ""}), "Missing S2S headers", "empty x-ba-signature")
    refused(dict(good, **{"x-ba-app": "nobody"}), "Unknown app", "unknown app")
    refused(dict(good, **{"x-amz-content-sha256": cd.sha256_hex(body + " ")}), "Invalid content hash", "wrong content hash")
    refused(dict(good, **{"x-amz-content-sha256": cd.sha256_hex(body).upper()}), "Invalid content hash", "uppercase content hash")
    refused({k: v for k, v in good.items() if k != "x-amz-content-sha256"}, "Invalid content hash", "missing content hash")
    refused(dict(good, **{"x-ba-signature": good["x-ba-signature"] + "=="}), "Invalid signature", "padded base64")
    refused(dict(good, **{"x-ba-signature": good["x-ba-signature"][:-4]}), "Invalid signature", "short signature")

    # Forged blocks: the strict type-1 check (OpenSSL's reasons in stats' details).
    private = cd.load_private_key(APP_KEY.read_bytes())
    numbers = private.private_numbers()
    n, d, k = numbers.public_numbers.n, numbers.d, 256
    digest = cd.sha256_hex(cd.canonical_payload(APP, "/api/v1/auth/verify", good["x-ba-request-timestamp"], body)).encode()

    def raw_sign(em):
        return cd.b64url(pow(int.from_bytes(em, "big"), d, n).to_bytes(k, "big"))

    forged = {
        "type 2 block": b"\x00\x02" + b"\xff" * (k - 3 - 64) + b"\x00" + digest,
        "7 padding bytes": b"\x00\x01" + b"\xff" * 7 + b"\x00" + b"x" * (k - 10 - 64) + digest,
        "a non-FF padding byte": b"\x00\x01" + b"\xff" * 20 + b"\xfe" + b"\xff" * (k - 3 - 64 - 21) + b"\x00" + digest,
        "no 00 separator": b"\x00\x01" + b"\xff" * (k - 2),
    }
    for what, em in forged.items():
        refused(dict(good, **{"x-ba-signature": raw_sign(em)}), "Invalid signature", f"forged block: {what}")
    correct = dict(good, **{"x-ba-signature": raw_sign(b"\x00\x01" + b"\xff" * (k - 3 - 64) + b"\x00" + digest)})
    digest_info = private.sign(digest, padding.PKCS1v15(), hashes.SHA256())  # RSASSA: DigestInfo inside
    refused(dict(good, **{"x-ba-signature": cd.b64url(digest_info)}), "Invalid signature", "RSASSA-PKCS1-v1_5 (DigestInfo) signature")
    details = double.stats()["s2s"]["details"]
    for reason in ("BLOCK_TYPE_IS_NOT_01", "BAD_PAD_BYTE_COUNT", "BAD_FIXED_HEADER_DECRYPT", "NULL_BEFORE_BLOCK_MISSING"):
        check(any(reason in key for key in details), f"stats detail names {reason}")
    check(any("not the hash" in key for key in details), "stats detail: decrypted value is not the hash")

    # The exact error bytes, the published shape.
    missing = post(double, "/api/v1/auth/verify", body, {"Content-Type": "application/json"})
    check(missing.content == b'{"status":401,"message":"Missing S2S headers"}', "error body bytes")

    # The good one (a hand-built correct block = Node's), once.
    check(correct["x-ba-signature"] == good["x-ba-signature"], "hand-built type-1 block = Node's signature")
    answer = expect(post(double, "/api/v1/auth/verify", body, good), 200, None, "good request")
    check(answer.json() == {"user": {"userId": answer.json()["user"]["userId"], "email": "ada@example.test",
                                     "name": "Ada", "provider": "google"}}, "verify answer shape")
    reused = expect(s2s(double, "/api/v1/auth/verify", body), 404, "Auth code not found", "reused code")
    check(reused.content == b'{"status":404,"message":"Auth code not found"}' and
          reused.headers["Content-Type"].startswith("application/json"), "verify.ts's HttpError(404) as api-router.ts writes it")
    check(double.stats()["codes"]["refused"]["unknown"] >= 1, "reused code counted")

    # The route is the contract path with contract.ts's "/api" prefix, and the signature must cover
    # the path the request arrived on: a request signed for "/v1/auth/verify" (the prefix left out of
    # the signed path) and posted to /api/v1/auth/verify is refused, and nothing answers without /api.
    code = double.mint_code(APP, "ada@example.test", "Ada", "google")
    unprefixed = body_of(app=APP, code=code)
    refused(node_sign((APP, "/v1/auth/verify", unprefixed))[0], "Invalid signature",
            "signed for /v1/auth/verify, sent to /api/v1/auth/verify", send_body=unprefixed)
    missing_route = expect(post(double, "/v1/auth/verify", unprefixed, node_sign((APP, "/v1/auth/verify", unprefixed))[0]), 404,
                           None, "POST /v1/auth/verify (no /api): no such route")
    check(missing_route.content == b"404 Not Found" and missing_route.headers["Content-Type"].startswith("text/plain"),
          "no route: Hono's default notFound, text, not the API's JSON error")
    log = double.stats()["s2s"]["log"]
    check(log[-1]["urlPath"] == "/api/v1/auth/verify", "the log names the path the request arrived on")
    expect(s2s(double, "/api/v1/auth/verify", unprefixed), 200, None, "the same code, signed for the route it is sent to")

    # Codes of another app: refused, and still good for their app (the published handler keeps them).
    theirs = double.mint_code(OTHER, "bob@example.test", "Bob", "apple")
    expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP, code=theirs)), 404, "Auth code not found", "code of another app")
    check(double.stats()["codes"]["refused"]["other_app"] == 1, "other-app refusal counted")
    expect(s2s(double, "/api/v1/auth/verify", body_of(app=OTHER, code=theirs), OTHER_KEY, OTHER), 200, None,
           "the other app redeems its code")
    # Body app ≠ signing app (double's check).
    mine = double.mint_code(APP, "ada@example.test", "Ada", "google")
    answer = expect(s2s(double, "/api/v1/auth/verify", body_of(app=OTHER, code=mine)), 400, "Validation Error", "body app ≠ x-ba-app")
    check(answer.json()["details"] == ["app: does not match x-ba-app"], "app mismatch detail")

    # Expiry: aged, not slept on.
    stale = double.mint_code(APP, "ada@example.test", "Ada", "google")
    double.age("codes", 59)
    fresh_enough = double.mint_code(APP, "ada@example.test", "Ada", "google")
    double.age("codes", 2)  # stale is 61 s old, fresh_enough 2 s
    expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP, code=stale)), 404, "Auth code not found", "expired code")
    check(double.stats()["codes"]["refused"]["expired"] == 1, "expired refusal counted")
    expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP, code=fresh_enough)), 200, None, "a 2 s old code")

    # Validation.
    answer = expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP)), 400, "Validation Error", "missing code")
    check(answer.json()["details"] == ['code: Invalid key: Expected "code" but received undefined'], "validation detail")
    expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP, code="x" * 1025)), 400, "Validation Error", "code > 1024")
    expect(s2s(double, "/api/v1/auth/email", body_of(app=APP, email="not-an-address")), 400, "Validation Error", "bad email")
    expect(s2s(double, "/api/v1/auth/email", body_of(app=APP, email="a@example.test", platform="web")), 400,
           "Validation Error", "platform other than mobile")
    expect(s2s(double, "/api/v1/auth/verify-native", body_of(app=APP, email="a@example.test", name="A", provider="google")),
           400, "Validation Error", "verify-native provider must be apple")
    check(double.stats()["s2s"]["log"][-1]["outcome"] == "accepted", "validation failures are accepted S2S requests")
    check(requests.get(f"{double.api_base}/v1/auth/verify", timeout=10).status_code == 404, "GET on an S2S path: 404")

    # verify-native get-or-create.
    first = expect(s2s(double, "/api/v1/auth/verify-native", body_of(app=APP, email="cy@example.test", name="Cy", provider="apple")),
                   200, None, "verify-native creates").json()["user"]
    again = expect(s2s(double, "/api/v1/auth/verify-native", body_of(app=APP, email="cy@example.test", name="Other", provider="apple")),
                   200, None, "verify-native finds").json()["user"]
    check(first == again and first["provider"] == "apple" and first["name"] == "Cy" and len(first["userId"]) == 20,
          "verify-native: same user, first name kept, 20-character id")


# --------------------------------------------------------------------------- magic links, pages

def check_email(double):
    address = "dana.o-neil@example.test"
    email_body = body_of(app=APP, email=address)
    for i in range(5):
        expect(s2s(double, "/api/v1/auth/email", email_body), 200, None, f"email {i + 1} of 5")
    expect(s2s(double, "/api/v1/auth/email", email_body), 429, "Too many requests. Please try again later.", "6th email in the hour")
    expect(s2s(double, "/api/v1/auth/email", body_of(app=APP, email="Dana.O-Neil@example.test")), 200, None,
           "another spelling is another address (as published)")
    double.age("emails", 3601)
    expect(s2s(double, "/api/v1/auth/email", email_body), 200, None, "an hour later: allowed again")
    stats = double.stats()["magic_links"]
    check(stats["rate_limited"] == 1 and stats["by_email"][address] == 6, "email stats")

    link = double.last_magic_link(address)
    check(len(link["token"]) == 64 and link["platform"] is None and link["app"] == APP, "the magic link token")
    answer = requests.get(link["url"], allow_redirects=False, timeout=10)
    check(answer.status_code == 302, "email-callback redirects")
    location = answer.headers["Location"]
    check(location.startswith(f"{WEB}/app/auth/callback?code="), "…to {baseUrl}/app/auth/callback?code=")
    user = expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP, code=query(location)["code"])), 200, None,
                  "the email code verifies").json()["user"]
    check(user["provider"] == "email" and user["name"] == "Dana O Neil" and user["email"] == address,
          "email user: provider email, name derived from the address")
    check(requests.get(link["url"], allow_redirects=False, timeout=10).status_code == 404, "a magic link is single use")
    check(requests.get(f"{double.url}/auth/email-callback?token=nope", allow_redirects=False, timeout=10).status_code == 404,
          "unknown link: 404")

    expect(s2s(double, "/api/v1/auth/email", body_of(app=APP, email="eve@example.test", platform="mobile")), 200, None, "mobile email")
    link = double.last_magic_link("eve@example.test")
    check(link["platform"] == "mobile", "mobile link")
    location = requests.get(link["url"], allow_redirects=False, timeout=10).headers["Location"]
    check(location.startswith("tasquito://auth/callback?code="), "mobile magic link → the app's scheme")

    expect(s2s(double, "/api/v1/auth/email", body_of(app=APP, email="fay@example.test")), 200, None, "email to fay")
    double.age("magic_links", 15 * 60 + 1)
    check(requests.get(double.last_magic_link("fay@example.test")["url"], allow_redirects=False, timeout=10).status_code == 410,
          "a magic link older than 15 minutes: 410")
    try:
        double.last_magic_link("nobody@example.test")
        check(False, "last_magic_link of an unknown address fails")
    except cd.ControlError as error:
        check(error.status == 404, "last_magic_link of an unknown address: 404")


def check_pages(double):
    double.next_user("gil@example.test", "Gil Ünal")
    answer = requests.get(f"{double.web_base}/auth", params={"app": APP, "provider": "google"}, allow_redirects=False, timeout=10)
    check(answer.status_code == 302 and answer.headers["Location"].startswith(f"{WEB}/app/auth/callback?code="), "/auth → callback")
    code = query(answer.headers["Location"])["code"]
    check(len(code) == 32, "codes are 32 base36 characters")
    user = expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP, code=code)), 200, None, "/auth code verifies").json()["user"]
    check(user["email"] == "gil@example.test" and user["name"] == "Gil Ünal" and user["provider"] == "google", "/auth user")
    answer = requests.get(f"{double.web_base}/auth", params={"app": APP, "provider": "apple", "platform": "mobile"},
                          allow_redirects=False, timeout=10)
    check(answer.headers["Location"].startswith("tasquito://auth/callback?code="), "/auth platform=mobile → scheme")
    user = expect(s2s(double, "/api/v1/auth/verify", body_of(app=APP, code=query(answer.headers["Location"])["code"])), 200, None,
                  "default user code").json()["user"]
    check(user["email"] == "ada.lovelace@example.test" and user["provider"] == "apple", "empty queue → default user")
    for params in ({"app": "nobody", "provider": "google"}, {"app": APP, "provider": "facebook"}, {"app": APP}):
        check(requests.get(f"{double.web_base}/auth", params=params, allow_redirects=False, timeout=10).status_code == 400,
              f"/auth {params}: 400")
    check(double.stats()["auth"][0]["email"] == "gil@example.test", "auth stats")


# --------------------------------------------------------------------------- Apple, faults, record

def verify_rs256(token, jwks):
    head, body, signature = token.split(".")
    header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    keys = [k for k in jwks["keys"] if k["kid"] == header["kid"]]
    if not keys:
        return None
    n = int.from_bytes(base64.urlsafe_b64decode(keys[0]["n"] + "=="), "big")
    e = int.from_bytes(base64.urlsafe_b64decode(keys[0]["e"] + "=="), "big")
    public = rsa.RSAPublicNumbers(e, n).public_key()
    try:
        public.verify(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)), f"{head}.{body}".encode(),
                      padding.PKCS1v15(), hashes.SHA256())
    except Exception:
        return False
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def check_apple(double):
    jwks = requests.get(double.apple_jwks_url, timeout=10).json()
    check([k["kid"] for k in jwks["keys"]] == ["apple-test-1", "apple-test-2"], "Apple JWKS: two keys")
    claims = verify_rs256(double.apple_token({"sub": "001.abc.002", "email": "h@example.test", "nonce": "n1"}), jwks)
    check(claims and claims["iss"] == "https://appleid.apple.com" and claims["aud"] == "com.broccoliapps.tasquito"
          and claims["sub"] == "001.abc.002" and claims["nonce"] == "n1" and claims["exp"] - claims["iat"] == 600,
          "apple_token: verifies, defaults")
    check(verify_rs256(double.apple_token({}, kid="apple-test-2"), jwks), "apple_token with the second key")
    check(verify_rs256(double.apple_token({}, sign_with="unknown"), jwks) is None, "unknown key: kid not in the JWKS")
    check(verify_rs256(double.apple_token({}, tamper=True), jwks) is False, "tampered signature fails")
    check("email" not in verify_rs256(double.apple_token({"email": None}), jwks), "a null claim is left out")
    double.control("apple_jwks", publish=["apple-test-1"])
    check(len(requests.get(double.apple_jwks_url, timeout=10).json()["keys"]) == 1, "apple_jwks publishes one key")


def check_faults(double):
    code = double.mint_code(APP, "ivy@example.test", "Ivy", "google")
    body = body_of(app=APP, code=code)
    double.fault("verify", "500", times=1)
    expect(s2s(double, "/api/v1/auth/verify", body), 500, "Internal Server Error", "fault 500")
    check(double.stats()["s2s"]["log"][-1]["outcome"] == "fault", "a faulted request is still verified and logged")
    double.fault("verify", "garbage", times=1)
    answer = s2s(double, "/api/v1/auth/verify", body)
    check(answer.status_code == 200 and answer.content.startswith(b"<html>"), "fault garbage")
    double.fault("verify", "wrong_shape", times=1)
    check(s2s(double, "/api/v1/auth/verify", body).json() == {"unexpected": True}, "fault wrong_shape")
    double.fault("verify", "401", times=1)
    expect(s2s(double, "/api/v1/auth/verify", body), 401, "Invalid signature", "fault 401")
    double.fault("email", "429", times=1)
    expect(s2s(double, "/api/v1/auth/email", body_of(app=APP, email="j@example.test")), 429, None, "fault 429")
    double.fault("verify", "down")
    try:
        s2s(double, "/api/v1/auth/verify", body)
        check(False, "fault down: no answer")
    except requests.exceptions.ConnectionError:
        check(True, "fault down: the connection drops")
    double.fault("verify", "none")
    double.fault("verify", "slow", seconds=30)
    try:
        headers = node_sign((APP, "/api/v1/auth/verify", body))[0]
        requests.post(f"{double.api_base}/v1/auth/verify", data=body.encode(), headers=headers, timeout=0.5)
        check(False, "fault slow: no answer in time")
    except requests.exceptions.Timeout:
        check(True, "fault slow: the client times out")
    double.fault("verify", "none")
    expect(s2s(double, "/api/v1/auth/verify", body), 200, None, "after the faults the code still verifies")
    double.fault("apple_keys", "500", times=1)
    check(requests.get(double.apple_jwks_url, timeout=10).status_code == 500, "fault on the Apple JWKS")
    double.fault("auth", "down", times=1)
    try:
        requests.get(f"{double.web_base}/auth", params={"app": APP, "provider": "google"}, allow_redirects=False, timeout=10)
        check(False, "fault on /auth")
    except requests.exceptions.ConnectionError:
        check(True, "fault down on /auth")
    for bad in ({"op": "fault", "endpoint": "nowhere", "kind": "500"}, {"op": "dance"}):
        check(requests.post(f"{double.url}/_control", json=bad, timeout=10).status_code == 400, f"bad control {bad}: 400")


def main():
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        document = check_vectors(workdir)
        record = workdir / "secrets.jsonl"
        config = {"apps": {APP: cd.app_config(WEB, FIXTURES / "app-public.pem", mobile_scheme="tasquito"),
                           OTHER: cd.app_config(WEB, FIXTURES / "other-public.pem")},
                  "appleBundleIds": {APP: "com.broccoliapps.tasquito"}}
        with cd.start(workdir, "central", config, record=record) as double:
            send_vectors(double, document)
            check_s2s(double)
            check_email(double)
            check_pages(double)
            check_apple(double)
            check_faults(double)
            stats = double.stats()
            check(stats["s2s"]["refused"] > 20 and stats["s2s"]["accepted"] > 20, "stats: accepted and refused counts")
            check(all("detail" in e for e in stats["s2s"]["log"] if e.get("outcome") == "refused"), "every refusal has a detail")
            double.reset()
            check(double.stats()["s2s"]["accepted"] == 0 and not double.control("users")["users"], "reset")
        secrets_ = [json.loads(line) for line in record.read_text().splitlines()]
        kinds = {s["kind"] for s in secrets_}
        check({"central auth code", "central magic link token", "apple identity token"} <= kinds, "secrets recorded")
        log = (workdir / "central.log").read_text()
        check("Traceback" not in log, "central.log: no traceback\n" + log[log.find("Traceback") - 300:][:3000])
        check(not [s for s in secrets_ if s["value"] in log], "central.log holds no recorded secret")
        check("Invalid signature (public decrypt failed: BLOCK_TYPE_IS_NOT_01)" in log, "refusal reasons are logged")
    print(f"{len(CHECKS)} checks passed, 0 failed")


if __name__ == "__main__":
    main()
