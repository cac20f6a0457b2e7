"""Gatehouse demo with FranceConnect: Gatehouse (SQLite) in front of the local FranceConnect v2
look-alike (sandbox/franceconnect/, built from FranceConnect's service-provider documentation),
a native app simulated step by step: sign-in, the app's tokens, /userinfo, a relayed call to a
small local backend, and the logout through FranceConnect. Run through `scripts/demo franceconnect`;
--no-wait ends after the walkthrough."""

import os
import secrets
import sys
from pathlib import Path
from urllib.parse import urlencode

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (BOLD, DIM, RECORD, RESET, ROOT, EchoBackend, code_received, detail, free_port, print_try_it,  # noqa: E402
                    query, relayed_call, run, serve_loopback_app, short, sqlite_server, start_gatehouse, step)
from sandbox.nativeapp import App  # noqa: E402
from sandbox import franceconnect as fcd  # noqa: E402

CLIENT = "com.example.myapp"
REDIRECT = "com.example.myapp:/oauth2redirect"
SIGNED_OUT = "com.example.myapp:/signed-out"
SCOPES = ["openid", "given_name", "family_name", "birthdate", "gender", "birthplace", "birthcountry", "email"]
FS_CLIENT = "gatehouse-demo"  # Gatehouse's client id at FranceConnect (its "fournisseur de service")
SECRET_ENV = "DEMO_FRANCECONNECT_SECRET"
IDENTITY = 0  # the sandbox person the demo picks on FranceConnect's login page


def config(port, provider, backend):
    """Gatehouse's configuration: deploy/franceconnect-v2.example.yaml on 127.0.0.1, in front of the sandbox."""
    upstream = fcd.gatehouse_upstream("franceconnect", provider, FS_CLIENT, SECRET_ENV, f"""
    acr_values: eidas1
    id_token_signing_alg: ES256
    scopes: [{", ".join(SCOPES)}]
    identity:
      kind: session
      attributes:
        given_name: /given_name
        family_name: /family_name
        birthdate: /birthdate""")
    return "# Written by scripts/demo franceconnect. See deploy/franceconnect-v2.example.yaml." + sqlite_server(port) + f"""
sessions:
  encryption_keys_file: session-keys
  access_token_lifetime: 5m
  refresh_token_lifetime: 12h
upstreams:{upstream}
clients:
  - client_id: {CLIENT}
    upstream: franceconnect
    wiring: callback
    token_exposure: sealed
    scopes: [{", ".join(SCOPES)}]
    redirect_uris: ["{REDIRECT}", "http://127.0.0.1/callback"]
    post_logout_redirect_uris: ["{SIGNED_OUT}"]
routes:
  - prefix: /api/demarches
    backend: {backend.url}/demarches
    methods: [GET, HEAD, POST]
    upstream: franceconnect
    identity_headers:
      X-Subject: subject
      X-Given-Name: given_name
      X-Family-Name: family_name
      X-Birthdate: birthdate
    authorization: remove
"""


def walkthrough(base, provider, backend):
    app = App({"url": base}, seen=RECORD, client_id=CLIENT, redirect_uri=REDIRECT)
    browser = fcd.Browser(identity=IDENTITY)

    step(1, "The app opens the in-app browser at Gatehouse's /oauth/authorize (PKCE S256, FranceConnect's scopes).")
    url = app.authorize_url(scope=" ".join(SCOPES))
    first = browser.session.get(url, allow_redirects=False, timeout=10)
    toward = first.headers.get("Location", "")
    asked = query(toward)
    if RECORD:
        RECORD.add(asked.get("state"), asked.get("nonce"), kind="Gatehouse state toward the upstream")
    detail(f"Gatehouse -> HTTP {first.status_code} to {toward.split('?')[0]}")
    detail(f"it asks FranceConnect for acr_values={asked.get('acr_values')}, scope={asked.get('scope')}, "
           f"state and nonce of {len(asked.get('state', ''))} and {len(asked.get('nonce', ''))} characters")

    step(2, "The person picks an identity on FranceConnect's page and presses \"Continuer\"; FranceConnect returns to Gatehouse.")
    location = browser.follow(toward, REDIRECT)
    if not isinstance(location, str):
        detail(f"the sign-in stopped at HTTP {location.status_code}: {location.text[:300]}")
        return False
    for visited in browser.visited:
        detail(visited)
    received = query(location)
    if RECORD:
        RECORD.add(received.get("code"), kind="Gatehouse code")
    state_ok = code_received(received, app.state)

    step(3, "The app redeems the code at /oauth/token: Gatehouse's own tokens (FranceConnect's stay sealed in Gatehouse).")
    answer = app.redeem(received.get("code"))
    tokens = answer.json()
    detail(f"HTTP {answer.status_code}, Cache-Control: {answer.headers.get('Cache-Control')}")
    detail(f"access_token={short(tokens.get('access_token'))} refresh_token={short(tokens.get('refresh_token'))} "
           f"expires_in={tokens.get('expires_in')} token_type={tokens.get('token_type')}")
    if answer.status_code != 200:
        return False
    jwks = requests.get(f"{base}/.well-known/jwks.json", timeout=10).json()
    header, id_claims = fcd.verify_jws(tokens["id_token"], jwks, algorithms=("ES256",))
    detail(f"id_token: Gatehouse's own, {header['alg']}, verified with Gatehouse's JWKS: "
           f"iss={id_claims['iss']} aud={id_claims['aud']} sub={id_claims['sub'][:16]}…")
    person = provider.identity(FS_CLIENT, IDENTITY)
    tokens_ok = tokens["access_token"].startswith("gha_") and tokens["refresh_token"].startswith("ghr_") \
        and id_claims["sub"] == person["sub"]

    step(4, "The app asks Gatehouse's /userinfo: the identity FranceConnect gave, from the session (no call to FranceConnect).")
    before = provider.stats()["userinfo_requests"]
    info = requests.get(f"{base}/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10)
    claims = info.json() if info.status_code == 200 else {}
    detail(f"GET /userinfo -> HTTP {info.status_code}")
    for name in ("given_name", "family_name", "birthdate", "gender", "birthplace", "birthcountry", "email"):
        detail(f"{name}: {claims.get(name)!r}")
    detail(f"sub matches the ID token's: {claims.get('sub') == id_claims['sub']}; "
           f"userinfo calls to FranceConnect meanwhile: {provider.stats()['userinfo_requests'] - before}")
    userinfo_ok = info.status_code == 200 and claims.get("sub") == person["sub"] \
        and claims.get("family_name") == person["family_name"]

    step(5, "The app calls its backend through Gatehouse's route /api/demarches: the backend gets who it is, not the token.")
    relayed, headers, authorization = relayed_call(base, "/api/demarches/42", tokens["access_token"], backend,
                                                   ("x-subject", "x-given-name", "x-family-name", "x-birthdate"))
    relay_ok = relayed.status_code == 200 and headers.get("x-subject") == person["sub"] \
        and headers.get("x-family-name") == person["family_name"] and not authorization

    step(6, "The app signs out: /oauth/logout sends the browser to FranceConnect's /session/end, and back to the app.")
    logout_state = secrets.token_urlsafe(16)
    logout = f"{base}/oauth/logout?" + urlencode({"client_id": CLIENT, "post_logout_redirect_uri": SIGNED_OUT,
                                                  "state": logout_state, "id_token_hint": tokens["id_token"]})
    browser.visited.clear()
    back = browser.follow(logout, SIGNED_OUT)
    for visited in browser.visited:
        detail(visited)
    ended = provider.stats()["session_end"][-1] if provider.stats()["session_end"] else {}
    back_ok = isinstance(back, str) and query(back) == {"state": logout_state}
    detail(f"the app is back at {SIGNED_OUT} with its own state: {back_ok}; FranceConnect's session ended: "
           f"{ended.get('outcome') == 'redirect'} (its cookie left: {browser.cookie() is not None})")
    after_info = requests.get(f"{base}/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10)
    after_refresh = app.refresh(tokens["refresh_token"])
    detail(f"afterwards: /userinfo HTTP {after_info.status_code}; refreshing: HTTP {after_refresh.status_code} "
           f"{after_refresh.json().get('error')}")
    logout_ok = back_ok and after_info.status_code == 401 and after_refresh.status_code == 400
    return state_ok and tokens_ok and userinfo_ok and relay_ok and logout_ok


def demo(data, stack):
    env = dict(os.environ, **{SECRET_ENV: secrets.token_urlsafe(32)})  # FranceConnect's client secret: never in a file
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    provider = stack.enter_context(fcd.start(data, "franceconnect", {"version": "v2", "alg": "ES256", "clients": [{
        "client_id": FS_CLIENT, "client_secret_env": SECRET_ENV, "name": "Gatehouse (demo)",
        "redirect_uris": [f"{base}/oauth/callback"], "post_logout_redirect_uris": [f"{base}/oauth/logout/callback"]}]}, env))
    backend = EchoBackend()
    stack.callback(backend.stop)
    stack.callback(start_gatehouse(data, config(port, provider, backend), env).stop)
    print(f"{BOLD}Gatehouse{RESET} {base} in front of the {BOLD}FranceConnect v2{RESET} sandbox {provider.issuer}")
    print(f"{DIM}Files in {data}: gatehouse.yaml, gatehouse.sqlite, gatehouse.log, franceconnect.json, franceconnect.log{RESET}")
    ok = walkthrough(base, provider, backend)

    def try_it():
        url = serve_loopback_app(base, CLIENT, " ".join(SCOPES))
        print_try_it(url, "On FranceConnect's page pick a person and press \"Continuer\".")
    return ok, try_it


def main():
    return run(__doc__, ROOT / "demo-data/franceconnect", demo)


if __name__ == "__main__":
    sys.exit(main())
