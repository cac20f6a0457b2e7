"""Self-check of backends.py: run with the venv's python; exits non-zero on failure.

    .venv/bin/python sandbox/check_backends.py [--gib]

EchoBackend: echo, repeated headers, keep-alive, hop-by-hop response headers, statuses,
a 200 MiB download and a 50 MiB chunked upload with flat memory (max RSS printed),
slow requests released by stop(). --gib also streams 1 GiB.
PersonalInformationService: in front of the real django-oauth-toolkit server
(sandbox/dot/serve.py, demo-config.json), with tokens for alice and bob obtained by
the authorization code flow. JWTIssuer: tokens verify against its JWKS with jwcrypto,
forgeries do not.
"""

import hashlib
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlencode

import requests
from jwcrypto import jwk, jws, jwt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from backends import EchoBackend, JWTIssuer, PersonalInformationService  # noqa: E402
from nativeapp import InAppBrowser, query, wait_for_line  # noqa: E402

MiB = 1024 * 1024
CALLBACK = "http://127.0.0.1:8080/oauth/callback"
SECRETS = {"UPSTREAM_SECRET_LEGACY": "legacy-secret", "UPSTREAM_SECRET_PKCE": "pkce-secret",
           "UPSTREAM_SECRET_OIDC": "oidc-secret", "UPSTREAM_SECRET_RS": "rs-secret"}
USERS = {"alice": ("1000123", "active"), "bob": ("1000456", "blocked")}
NS = {"scif": "urn:voo:scif:usermanagement"}


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def step(message):
    print(f"-- {message}", flush=True)


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# --------------------------------------------------------------------------- EchoBackend

def check_echo(gib):
    with EchoBackend(history=5) as echo:
        step(f"EchoBackend at {echo.url}")
        session = requests.Session()
        r = session.get(f"{echo.url}/esb/v1/things?x=1&y=%20", headers={"X-BPId": "1000123"})
        body = r.json()
        print(f"   {r.status_code} {r.headers.get('Content-Type')} {body}")
        expect(r.status_code == 200 and r.headers["Content-Type"] == "application/json", "bad echo answer")
        expect(body["method"] == "GET" and body["path"] == "/esb/v1/things?x=1&y=%20", "bad method/path")
        expect(body["headers"]["x-bpid"] == "1000123" and "host" in body["headers"], "headers not echoed")
        expect(body["body_bytes"] == 0 and body["body_sha256"] == hashlib.sha256().hexdigest(), "bad empty body")
        expect(r.headers["Keep-Alive"] == "timeout=5" and r.headers["Connection"] == "keep-alive"
               and r.headers["X-Backend"] == "echo", f"missing response headers {dict(r.headers)}")

        step("POST with Content-Length, PATCH, DELETE, HEAD on the same keep-alive connection")
        payload = b'{"hello": "world"}'
        r = session.post(f"{echo.url}/esb/x", data=payload, headers={"Content-Type": "application/json"})
        expect(r.json()["body_bytes"] == len(payload)
               and r.json()["body_sha256"] == hashlib.sha256(payload).hexdigest(), "bad POST echo")
        expect(session.patch(f"{echo.url}/p", data=b"abc").json()["method"] == "PATCH", "PATCH")
        expect(session.delete(f"{echo.url}/d").json()["method"] == "DELETE", "DELETE")
        r = session.head(f"{echo.url}/h")
        expect(r.status_code == 200 and r.content == b"", "HEAD")
        print(f"   calls={echo.calls} connections={echo.connections}")
        expect(echo.calls == 5 and echo.connections == 1, "keep-alive not used")
        expect(len(echo.requests) == 5 and echo.last_request["method"] == "HEAD", "history not bounded to 5")

        step("repeated request headers are joined with ', '; raw chunked body with extension + trailer")
        conn = http.client.HTTPConnection("127.0.0.1", echo.port, timeout=10)
        conn.putrequest("GET", "/dup")
        conn.putheader("X-Dup", "a")
        conn.putheader("X-Dup", "b")
        conn.endheaders()
        dup = json.loads(conn.getresponse().read())
        expect(dup["headers"]["x-dup"] == "a, b", f"repeated header: {dup['headers']}")
        raw = socket.create_connection(("127.0.0.1", echo.port), timeout=10)
        raw.sendall(b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: y\r\n\r\n")
        response = http.client.HTTPResponse(raw)
        response.begin()
        chunked = json.loads(response.read())
        raw.close()
        print(f"   {chunked['body_bytes']} bytes, Connection: {response.getheader('Connection')}")
        expect(chunked["body_sha256"] == hashlib.sha256(b"hello world").hexdigest(), "chunked decoding")
        expect(response.getheader("Connection") == "close" and response.getheader("Keep-Alive") is None,
               "Connection: close not honoured")

        step("status route")
        for status in (201, 204, 404, 418, 502, 503):
            r = session.get(f"{echo.url}/api/status/{status}")
            expect(r.status_code == status, f"status {status} -> {r.status_code}")
            expect(status == 204 or r.json() == {"status": status}, f"status body {r.text}")

        step("slow route")
        started = time.monotonic()
        r = session.get(f"{echo.url}/x/slow?seconds=0.3")
        elapsed = time.monotonic() - started
        print(f"   {r.status_code} {r.json()} in {elapsed:.2f}s")
        expect(r.status_code == 200 and 0.3 <= elapsed < 2, "slow route timing")

        baseline = max_rss_mib()
        step(f"download 200 MiB, hashed as it arrives (max RSS so far {baseline:.1f} MiB)")
        size = 200 * MiB
        started = time.monotonic()
        r = session.get(f"{echo.url}/files/download?bytes={size}", stream=True)
        expect(int(r.headers["Content-Length"]) == size, "no Content-Length")
        digest, received = hashlib.sha256(), 0
        for chunk in r.iter_content(256 * 1024):
            digest.update(chunk)
            received += len(chunk)
        print(f"   {received} bytes in {time.monotonic() - started:.2f}s")
        expect(received == size and digest.hexdigest() == EchoBackend.pattern_sha256(size), "download corrupt")

        step("upload 50 MiB chunked (generator body)")
        size = 50 * MiB
        chunks = (block[i:i + 64 * 1024] for block in EchoBackend.pattern_chunks(size)
                  for i in range(0, len(block), 64 * 1024))
        r = session.post(f"{echo.url}/files/upload", data=chunks)
        sent = r.json()
        print(f"   echoed body_bytes={sent['body_bytes']} transfer-encoding={sent['headers'].get('transfer-encoding')}")
        expect(sent["headers"].get("transfer-encoding") == "chunked", "upload was not chunked")
        expect(sent["body_bytes"] == size and sent["body_sha256"] == EchoBackend.pattern_sha256(size), "upload corrupt")

        step("upload 20 MiB with Content-Length (http.client, written in pieces)")
        size = 20 * MiB
        conn.putrequest("PUT", "/files/put")
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        for chunk in EchoBackend.pattern_chunks(size):
            conn.send(chunk)
        sent = json.loads(conn.getresponse().read())
        expect(sent["body_bytes"] == size and sent["body_sha256"] == EchoBackend.pattern_sha256(size), "PUT corrupt")
        conn.close()

        if gib:
            step("download 1 GiB (not hashed)")
            started, received = time.monotonic(), 0
            with session.get(f"{echo.url}/download?bytes={1024 * MiB}", stream=True) as r:
                for chunk in r.iter_content(1024 * 1024):
                    received += len(chunk)
            print(f"   {received} bytes in {time.monotonic() - started:.2f}s")
            expect(received == 1024 * MiB, "1 GiB download short")

        peak = max_rss_mib()
        print(f"   max RSS {peak:.1f} MiB (grew {peak - baseline:.1f} MiB while moving the large bodies)")
        expect(peak - baseline < 48, "memory grew with body size: not streaming")

        step("500 concurrent /slow?seconds=1 overlap (listen backlog, one thread per connection)")
        echo.reset()
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=500) as pool:
            statuses = list(pool.map(lambda _: requests.get(f"{echo.url}/slow?seconds=1", timeout=30).status_code,
                                     range(500)))
        elapsed = time.monotonic() - started
        print(f"   {statuses.count(200)}/500 OK in {elapsed:.2f}s, max_in_flight={echo.max_in_flight}")
        expect(statuses.count(200) == 500 and echo.max_in_flight >= 400 and elapsed < 10, "no overlap")

    step("stop() releases a request sleeping in /slow and closes keep-alive connections")
    echo = EchoBackend()
    outcome = {}
    kept = requests.Session()
    kept.get(echo.url)

    def sleeper():
        try:
            outcome["response"] = requests.get(f"{echo.url}/slow?seconds=60", timeout=30).status_code
        except requests.RequestException as error:
            outcome["error"] = type(error).__name__

    thread = threading.Thread(target=sleeper)
    thread.start()
    deadline = time.monotonic() + 5
    while echo.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    started = time.monotonic()
    echo.stop()
    thread.join(10)
    print(f"   sleeper ended in {time.monotonic() - started:.2f}s: {outcome}")
    expect(not thread.is_alive() and time.monotonic() - started < 5, "stop() did not release /slow")
    expect("error" in outcome, "a stopped EchoBackend still answered /slow")
    try:
        kept.get(echo.url, timeout=5)
        raise CheckFailed("a stopped EchoBackend still answered")
    except requests.ConnectionError:
        pass


# --------------------------------------------------------------------------- PersonalInformationService

def authorization_code_token(base, username, password):
    """alice/bob sign in through DOT's login page; gatehouse-legacy redeems the code."""
    params = {"response_type": "code", "client_id": "gatehouse-legacy", "redirect_uri": CALLBACK,
              "state": "s", "scope": "read"}
    location = InAppBrowser(username, password).follow(f"{base}/o/authorize/?{urlencode(params)}", CALLBACK)
    expect(isinstance(location, str), f"sign-in as {username} failed")
    r = requests.post(f"{base}/o/token/", data={"grant_type": "authorization_code", "code": query(location)["code"],
                      "redirect_uri": CALLBACK}, auth=("gatehouse-legacy", SECRETS["UPSTREAM_SECRET_LEGACY"]))
    expect(r.status_code == 200, f"code exchange failed: {r.status_code} {r.text}")
    return r.json()["access_token"]


def xml_info(response):
    root = ET.fromstring(response.content)
    expect(root.tag == "{urn:voo:scif:usermanagement}GetPersonalInformationResponse", f"root {root.tag}")
    return {child.tag.split("}")[1]: child.text for child in root.find("scif:PersonalInformation", NS)}


def check_personal_information(base):
    introspection = f"{base}/o/introspect/"
    alice = authorization_code_token(base, "alice", "wonderland-42")
    bob = authorization_code_token(base, "bob", "builder-42")
    rs = ("resource-server", SECRETS["UPSTREAM_SECRET_RS"])
    service_token = requests.post(f"{base}/o/token/", data={"grant_type": "client_credentials"}, auth=rs).json()["access_token"]

    with PersonalInformationService(introspection, *rs, USERS) as pis:
        xml_url = f"{pis.url}/UCP_SCIF_XML/UserManagement/GetPersonalInformation"
        json_url = f"{pis.url}/json/UserManagement/GetPersonalInformation"
        bearer = lambda token: {"Authorization": f"Bearer {token}"}
        step(f"PersonalInformationService at {pis.url}: alice's token")
        r = requests.get(xml_url, headers=bearer(alice))
        print(f"   {r.status_code} {r.headers['Content-Type']}\n{r.text}")
        expect(r.status_code == 200 and r.headers["Content-Type"] == "text/xml; charset=utf-8", "bad XML answer")
        expect(xml_info(r) == {"Login": "alice", "BPId": "1000123", "BPIdStatus": "active",
                               "Email": "alice@example.test"}, f"bad XML info {xml_info(r)}")
        r = requests.get(json_url, headers=bearer(alice))
        print(f"   {r.status_code} {r.text}")
        expect(r.json() == {"personalInformation": {"login": "alice", "bpId": "1000123", "bpIdStatus": "active",
                                                    "email": "alice@example.test"}}, "bad JSON answer")

        step("bob (blocked BPId)")
        expect(xml_info(requests.get(xml_url, headers=bearer(bob)))["BPIdStatus"] == "blocked", "bob not blocked")

        step("garbage token -> 401 TOKEN_EXPIRED; no token -> 401 TOKEN_MISSING; no username -> 404")
        r = requests.get(xml_url, headers=bearer("garbage"))
        print(f"   {r.status_code} {r.text.strip()}")
        fault = ET.fromstring(r.content)
        expect(r.status_code == 401 and fault.tag == "Fault" and fault.findtext("Code") == "TOKEN_EXPIRED"
               and fault.findtext("Message") == "access_token expired", "bad XML fault")
        r = requests.get(json_url, headers=bearer("garbage"))
        print(f"   {r.status_code} {r.text}")
        expect(r.status_code == 401 and r.json() == {"fault": {"code": "TOKEN_EXPIRED",
                                                               "message": "access_token expired"}}, "bad JSON fault")
        r = requests.get(xml_url)
        expect(r.status_code == 401 and ET.fromstring(r.content).findtext("Code") == "TOKEN_MISSING", "no token")
        r = requests.get(json_url, headers=bearer(service_token))
        print(f"   client_credentials token: {r.status_code} {r.text}")
        expect(r.status_code == 404 and r.json()["fault"]["code"] == "USER_NOT_FOUND", "token without user")

        step("counters")
        print(f"   total_calls={pis.total_calls} alice={pis.calls_for(alice)} garbage={pis.calls_for('garbage')}")
        expect(pis.total_calls == 7 and pis.calls_for(alice) == 2 and pis.calls_for("garbage") == 2
               and pis.calls_for(bob) == 1 and pis.introspections == 6, "bad counters")

        step("delay_seconds=1: 100 concurrent first calls overlap")
        pis.reset()
        pis.delay_seconds = 1.0
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=100) as pool:
            statuses = list(pool.map(lambda _: requests.get(json_url, headers=bearer(bob), timeout=30).status_code,
                                     range(100)))
        elapsed = time.monotonic() - started
        print(f"   {statuses.count(200)}/100 OK in {elapsed:.2f}s, max_in_flight={pis.max_in_flight}, "
              f"calls_for(bob)={pis.calls_for(bob)}")
        expect(statuses.count(200) == 100 and pis.calls_for(bob) == 100 and pis.max_in_flight >= 50
               and elapsed < 15, "calls did not overlap")
        pis.delay_seconds = 0

        step("down -> 503; slow -> client timeout")
        pis.down = True
        r = requests.get(xml_url, headers=bearer(alice))
        print(f"   {r.status_code} {r.text.strip()}")
        expect(r.status_code == 503 and ET.fromstring(r.content).findtext("Code") == "SERVICE_UNAVAILABLE", "down")
        pis.down, pis.slow = False, True
        try:
            requests.get(xml_url, headers=bearer(alice), timeout=0.5)
            raise CheckFailed("slow mode answered within 0.5 s")
        except requests.Timeout:
            print("   timed out as intended")
        pis.slow = False

        step("revoked token -> 401 TOKEN_EXPIRED")
        r = requests.post(f"{base}/o/revoke_token/", data={"token": alice},
                          auth=("gatehouse-legacy", SECRETS["UPSTREAM_SECRET_LEGACY"]))
        expect(r.status_code == 200, "revocation failed")
        r = requests.get(json_url, headers=bearer(alice))
        expect(r.status_code == 401 and r.json()["fault"]["code"] == "TOKEN_EXPIRED", f"revoked: {r.text}")

    step("wrong introspection credentials -> 503 SERVICE_UNAVAILABLE")
    with PersonalInformationService(introspection, "resource-server", "wrong", USERS) as pis:
        r = requests.get(f"{pis.url}/json/UserManagement/GetPersonalInformation", headers=bearer(bob))
        print(f"   {r.status_code} {r.text}")
        expect(r.status_code == 503 and r.json()["fault"]["code"] == "SERVICE_UNAVAILABLE", "bad credentials")


# --------------------------------------------------------------------------- JWTIssuer

def verify(token, issuer):
    keys = jwk.JWKSet.from_json(requests.get(issuer.jwks_uri, timeout=10).text)
    verified = jwt.JWT(jwt=token, key=keys, expected_type="JWS",
                       check_claims={"iss": issuer.url, "aud": "gatehouse-api", "exp": None})
    return verified.token.jose_header, json.loads(verified.claims)


def rejected(token, issuer):
    try:
        verify(token, issuer)
    except (jwt.JWException, jws.JWException, ValueError) as error:
        return type(error).__name__
    return None


def check_jwt():
    with JWTIssuer() as issuer:
        step(f"JWTIssuer at {issuer.url} (kid {issuer.kid})")
        token = issuer.mint("alice", scope=["read", "write"], extra_claims={"bpid": "1000123"})
        header, claims = verify(token, issuer)
        print(f"   header {header}\n   claims {claims}")
        expect(header == {"alg": "RS256", "typ": "at+jwt", "kid": issuer.kid}, "bad header")
        expect(claims["sub"] == "alice" and claims["scope"] == "read write" and claims["bpid"] == "1000123"
               and claims["client_id"] == "com.example.app" and claims["jti"] and claims["exp"] - claims["iat"] == 300,
               "bad claims")
        expect(issuer.jwks_fetches == 1, "JWKS fetches not counted")
        metadata = requests.get(f"{issuer.url}/.well-known/oauth-authorization-server").json()
        expect(metadata == {"issuer": issuer.url, "jwks_uri": issuer.jwks_uri}, "metadata")

        step("forgeries and bad tokens are rejected by jwcrypto")
        cases = {
            "unknown key": issuer.mint_with_unknown_key("alice"),
            "alg none": issuer.mint_unsigned("alice"),
            "HS256 keyed with the public PEM": issuer.mint_unsigned("alice", algorithm="HS256"),
            "expired": issuer.mint("alice", expires_in=-600),
            "wrong audience": issuer.mint("alice", audience="someone-else"),
            "missing exp": issuer.mint("alice", extra_claims={"exp": None}),
        }
        for name, bad in cases.items():
            error = rejected(bad, issuer)
            print(f"   {name}: {error}")
            expect(error, f"{name} was accepted")
        expect(issuer.mint_unsigned("a").endswith("."), "alg none token must have an empty signature")

        step("key rotation")
        old_kid, new_kid = issuer.kid, issuer.rotate_key()
        header, _ = verify(issuer.mint("bob", algorithm="PS256"), issuer)
        expect(header["kid"] == new_kid != old_kid and header["alg"] == "PS256", "rotation")
        expect(not rejected(token, issuer), "token of the kept old key rejected")
        issuer.rotate_key(keep_old=False)
        expect(rejected(token, issuer) and len(issuer.jwks()["keys"]) == 1, "dropped key still accepted")


def main():
    gib = "--gib" in sys.argv
    env = {**os.environ, **SECRETS}
    server = subprocess.Popen([sys.executable, str(HERE / "dot/serve.py"), "--config",
                               str(HERE / "dot/demo-config.json"), "--port", "0", "--quiet"],
                              env=env, stdout=subprocess.PIPE, text=True)
    try:
        check_echo(gib)
        check_jwt()
        base = json.loads(wait_for_line(server.stdout, r'"ready"', 60, "the upstream authorization server"))["url"]
        step(f"django-oauth-toolkit ready at {base}")
        check_personal_information(base)
    except Exception as error:  # noqa: BLE001 - any failure fails the check
        import traceback
        traceback.print_exc()
        print(f"FAIL: {type(error).__name__}: {error}", flush=True)
        return 1
    finally:
        server.terminate()
        server.wait(10)
    print(f"OK: all backend checks passed (max RSS {max_rss_mib():.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
