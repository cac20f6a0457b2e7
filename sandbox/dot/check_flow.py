"""End-to-end self-check of serve.py: run with the venv's python, exits non-zero on failure.

Starts the server with demo-config.json, then plays browser + client:
authorization code (+ PKCE, + OIDC), refresh rotation, reuse detection,
introspection, revocation and a few error cases.
"""

import base64
import hashlib
import html
import json
import os
import re
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import requests
from jwcrypto import jwk, jwt

HERE = Path(__file__).resolve().parent
CALLBACK = "http://127.0.0.1:8080/oauth/callback"
SECRETS = {
    "UPSTREAM_SECRET_LEGACY": "legacy-secret",
    "UPSTREAM_SECRET_PKCE": "pkce-secret",
    "UPSTREAM_SECRET_OIDC": "oidc-secret",
    "UPSTREAM_SECRET_RS": "rs-secret",
}
ALICE = ("alice", "wonderland-42")


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def step(message):
    print(f"-- {message}", flush=True)


def authorize(base, browser, params):
    """Drive /o/authorize/ like a browser (logging in as alice when asked).

    Returns the query parameters of the redirect to params["redirect_uri"].
    """
    url = f"{base}/o/authorize/?{urlencode(params)}"
    response = browser.get(url, allow_redirects=False)
    for _ in range(10):
        if response.is_redirect:
            url = urljoin(url, response.headers["Location"])
            if url.startswith(params["redirect_uri"]):
                print(f"   302 -> {url}")
                return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
            print(f"   {response.status_code} -> {url}")
            response = browser.get(url, allow_redirects=False)
        elif 'name="csrfmiddlewaretoken"' in response.text and 'name="password"' in response.text:
            field = lambda name: html.unescape(re.search(f'name="{name}" value="([^"]*)"', response.text).group(1))
            csrf, nxt = field("csrfmiddlewaretoken"), field("next")
            print(f"   login form at {url} (next={nxt})")
            form = {"csrfmiddlewaretoken": csrf, "username": ALICE[0], "password": ALICE[1], "next": nxt}
            response = browser.post(url, data=form, allow_redirects=False)
        else:
            raise CheckFailed(f"stuck at {url}: {response.status_code} {response.text[:300]}")
    raise CheckFailed("too many redirects")


def token(base, data, auth=None):
    response = requests.post(f"{base}/o/token/", data=data, auth=auth)
    print(f"   token {data['grant_type']} -> {response.status_code} {response.text[:160]}")
    return response


def introspect(base, tok, **kw):
    response = requests.post(f"{base}/o/introspect/", data={"token": tok}, **kw)
    expect(response.status_code == 200, f"introspection failed: {response.status_code} {response.text}")
    return response.json()


def pkce_pair():
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def check_legacy(base):
    legacy = ("gatehouse-legacy", SECRETS["UPSTREAM_SECRET_LEGACY"])
    rs = ("resource-server", SECRETS["UPSTREAM_SECRET_RS"])
    browser = requests.Session()

    step("legacy client: authorization code without PKCE")
    params = {"response_type": "code", "client_id": legacy[0], "redirect_uri": CALLBACK,
              "state": "xyz", "scope": "read"}
    result = authorize(base, browser, params)
    expect(result.get("state") == "xyz" and "code" in result, f"bad callback {result}")

    step("exchange code (client_secret_basic)")
    r = token(base, {"grant_type": "authorization_code", "code": result["code"], "redirect_uri": CALLBACK}, legacy)
    expect(r.status_code == 200, "code exchange failed")
    first = r.json()
    expect(first["token_type"] == "Bearer" and first["scope"] == "read" and first["refresh_token"], "bad tokens")
    expect("id_token" not in first, "plain OAuth client got an id_token")

    step("replay the authorization code -> invalid_grant")
    r = token(base, {"grant_type": "authorization_code", "code": result["code"], "redirect_uri": CALLBACK}, legacy)
    expect(r.status_code == 400 and r.json()["error"] == "invalid_grant", "code replay accepted")

    step("introspect with resource-server client credentials (HTTP Basic)")
    info = introspect(base, first["access_token"], auth=rs)
    print(f"   {info}")
    expect(info["active"] and info["username"] == "alice" and info["client_id"] == legacy[0], "bad introspection")

    step("introspect with a Bearer token carrying scope 'introspection' (client_credentials)")
    r = token(base, {"grant_type": "client_credentials", "scope": "introspection"}, rs)
    expect(r.status_code == 200, "client_credentials failed")
    bearer = {"Authorization": f"Bearer {r.json()['access_token']}"}
    expect(introspect(base, first["access_token"], headers=bearer)["active"], "bearer introspection failed")

    step("scope 'introspection' is refused to clients without the flag")
    result = authorize(base, browser, {**params, "scope": "read introspection"})
    expect(result.get("error") == "invalid_scope", f"introspection scope leaked: {result}")

    step("refresh (client_secret_post)")
    r = token(base, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"],
                     "client_id": legacy[0], "client_secret": legacy[1]})
    expect(r.status_code == 200, "refresh failed")
    second = r.json()
    expect(second["refresh_token"] != first["refresh_token"], "refresh token was not rotated")
    expect(not introspect(base, first["access_token"], auth=rs)["active"], "old access token still active")

    step("present the FIRST refresh token again -> 400 invalid_grant")
    r = token(base, {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}, legacy)
    expect(r.status_code == 400 and r.json()["error"] == "invalid_grant", "rotated refresh token reused")

    step("wrong client secret -> 401 invalid_client")
    r = token(base, {"grant_type": "refresh_token", "refresh_token": second["refresh_token"]}, (legacy[0], "nope"))
    expect(r.status_code == 401 and r.json()["error"] == "invalid_client", "bad secret accepted")

    step("revoke the current refresh token, then it is dead")
    r = requests.post(f"{base}/o/revoke_token/", data={"token": second["refresh_token"],
                      "token_type_hint": "refresh_token"}, auth=legacy)
    expect(r.status_code == 200, f"revocation failed: {r.status_code} {r.text}")
    r = token(base, {"grant_type": "refresh_token", "refresh_token": second["refresh_token"]}, legacy)
    expect(r.status_code == 400 and r.json()["error"] == "invalid_grant", "revoked refresh token accepted")

    step("unregistered redirect_uri is never redirected to")
    r = browser.get(f"{base}/o/authorize/", allow_redirects=False,
                    params={**params, "redirect_uri": "http://127.0.0.1:9/evil"})
    title = re.search(r"<h2>(.*?)</h2>", r.text, re.S)
    print(f"   {r.status_code} {r.headers.get('Location')} {title and title.group(1).strip()!r}")
    expect(r.status_code == 400 and "Location" not in r.headers, "redirected to an unregistered URI")

    step("custom-scheme redirect_uri (native app)")
    result = authorize(base, browser, {**params, "redirect_uri": "com.example.app:/oauth2redirect"})
    expect("code" in result, "custom scheme redirect failed")


def check_pkce(base):
    client = ("gatehouse-pkce", SECRETS["UPSTREAM_SECRET_PKCE"])
    browser = requests.Session()
    params = {"response_type": "code", "client_id": client[0], "redirect_uri": CALLBACK, "state": "p1"}

    step("PKCE client without code_challenge -> error redirect")
    result = authorize(base, browser, params)
    expect(result.get("error") == "invalid_request" and "code" not in result, f"no PKCE error: {result}")

    step("PKCE client with S256")
    verifier, challenge = pkce_pair()
    result = authorize(base, browser, {**params, "code_challenge": challenge, "code_challenge_method": "S256"})
    expect("code" in result and result["state"] == "p1", f"bad callback {result}")
    exchange = {"grant_type": "authorization_code", "code": result["code"], "redirect_uri": CALLBACK}
    r = token(base, {**exchange, "code_verifier": "x" * 43}, client)
    expect(r.status_code == 400 and r.json()["error"] == "invalid_grant", "wrong verifier accepted")
    r = token(base, {**exchange, "code_verifier": verifier}, client)
    expect(r.status_code == 200 and r.json()["scope"] == "read write", "PKCE exchange failed (default scope)")


def check_oidc(base):
    client = ("gatehouse-oidc", SECRETS["UPSTREAM_SECRET_OIDC"])
    browser = requests.Session()

    step("OIDC discovery + JWKS")
    discovery = requests.get(f"{base}/o/.well-known/openid-configuration").json()
    print(f"   issuer={discovery['issuer']} jwks_uri={discovery['jwks_uri']}")
    expect(discovery["issuer"] == f"{base}/o", "unexpected issuer")
    keys = jwk.JWKSet.from_json(requests.get(discovery["jwks_uri"]).text)

    step("OIDC client: code + PKCE + nonce, scope 'openid profile email'")
    verifier, challenge = pkce_pair()
    result = authorize(base, browser, {
        "response_type": "code", "client_id": client[0], "redirect_uri": CALLBACK, "state": "o1",
        "scope": "openid profile email", "nonce": "n-0S6", "code_challenge": challenge,
        "code_challenge_method": "S256"})
    r = token(base, {"grant_type": "authorization_code", "code": result["code"], "redirect_uri": CALLBACK,
                     "code_verifier": verifier}, client)
    expect(r.status_code == 200 and "id_token" in r.json(), "no id_token")
    tokens = r.json()
    claims = json.loads(jwt.JWT(jwt=tokens["id_token"], key=keys, expected_type="JWS").claims)
    print(f"   id_token claims: {claims}")
    expect(claims["iss"] == discovery["issuer"] and claims["aud"] == client[0], "bad iss/aud")
    expect(claims["nonce"] == "n-0S6" and claims["email"] == "alice@example.test", "bad nonce/email")

    step("userinfo")
    r = requests.get(discovery["userinfo_endpoint"], headers={"Authorization": f"Bearer {tokens['access_token']}"})
    print(f"   {r.status_code} {r.text}")
    expect(r.status_code == 200 and r.json()["sub"] == claims["sub"], "userinfo failed")

    step("OIDC refresh returns a new id_token")
    r = token(base, {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]}, client)
    expect(r.status_code == 200 and "id_token" in r.json(), "no id_token on refresh")


def check_concurrency(base, n=60):
    step(f"{n} concurrent token + introspection requests")
    rs = ("resource-server", SECRETS["UPSTREAM_SECRET_RS"])

    def one(_):
        r = requests.post(f"{base}/o/token/", data={"grant_type": "client_credentials"}, auth=rs)
        return r.status_code == 200 and introspect(base, r.json()["access_token"], auth=rs)["active"]

    with ThreadPoolExecutor(max_workers=n) as pool:
        ok = sum(pool.map(one, range(n)))
    print(f"   {ok}/{n} succeeded")
    expect(ok == n, "concurrent requests failed")


def main():
    env = {**os.environ, **SECRETS}
    cmd = [sys.executable, str(HERE / "serve.py"), "--config", str(HERE / "demo-config.json"), "--port", "0", "--quiet"]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        expect(line, "server exited before becoming ready")
        ready = json.loads(line)
        expect(ready["ready"] is True, f"unexpected ready line {line!r}")
        base = ready["url"]
        step(f"server ready at {base}")
        check_legacy(base)
        check_pkce(base)
        check_oidc(base)
        check_concurrency(base)
    except (CheckFailed, requests.RequestException, KeyError, ValueError) as e:
        print(f"FAIL: {type(e).__name__}: {e}", flush=True)
        return 1
    finally:
        server.terminate()
        code = server.wait(timeout=10)
    if code != 0:
        print(f"FAIL: server exited with {code} on SIGTERM")
        return 1
    print("OK: all upstream checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
