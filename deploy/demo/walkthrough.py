"""Gatehouse demo: a real OAuth server (django-oauth-toolkit) that demands a client secret
and burns refresh tokens after one use, Gatehouse in front of it on SQLite, and a native
app simulated step by step. Run through scripts/demo; --no-wait ends after the walkthrough.

Step numbers are those of the myVOO mobile login flow (shared/seeds/001)."""

import os
import secrets
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (BOLD, DIM, RECORD, RESET, ROOT, EchoBackend, code_received, detail, free_port, print_try_it, run,  # noqa: E402
                    serve_loopback_app, short, sqlite_server, start_gatehouse as start_configured_gatehouse, step)
from sandbox import dot  # noqa: E402
from sandbox.backends import PersonalInformationService  # noqa: E402
from sandbox.gatelog import fields  # noqa: E402
from sandbox.nativeapp import APP_REDIRECT, PASSWORD, USERNAME, App, InAppBrowser, pkce_pair, query  # noqa: E402

#: A second user of the upstream, whose business partner (BPId) is not active: signed in, but
#: not allowed to read data (myVOO step 6b, 403).
INACTIVE_USER, INACTIVE_PASSWORD = "bob", "builder-42"
BPIDS = {USERNAME: ("1000123", "active"), INACTIVE_USER: ("1000456", "inactive")}

def start_upstream(data, gatehouse_port, env):
    """django-oauth-toolkit (sandbox/dot) with alice and bob and the demo's client: a context
    manager yielding the running server (`url`); its config DATA/upstream.json, its log
    DATA/upstream.log."""
    callback = f"http://127.0.0.1:{gatehouse_port}/oauth/callback"
    config = {
        "users": [{"username": USERNAME, "password": PASSWORD, "email": "alice@example.test", "first_name": "Alice"},
                  {"username": INACTIVE_USER, "password": INACTIVE_PASSWORD, "email": "bob@example.test", "first_name": "Bob"}],
        "applications": [{"client_id": "gatehouse-demo", "client_secret_env": "DEMO_UPSTREAM_SECRET",
                          "redirect_uris": [callback], "pkce_required": False}],
        "rotate_refresh_token": True, "refresh_token_grace_period_seconds": 0,
    }
    return dot.run(data, "upstream", config, env=env)


def start_relay_doubles(upstream_url, env):
    """The data API behind Gatehouse (the "ESB", an echo) and the myVOO identity service
    (GetPersonalInformation), which checks tokens at the upstream (RFC 7662) and knows each
    user's business partner (BPId) and whether it is active."""
    backend = EchoBackend()
    personal = PersonalInformationService(introspection_url=upstream_url + "/o/introspect/", client_id="gatehouse-demo",
                                          client_secret=env["DEMO_UPSTREAM_SECRET"], users=BPIDS)
    return backend, personal


def start_gatehouse(data, port, upstream_url, env, backend, personal):
    config = "# Written by scripts/demo. See docs/configuration.md." + sqlite_server(port) + f"""
upstreams:
  - name: legacy
    kind: oauth2
    authorization_endpoint: {upstream_url}/o/authorize/
    token_endpoint: {upstream_url}/o/token/
    revocation_endpoint: {upstream_url}/o/revoke_token/
    client_id: gatehouse-demo
    client_secret_env: DEMO_UPSTREAM_SECRET
    client_auth: client_secret_basic
    scopes: [read, write]
    identity:
      kind: personal_information
      url: {personal.url}/UCP_SCIF_XML/UserManagement/GetPersonalInformation
      format: xml
      subject: /GetPersonalInformationResponse/PersonalInformation/Login
      bpid: /GetPersonalInformationResponse/PersonalInformation/BPId
      attributes:
        bpid_status: /GetPersonalInformationResponse/PersonalInformation/BPIdStatus
      cache_ttl: 5m
routes:
  - prefix: /api/contracts
    backend: {backend.url}/contracts
    upstream: legacy
    identity_headers:
      X-BPId: bpid
    require:
      attributes:
        bpid_status: active
    sign_in_client: com.example.app
sessions:
  encryption_keys_file: session-keys
  refresh_grace: 30s
clients:
  - client_id: com.example.app
    upstream: legacy
    wiring: callback
    token_exposure: passthrough
    redirect_uris: ["{APP_REDIRECT}", "http://127.0.0.1/callback"]
  - client_id: com.example.sealed
    upstream: legacy
    wiring: callback
    token_exposure: sealed
    redirect_uris: ["{APP_REDIRECT}"]
"""
    return start_configured_gatehouse(data, config, env)


def get_data(gatehouse, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{gatehouse['url']}/api/contracts/42", headers=headers, timeout=30)


def request_line(gatehouse, response, timeout=10.0):
    """The metadata of Gatehouse's log line for `response` (found by its X-Request-Id), waiting
    for it to be written (polled, with a deadline)."""
    request_id = response.headers["X-Request-Id"]
    deadline = time.monotonic() + timeout
    while True:
        for line in gatehouse["log"].read_text(errors="replace").splitlines():
            meta = fields(line)
            if meta.get("request_id") == request_id and "status" in meta:
                return meta
        if time.monotonic() > deadline:
            raise AssertionError(f"Gatehouse logged no request line for request_id={request_id} within {timeout}s")
        time.sleep(0.05)


def walkthrough(gatehouse):
    base = gatehouse["url"]
    app = App(gatehouse, seen=RECORD)

    step("1a-1b", "The app has no token. It asks for data anyway: 401, and the answer says where to sign in.")
    anonymous = get_data(gatehouse)
    problem = anonymous.json()
    sign_in = problem.get("sign_in", {})
    detail(f"GET /api/contracts/42 -> HTTP {anonymous.status_code} {problem.get('code')}; "
           f"WWW-Authenticate: {anonymous.headers.get('WWW-Authenticate', '(none)').split(',')[0]}…")
    detail(f"sign_in: authorization_endpoint {sign_in.get('authorization_endpoint')}, client_id {sign_in.get('client_id')}")
    detail(f"sign_in.url: {sign_in.get('url', '')[:90]}…")
    told_where = (anonymous.status_code == 401 and sign_in.get("authorization_endpoint") == f"{base}/oauth/authorize"
                  and sign_in.get("client_id") == "com.example.app")

    step("1a-1b", "It reads Gatehouse's metadata (RFC 8414) to configure its sign-in.")
    metadata = requests.get(f"{base}/.well-known/oauth-authorization-server", timeout=5).json()
    detail(f"issuer {metadata['issuer']}, PKCE methods {metadata['code_challenge_methods_supported']}")

    step("2-3a", "The app opens the in-app browser at Gatehouse's /oauth/authorize with PKCE S256.")
    detail(f"code_verifier stays in the app; code_challenge={app.challenge[:12]}…, state={app.state[:8]}…")
    browser = InAppBrowser(on_step=detail, seen=RECORD)
    first = browser.session.get(app.authorize_url(), allow_redirects=False, timeout=5)
    upstream_url = first.headers["Location"]
    detail(f"Gatehouse recorded the transaction and redirects to the upstream with its own state={query(upstream_url)['state'][:8]}…")

    step("3b-4c", "The user signs in at the upstream; the upstream returns to Gatehouse, which swaps the code with its secret.")
    location = browser.follow(upstream_url, APP_REDIRECT)
    received = query(location)
    code_received(received, app.state)

    step("5a", "The app redeems the code at /oauth/token with its code_verifier (no client secret on the phone).")
    tokens = app.redeem(received["code"])
    tokens.raise_for_status()
    body = tokens.json()
    detail(f"HTTP {tokens.status_code}, Cache-Control: {tokens.headers['Cache-Control']}")
    detail(f"access_token={short(body['access_token'])} refresh_token={short(body['refresh_token'])} expires_in={body.get('expires_in')}")

    step("5a", "Later the app refreshes; Gatehouse adds the secret the upstream demands.")
    refreshed = app.refresh(body["refresh_token"])
    refreshed.raise_for_status()
    detail(f"new access_token={short(refreshed.json()['access_token'])} new refresh_token={short(refreshed.json()['refresh_token'])}")

    step("5a", "The upstream burns a refresh token at its first use. A retry over a flaky network gets the same new pair.")
    replay = app.refresh(body["refresh_token"])
    same_pair = replay.status_code == 200 and replay.json()["refresh_token"] == refreshed.json()["refresh_token"]
    detail(f"retried with the first refresh token: HTTP {replay.status_code}, "
           f"{'the same pair' if same_pair else 'NOT THE SAME PAIR: ' + replay.text[:200]} (within the 30 s grace window)")

    data_ok = data_walkthrough(gatehouse, refreshed.json()["access_token"])

    step("PKCE", "A code stolen on its way to the app is useless without the verifier.")
    stolen = App(gatehouse, seen=RECORD)
    code = stolen.sign_in(InAppBrowser(seen=RECORD))["code"]
    attempt = stolen.redeem(code, verifier=pkce_pair()[0])
    detail(f"redeeming with the wrong code_verifier: HTTP {attempt.status_code} {attempt.json()['error']}")
    return told_where and same_pair and data_ok and attempt.status_code == 400 and sealed_walkthrough(gatehouse)


def data_walkthrough(gatehouse, access_token):
    """myVOO steps 6a-6b: the app reads its data through Gatehouse's resource relay."""
    personal = gatehouse["personal"]
    step("6a-6b", "With its access token the app gets its data; Gatehouse asks the identity service who it is.")
    first = get_data(gatehouse, access_token)
    seen_by_backend = first.json().get("headers", {}) if first.status_code == 200 else {}
    detail(f"GET /api/contracts/42 -> HTTP {first.status_code}; the backend received X-BPId: {seen_by_backend.get('x-bpid')} "
           f"(and no Authorization header: {'authorization' not in seen_by_backend})")
    first_ok = first.status_code == 200 and seen_by_backend.get("x-bpid") == BPIDS[USERNAME][0]

    step("6a-6b", "A second call: the BPId comes from Gatehouse's identity cache, not from the identity service.")
    second = get_data(gatehouse, access_token)
    calls = personal.calls_for(access_token)
    path = request_line(gatehouse, second).get("relay")
    detail(f"HTTP {second.status_code}; identity service calls for this token: {calls}; "
           f"Gatehouse's log: relay={path} (the fast path serves only callers already in the cache)")
    cached = second.status_code == 200 and calls == 1 and path == "fast"

    step("6a-6b", f"{INACTIVE_USER.capitalize()} signs in too, but the business partner's BPId is not active: 403.")
    app = App(gatehouse, seen=RECORD)
    tokens = app.redeem(app.sign_in(InAppBrowser(INACTIVE_USER, INACTIVE_PASSWORD, seen=RECORD))["code"])
    refused = get_data(gatehouse, tokens.json().get("access_token"))
    problem = refused.json()
    detail(f"HTTP {refused.status_code} {problem.get('code')}: {problem.get('detail')}")
    forbidden = tokens.status_code == 200 and refused.status_code == 403 and problem.get("code") == "forbidden"
    return first_ok and cached and forbidden


def sealed_walkthrough(gatehouse):
    """The default, token_exposure: sealed: the phone never holds an upstream token."""
    print(f"\n{BOLD}Sealed sessions (the default): the upstream's tokens never reach the phone{RESET}")
    app = App(gatehouse, seen=RECORD, client_id="com.example.sealed")
    step("5a", "The same sign-in for a sealed app: the code is redeemed for Gatehouse's own tokens.")
    body = app.redeem(app.sign_in(InAppBrowser(seen=RECORD))["code"]).json()
    detail(f"access_token={short(body['access_token'])} (expires_in {body['expires_in']} s) refresh_token={short(body['refresh_token'])}")
    detail("the upstream's tokens are sealed (AES-256-GCM) in the session store; the store keeps only hashes of these")

    step("5a", "A refresh rotates Gatehouse's tokens. A retry over a flaky network gets the same new pair.")
    first = app.refresh(body["refresh_token"]).json()
    retry = app.refresh(body["refresh_token"]).json()
    same = first["refresh_token"] == retry["refresh_token"]
    detail(f"new refresh_token={short(first['refresh_token'])}; retried with the old one: "
           f"{'the same pair' if same else 'A DIFFERENT PAIR'} (within the 30 s grace window)")

    step("RFC 7009", "The app signs out: /oauth/revoke ends the session (and revokes the upstream refresh token).")
    revoked = requests.post(f"{gatehouse['url']}/oauth/revoke", data={"token": first["refresh_token"], "client_id": app.client_id}, timeout=10)
    after = app.refresh(first["refresh_token"])
    detail(f"revoke: HTTP {revoked.status_code}; refreshing afterwards: HTTP {after.status_code} {after.json()['error']}")
    return same and after.status_code == 400


def demo(data, stack):
    env = dict(os.environ, DEMO_UPSTREAM_SECRET=secrets.token_urlsafe(32))
    port = free_port()
    upstream_url = stack.enter_context(start_upstream(data, port, env)).url
    backend, personal = start_relay_doubles(upstream_url, env)
    stack.callback(personal.stop)
    stack.callback(backend.stop)
    stack.callback(start_gatehouse(data, port, upstream_url, env, backend, personal).stop)
    print(f"{BOLD}Gatehouse{RESET} http://127.0.0.1:{port} in front of {BOLD}django-oauth-toolkit{RESET} {upstream_url}")
    print(f"{DIM}Files in {data}: gatehouse.yaml, gatehouse.sqlite, gatehouse.log, upstream.log{RESET}")
    ok = walkthrough({"url": f"http://127.0.0.1:{port}", "log": data / "gatehouse.log", "personal": personal})

    def try_it():
        url = serve_loopback_app(f"http://127.0.0.1:{port}")
        print_try_it(url, f"Sign in as {USERNAME} / {PASSWORD}.")
    return ok, try_it


def main():
    return run(__doc__, ROOT / "demo-data", demo)


if __name__ == "__main__":
    sys.exit(main())
