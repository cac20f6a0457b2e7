"""Gatehouse demo: a real OAuth server (django-oauth-toolkit) that demands a client secret
and burns refresh tokens after one use, Gatehouse in front of it on SQLite, and a native
app simulated step by step. Run through scripts/demo; --no-wait ends after the walkthrough.

Step numbers are those of the myVOO mobile login flow (shared/seeds/001)."""

import argparse
import http.server
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlencode

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "Tests/Support"))
from nativeapp import APP_REDIRECT, PASSWORD, USERNAME, App, InAppBrowser, free_port, pkce_pair, pump, query, wait_for_line  # noqa: E402

BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def step(number, text):
    print(f"\n{BOLD}[{number}] {text}{RESET}", flush=True)


def detail(text):
    print(f"    {text}", flush=True)


def short(token):
    return token[:8] + "…" if token else "(none)"


def start_upstream(data, gatehouse_port, env):
    callback = f"http://127.0.0.1:{gatehouse_port}/oauth/callback"
    config = {
        "users": [{"username": USERNAME, "password": PASSWORD, "email": "alice@example.test", "first_name": "Alice"}],
        "applications": [{"client_id": "gatehouse-demo", "client_secret_env": "DEMO_UPSTREAM_SECRET",
                          "redirect_uris": [callback], "pkce_required": False}],
        "rotate_refresh_token": True, "refresh_token_grace_period_seconds": 0,
    }
    (data / "upstream.json").write_text(json.dumps(config))
    log = open(data / "upstream.log", "w")
    process = subprocess.Popen([sys.executable, str(ROOT / "Tests/Upstream/serve.py"), "--config", str(data / "upstream.json"),
                                "--port", "0", "--quiet"], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    return process, json.loads(wait_for_line(process.stdout, '"ready"', 60, "the upstream"))["url"]


def start_gatehouse(data, port, upstream_url, env):
    config = f"""# Written by scripts/demo. See README.md, "Configuration reference".
server:
  public_base_url: http://127.0.0.1:{port}
  host: 127.0.0.1
  port: {port}
store:
  sqlite_path: gatehouse.sqlite
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
    (data / "gatehouse.yaml").write_text(config)
    binary = os.environ.get("GATEHOUSE_BIN", str(ROOT / ".build/debug/gatehouse"))
    if not (data / "session-keys").exists():
        subprocess.run([binary, "keys", "generate", "--file", str(data / "session-keys")], check=True, capture_output=True)
    log = open(data / "gatehouse.log", "w")
    process = subprocess.Popen([binary, "serve", "--config", str(data / "gatehouse.yaml")],
                               stdout=log, stderr=subprocess.PIPE, text=True, env=env)
    log.write(wait_for_line(process.stderr, "gatehouse is ready", 30, "Gatehouse"))
    log.flush()
    pump(process.stderr, log)
    return process


def walkthrough(gatehouse):
    base = gatehouse["url"]
    app = App(gatehouse)

    step("1a-1b", "The app has no token. It reads Gatehouse's metadata (RFC 8414) to find where to sign in.")
    metadata = requests.get(f"{base}/.well-known/oauth-authorization-server", timeout=5).json()
    detail(f"issuer {metadata['issuer']}, PKCE methods {metadata['code_challenge_methods_supported']}")

    step("2-3a", "The app opens the in-app browser at Gatehouse's /oauth/authorize with PKCE S256.")
    detail(f"code_verifier stays in the app; code_challenge={app.challenge[:12]}…, state={app.state[:8]}…")
    browser = InAppBrowser(on_step=detail)
    first = browser.session.get(app.authorize_url(), allow_redirects=False, timeout=5)
    upstream_url = first.headers["Location"]
    detail(f"Gatehouse recorded the transaction and redirects to the upstream with its own state={query(upstream_url)['state'][:8]}…")

    step("3b-4c", "The user signs in at the upstream; the upstream returns to Gatehouse, which swaps the code with its secret.")
    location = browser.follow(upstream_url, APP_REDIRECT)
    received = query(location)
    detail(f"the app receives a one-time Gatehouse code={short(received['code'])} and its own state back: "
           f"{'matches' if received['state'] == app.state else 'DOES NOT MATCH'}")

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

    step("1d", "The upstream burns refresh tokens after one use: the first one is now refused.")
    replay = app.refresh(body["refresh_token"])
    detail(f"HTTP {replay.status_code} {replay.json()}")

    step("PKCE", "A code stolen on its way to the app is useless without the verifier.")
    stolen = App(gatehouse)
    code = stolen.sign_in()["code"]
    attempt = stolen.redeem(code, verifier=pkce_pair()[0])
    detail(f"redeeming with the wrong code_verifier: HTTP {attempt.status_code} {attempt.json()['error']}")
    return replay.status_code == 400 and attempt.status_code == 400 and sealed_walkthrough(gatehouse)


def sealed_walkthrough(gatehouse):
    """The default, token_exposure: sealed: the phone never holds an upstream token."""
    print(f"\n{BOLD}Sealed sessions (the default): the upstream's tokens never reach the phone{RESET}")
    app = App(gatehouse, client_id="com.example.sealed")
    step("5a", "The same sign-in for a sealed app: the code is redeemed for Gatehouse's own tokens.")
    body = app.redeem(app.sign_in()["code"]).json()
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


def serve_loopback_app(gatehouse):
    """A tiny "native app" on a loopback redirect (RFC 8252 §7.3) for a person with a browser."""
    port = free_port()
    verifier, challenge = pkce_pair()
    state = secrets.token_urlsafe(16)
    redirect = f"http://127.0.0.1:{port}/callback"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            received = query(self.path)
            if received.get("state") != state:
                body = f"<p>Unexpected state or error: {received}</p>"
            elif "code" in received:
                tokens = requests.post(f"{gatehouse['url']}/oauth/token", timeout=30, data={
                    "grant_type": "authorization_code", "client_id": "com.example.app", "code": received["code"],
                    "redirect_uri": redirect, "code_verifier": verifier}).json()
                shown = {k: (short(v) if k.endswith("_token") else v) for k, v in tokens.items()}
                body = f"<h1>Signed in</h1><p>The app redeemed its code at Gatehouse and received:</p><pre>{json.dumps(shown, indent=2)}</pre>"
            else:
                body = f"<h1>Sign-in failed</h1><pre>{json.dumps(received, indent=2)}</pre>"
            page = f"<!doctype html><meta charset=utf-8><title>Demo app</title>{body}".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"{gatehouse['url']}/oauth/authorize?" + urlencode({
        "response_type": "code", "client_id": "com.example.app", "redirect_uri": redirect, "state": state,
        "code_challenge": challenge, "code_challenge_method": "S256", "scope": "read"})


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-wait", action="store_true", help="stop after the automatic walkthrough")
    parser.add_argument("--data", default=str(ROOT / "demo-data"), help="folder for the demo's files")
    arguments = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the clean-up below on SIGTERM too
    data = Path(arguments.data)
    data.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DEMO_UPSTREAM_SECRET=secrets.token_urlsafe(32))
    port = free_port()
    upstream, upstream_url = start_upstream(data, port, env)
    gatehouse = None
    try:
        gatehouse = start_gatehouse(data, port, upstream_url, env)
        print(f"{BOLD}Gatehouse{RESET} http://127.0.0.1:{port} in front of {BOLD}django-oauth-toolkit{RESET} {upstream_url}")
        print(f"{DIM}Files in {data}: gatehouse.yaml, gatehouse.sqlite, gatehouse.log, upstream.log{RESET}")
        ok = walkthrough({"url": f"http://127.0.0.1:{port}"})
        print(f"\n{BOLD}Walkthrough {'complete' if ok else 'FAILED'}.{RESET}")
        if not ok:
            return 1
        if not arguments.no_wait:
            url = serve_loopback_app({"url": f"http://127.0.0.1:{port}"})
            print(f"\nNow try it in a browser. Open:\n\n    {url}\n\nSign in as {USERNAME} / {PASSWORD}. "
                  f"The demo app on its loopback redirect shows the tokens it received. Ctrl-C stops everything.")
            threading.Event().wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for process in (gatehouse, upstream):
            if process:
                process.terminate()
                process.wait(10)


if __name__ == "__main__":
    sys.exit(main())
