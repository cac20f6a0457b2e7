"""Gatehouse demo with a central sign-in provider: Gatehouse (SQLite) as the backend of a
broccoliapps-style app ("tasquito"), in front of the local central-provider look-alike
(sandbox/central/, built from broccoliapps' published verifier and handlers). A native app
simulated step by step: sign-in, the app's tokens, the JWT Gatehouse minted (its claims, verified
with Gatehouse's JWKS), a relayed call to a small local backend, and the logout (RFC 7009).
Run through `scripts/demo central`; --no-wait ends after the walkthrough."""

import os
import re
import sys
from pathlib import Path

import jwt  # PyJWT
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (BOLD, DIM, RECORD, RESET, ROOT, EchoBackend, code_received, detail, free_port, print_try_it,  # noqa: E402
                    query, relayed_call, run, serve_loopback_app, short, sqlite_server, start_gatehouse, step)
from sandbox.nativeapp import App  # noqa: E402
from sandbox import central as centrald  # noqa: E402

APP = "tasquito"  # the app id at the central provider (Gatehouse's client_id there, the JWTs' iss and aud)
CLIENT = "tasquito-app"
REDIRECT = "com.broccoliapps.tasquito:/oauth2redirect"
PERSON = {"email": "ada.lovelace@example.test", "name": "Ada Lovelace"}  # whom the sandbox signs in
SIGN_IN_COOKIE = "__Secure-gatehouse-signin"


def private_key_file(path):
    """An RSA private key (PEM, 2048 bits) at `path`, made on first use (mode 0600)."""
    if not path.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem)
    return path


def public_key_file(private_path, path):
    key = serialization.load_pem_private_key(private_path.read_bytes(), None)
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def config(port, provider, backend, s2s_key, jwt_key):
    """Gatehouse's configuration: deploy/central.example.yaml on 127.0.0.1, in front of the sandbox."""
    upstream = centrald.gatehouse_upstream(APP, provider, APP, key_file=s2s_key, extra=f"""
    provider: google
    environment: development
    refresh_rotation: every_use
    signing_key_files: [{jwt_key}]
    token_issuer: {APP}""")
    return "# Written by scripts/demo central. See deploy/central.example.yaml." + sqlite_server(port) + f"""
sessions:
  encryption_keys_file: session-keys
  refresh_grace: 30s
upstreams:{upstream}
clients:
  - client_id: {CLIENT}
    upstream: {APP}
    token_exposure: sealed
    redirect_uris: ["{REDIRECT}", "http://127.0.0.1/callback"]
routes:
  - prefix: /api/tasks
    backend: {backend.url}/tasks
    methods: [GET, HEAD, POST, PUT, PATCH, DELETE]
    upstream: {APP}
    identity_headers:
      X-User-Id: subject
      X-User-Email: email
      X-User-Name: name
      X-Sign-In-Provider: provider
    authorization: remove
"""


def walkthrough(base, provider, backend):
    app = App({"url": base}, seen=RECORD, client_id=CLIENT, redirect_uri=REDIRECT)
    s2s_before = provider.stats()["s2s"]["accepted"]

    step(1, "The app opens the in-app browser at Gatehouse's /oauth/authorize (PKCE S256); Gatehouse sends it to the provider.")
    started = requests.get(app.authorize_url(scope=None), allow_redirects=False, timeout=10)
    toward = started.headers.get("Location", "")
    cookie = re.search(rf"{SIGN_IN_COOKIE}=([^;]+)", started.headers.get("Set-Cookie", ""))
    cookie = cookie.group(1) if cookie else None
    if RECORD:
        RECORD.add(cookie, kind="central sign-in cookie (Gatehouse state)")
    detail(f"Gatehouse -> HTTP {started.status_code} to {toward.split('?')[0]}?{'&'.join(f'{k}={v}' for k, v in query(toward).items())}")
    detail(f"and sets its sign-in cookie ({SIGN_IN_COOKIE}, Secure, HttpOnly): {'yes' if cookie else 'NO'}")

    step(2, f"The person signs in at the provider (the sandbox signs {PERSON['name']} in at once); it returns a one-minute code.")
    back = requests.get(toward, allow_redirects=False, timeout=10)
    callback = back.headers.get("Location", "")
    if RECORD:
        RECORD.add(query(callback).get("code"), kind="central auth code")
    detail(f"GET {toward.split('?')[0]} -> HTTP {back.status_code} to {callback.split('?')[0]}?code={short(query(callback).get('code'))}")
    # The browser carries the Secure cookie back to Gatehouse (requests keeps Secure cookies off http: by hand).
    done = requests.get(callback, headers={"Cookie": f"{SIGN_IN_COOKIE}={cookie}", "Accept": "text/html"},
                        allow_redirects=False, timeout=30)
    location = done.headers.get("Location", "")
    received = query(location)
    if RECORD:
        RECORD.add(received.get("code"), kind="Gatehouse code")
    verified = provider.stats()["s2s"]["accepted"] - s2s_before
    detail(f"Gatehouse verified the code server to server (signed S2S call, accepted by the provider: {verified}) "
           f"-> HTTP {done.status_code} to {location.split('?')[0]}")
    state_ok = code_received(received, app.state) and done.status_code == 302

    step(3, "The app redeems the code at /oauth/token: Gatehouse mints the app's own tokens.")
    answer = app.redeem(received.get("code"))
    tokens = answer.json()
    detail(f"HTTP {answer.status_code}, Cache-Control: {answer.headers.get('Cache-Control')}")
    detail(f"access_token={short(tokens.get('access_token'))} (a JWT) refresh_token={short(tokens.get('refresh_token'))} "
           f"({len(tokens.get('refresh_token', ''))} characters) expires_in={tokens.get('expires_in')}")
    if answer.status_code != 200:
        return False

    step(4, "The access token is a JWT Gatehouse minted: its claims, verified with Gatehouse's JWKS.")
    header = jwt.get_unverified_header(tokens["access_token"])
    keys = requests.get(f"{base}/.well-known/jwks.json", timeout=10).json()["keys"]
    key = next((key for key in keys if key.get("kid") == header.get("kid")), None)
    detail(f"header: alg={header.get('alg')} typ={header.get('typ')} kid={header.get('kid')}")
    detail(f"GET /.well-known/jwks.json: {len(keys)} key(s); the kid is there: {key is not None}")
    try:
        claims = jwt.decode(tokens["access_token"], jwt.PyJWK(key).key, algorithms=["RS256"], issuer=APP, audience=APP,
                            options={"require": ["exp", "iat", "sub", "iss", "aud"]})
        detail("signature verified (PyJWT, RS256)")
    except Exception as error:  # noqa: BLE001  (shown, then the walkthrough fails)
        detail(f"NOT VERIFIED: {error}")
        claims = {}
    for name in ("iss", "aud", "sub", "iat", "exp"):
        detail(f"{name}: {claims.get(name)}")
    detail(f"data: {claims.get('data')}")
    data = claims.get("data", {})
    jwt_ok = verified == 1 and data.get("email") == PERSON["email"] and data.get("name") == PERSON["name"] \
        and claims.get("sub") == data.get("userId")

    step(5, "The app calls its backend through Gatehouse's route /api/tasks: the JWT is checked there, the backend gets who it is.")
    relayed, headers, authorization = relayed_call(base, "/api/tasks/42", tokens["access_token"], backend,
                                                   ("x-user-id", "x-user-email", "x-user-name", "x-sign-in-provider"))
    relay_ok = relayed.status_code == 200 and headers.get("x-user-id") == claims.get("sub") \
        and headers.get("x-user-email") == PERSON["email"] and not authorization

    step(6, "Later the app refreshes: a new pair (every use rotates the refresh token).")
    renewed = app.refresh(tokens["refresh_token"])
    pair = renewed.json()
    detail(f"HTTP {renewed.status_code}: access_token={short(pair.get('access_token'))} refresh_token={short(pair.get('refresh_token'))} "
           f"(a new one: {pair.get('refresh_token') not in (None, tokens['refresh_token'])})")
    refresh_ok = renewed.status_code == 200 and pair.get("refresh_token") != tokens["refresh_token"]

    step(7, "The app signs out: /oauth/revoke (RFC 7009) on its refresh token ends the session.")
    current = pair.get("refresh_token", tokens["refresh_token"])
    revoked = requests.post(f"{base}/oauth/revoke", data={"token": current, "client_id": CLIENT}, timeout=10)
    after = app.refresh(current)
    older = app.refresh(tokens["refresh_token"])
    detail(f"revoke: HTTP {revoked.status_code}; refreshing afterwards: HTTP {after.status_code} {after.json().get('error')}; "
           f"with the first refresh token: HTTP {older.status_code} {older.json().get('error')}")
    relay_after = requests.get(f"{base}/api/tasks/42", headers={"Authorization": f"Bearer {pair.get('access_token')}"}, timeout=10)
    detail(f"the relay with the last access token: HTTP {relay_after.status_code} "
           f"(a self-contained JWT, checked locally: it lives until its exp, {tokens.get('expires_in')} s at most)")
    logout_ok = revoked.status_code == 200 and after.status_code == 400 and older.status_code == 400
    return state_ok and jwt_ok and relay_ok and refresh_ok and logout_ok


def demo(data, stack):
    # The app's S2S key pair (its public half registered at the provider) and the key of the JWTs
    # Gatehouse mints: files in DATA, never in the configuration.
    s2s_key = private_key_file(data / "central-app-s2s.pem")
    public = public_key_file(s2s_key, data / "central-app-s2s.pub.pem")
    jwt_key = private_key_file(data / "central-jwt.pem")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    provider = stack.enter_context(centrald.start(data, "central", {
        "apps": {APP: centrald.app_config(base, public, mobile_scheme=APP)}, "defaultUser": PERSON}, env=dict(os.environ)))
    backend = EchoBackend()
    stack.callback(backend.stop)
    stack.callback(start_gatehouse(data, config(port, provider, backend, s2s_key, jwt_key), dict(os.environ)).stop)
    print(f"{BOLD}Gatehouse{RESET} {base} in front of the {BOLD}central sign-in provider{RESET} sandbox {provider.url}")
    print(f"{DIM}Files in {data}: gatehouse.yaml, gatehouse.sqlite, gatehouse.log, central.json, central.log, "
          f"central-app-s2s.pem, central-jwt.pem{RESET}")
    ok = walkthrough(base, provider, backend)

    def try_it():
        url = serve_loopback_app(base, CLIENT, None)
        print_try_it(url, f"The sandbox provider signs {PERSON['name']} in at once (Gatehouse's sign-in cookie is "
                          f"Secure: browsers keep it on http://127.0.0.1).")
    return ok, try_it


def main():
    return run(__doc__, ROOT / "demo-data/central", demo)


if __name__ == "__main__":
    sys.exit(main())
