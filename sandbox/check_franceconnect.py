"""Self-check of the FranceConnect double, with no Gatehouse: run with the venv's python; exits
non-zero on the first failure.

    .venv/bin/python sandbox/check_franceconnect.py

v2 (ES256, then RS256) and v1: discovery and JWKS, the authorization request's checks (each
malformed request gets the 400 HTML page, never a redirect), the login page ("Continuer",
"Annuler"), the code (single use, redirect_uri bound, PKCE), client_secret_post only, the ID
token (verified against the JWKS, or HS256 with the client secret for v1), no refresh token,
the signed userinfo, every fault knob, and /session/end (every parameter required).
"""

import base64
import hashlib
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the sandbox package

from sandbox import franceconnect as fcd  # noqa: E402

CALLBACK = "http://127.0.0.1:9/oauth/callback"
LOGOUT_CALLBACK = "http://127.0.0.1:9/oauth/logout/callback"
CLIENT, SECRET = "check-client", secrets.token_urlsafe(32)
CHECKS = []


def check(condition, what):
    if not condition:
        raise AssertionError(what)
    CHECKS.append(what)


def query(url):
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def authorize_url(double, **overrides):
    params = {"response_type": "code", "client_id": CLIENT, "redirect_uri": CALLBACK,
              "scope": " ".join(fcd.PIVOT_SCOPES), "acr_values": "eidas1",
              "state": secrets.token_urlsafe(32), "nonce": secrets.token_urlsafe(32)}
    params.update(overrides)
    return f"{double.issuer}/authorize?" + urlencode({k: v for k, v in params.items() if v is not None}), params


def sign_in(double, identity=0, **overrides):
    url, params = authorize_url(double, **overrides)
    browser = fcd.Browser(identity=identity)
    location = browser.follow(url, CALLBACK)
    check(isinstance(location, str), f"sign-in reaches the callback ({getattr(location, 'status_code', '')})")
    return browser, params, query(location)


def redeem(double, code, redirect_uri=CALLBACK, **extra):
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
            "client_id": CLIENT, "client_secret": SECRET, **extra}
    return requests.post(f"{double.issuer}/token", data=form, timeout=10)


def run_v2(workdir, alg):
    config = {"version": "v2", "alg": alg, "clients": [{"client_id": CLIENT, "client_secret": SECRET,
              "redirect_uris": [CALLBACK], "post_logout_redirect_uris": [LOGOUT_CALLBACK],
              "scopes": fcd.ALL_SCOPES}]}
    with fcd.start(workdir, f"fc-{alg}", config) as double:
        discovery = requests.get(f"{double.issuer}/.well-known/openid-configuration", timeout=10).json()
        check(discovery["issuer"] == double.issuer, "discovery issuer = the issuer")
        check(discovery["end_session_endpoint"] == double.issuer + "/session/end", "end_session_endpoint")
        check(discovery["token_endpoint_auth_methods_supported"] == ["client_secret_post", "private_key_jwt"], "auth methods")
        jwks = requests.get(discovery["jwks_uri"], timeout=10).json()
        check({k["alg"] for k in jwks["keys"]} == {"ES256", "RS256"}, "JWKS has an ES256 and an RS256 key")

        # Malformed authorization requests: the 400 HTML page, never a redirect.
        for name, overrides in [("unknown client", {"client_id": "nobody"}),
                                ("unregistered redirect_uri", {"redirect_uri": "http://127.0.0.1:9/elsewhere"}),
                                ("response_type token", {"response_type": "token"}),
                                ("no openid scope", {"scope": "given_name"}),
                                ("no acr_values", {"acr_values": None}), ("acr eidas2", {"acr_values": "eidas2"}),
                                ("short state", {"state": "x" * 31}), ("short nonce", {"nonce": "y" * 31}),
                                ("no state", {"state": None}), ("no nonce", {"nonce": None}),
                                ("prompt none", {"prompt": "none"}),
                                ("PKCE plain", {"code_challenge": "abc", "code_challenge_method": "plain"})]:
            url, _ = authorize_url(double, **overrides)
            answer = requests.get(url, allow_redirects=False, timeout=10)
            check(answer.status_code == 400 and "Location" not in answer.headers
                  and answer.headers["Content-Type"].startswith("text/html") and "Y0" in answer.text,
                  f"authorize, {name}: 400 HTML error page, no redirect")
        url, params = authorize_url(double, scope="openid given_name phone")
        answer = requests.get(url, allow_redirects=False, timeout=10)
        got = query(answer.headers["Location"])
        check(answer.status_code == 303 and got["error"] == "invalid_scope" and got["state"] == params["state"]
              and got["iss"] == double.issuer, "an unknown scope: invalid_scope redirect with state and iss")

        # Sign in, with PKCE and amr asked for.
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        browser, params, got = sign_in(double, identity=1, code_challenge=challenge, code_challenge_method="S256",
                                       claims=json.dumps({"id_token": {"amr": {"essential": True}}}), prompt="login consent")
        check(set(got) == {"code", "state", "iss"} and got["state"] == params["state"] and got["iss"] == double.issuer,
              "callback: code, state, iss")
        check(browser.cookie(), "the FranceConnect session cookie is set")
        stats = double.stats()
        asked = stats["authorize"][-1]
        check(asked["acr_values"] == "eidas1" and asked["state_length"] == len(params["state"]), "stats record the request")
        check(redeem(double, got["code"], code_verifier="wrong" * 10).json()["error"] == "invalid_grant", "PKCE checked")
        # the failed redemption used the code up
        check(redeem(double, got["code"], code_verifier=verifier).json()["error"] == "invalid_grant", "a code is single use")
        browser, params, got = sign_in(double, identity=1, code_challenge=challenge, code_challenge_method="S256")
        basic = requests.post(f"{double.issuer}/token", data={"grant_type": "authorization_code", "code": got["code"],
                              "redirect_uri": CALLBACK, "code_verifier": verifier}, auth=(CLIENT, SECRET), timeout=10)
        check(basic.status_code == 401 and basic.json()["error"] == "invalid_client", "client_secret_basic refused")
        browser, params, got = sign_in(double, identity=1)
        check(redeem(double, got["code"], redirect_uri=CALLBACK + "x").json()["error"] == "invalid_grant",
              "redirect_uri must match")
        browser, params, got = sign_in(double, identity=1)
        answer = redeem(double, got["code"])
        tokens = answer.json()
        check(answer.status_code == 200 and set(tokens) == {"access_token", "token_type", "expires_in", "id_token"}
              and tokens["expires_in"] == 60 and tokens["token_type"] == "Bearer", "token response, no refresh_token")
        header, claims = fcd.verify_jws(tokens["id_token"], jwks, algorithms=(alg,))
        check(header["alg"] == alg and claims["iss"] == double.issuer and claims["aud"] == CLIENT
              and claims["nonce"] == params["nonce"] and claims["acr"] == "eidas1"
              and claims["exp"] - claims["iat"] == 60 and claims["at_hash"] == fcd.half_hash(tokens["access_token"]),
              "ID token claims")
        check(claims["sub"] == double.identity(CLIENT, 1)["sub"] and claims["sub"].endswith("v1")
              and len(claims["sub"]) == 66, "pairwise sub, 64 hex + v1")
        info = requests.get(f"{double.issuer}/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10)
        check(info.headers["Content-Type"].startswith("application/jwt"), "userinfo is application/jwt")
        _, userinfo = fcd.verify_jws(info.text, jwks, algorithms=(alg,))
        check(userinfo["sub"] == claims["sub"] and userinfo["birthplace"] == "" and userinfo["birthcountry"] == "99134"
              and userinfo["iss"] == double.issuer and userinfo["aud"] == CLIENT and "email" not in userinfo,
              "userinfo: pivot claims as scoped, born abroad → empty birthplace")
        check(fcd.decode_jws(info.text)[1].decode() == double.stats()["userinfo_payloads"][-1],
              "stats keep the exact payload")
        refresh = requests.post(f"{double.issuer}/token", data={"grant_type": "refresh_token", "refresh_token": "x" * 40,
                                "client_id": CLIENT, "client_secret": SECRET}, timeout=10)
        check(refresh.json()["error"] == "unsupported_grant_type" and double.stats()["refresh_grants"] == 1,
              "refresh grants refused and counted")

        # Every ID token fault.
        for fault, test in [
            ("wrong_nonce", lambda h, c, p: c["nonce"] != p["nonce"]),
            ("missing_nonce", lambda h, c, p: "nonce" not in c),
            ("wrong_aud", lambda h, c, p: c["aud"] != CLIENT),
            ("multiple_aud", lambda h, c, p: c["aud"] == [CLIENT, "another-service-provider"] and "azp" not in c),
            ("wrong_iss", lambda h, c, p: c["iss"] != double.issuer),
            ("expired", lambda h, c, p: c["exp"] < time.time() - 600),
            ("iat_future", lambda h, c, p: c["iat"] > time.time() + 600),
            ("wrong_acr", lambda h, c, p: c["acr"] == "eidas2"),
            ("bad_at_hash", lambda h, c, p: c["at_hash"] != fcd.half_hash(p["access_token"])),
        ]:
            double.control(id_token=fault)
            _, params, got = sign_in(double)
            tokens = redeem(double, got["code"]).json()
            header, claims = fcd.verify_jws(tokens["id_token"], jwks, algorithms=(alg,))
            check(test(header, claims, {**params, **tokens}), f"id_token fault {fault}")
        for fault, expected in [("alg_none", "alg"), ("hs256_public_key", "alg"), ("unknown_kid", "kid"),
                                ("bad_signature", "signature"), ("alg_mismatch", "alg")]:
            double.control(id_token=fault)
            _, params, got = sign_in(double)
            token = redeem(double, got["code"]).json()["id_token"]
            try:
                fcd.verify_jws(token, jwks, algorithms=(alg,))
                failed = None
            except ValueError as error:
                failed = str(error)
            check(failed is not None and expected in failed, f"id_token fault {fault} fails verification on {expected}")
            if fault == "hs256_public_key":
                header = fcd.decode_jws(token)[0]
                check(header["alg"] == "HS256", "hs256_public_key is HS256")
        before = double.stats()["jwks_fetches"]
        double.control(id_token="rotated_kid")
        _, params, got = sign_in(double)
        token = redeem(double, got["code"]).json()["id_token"]
        fresh = requests.get(discovery["jwks_uri"], timeout=10).json()
        check(fcd.verify_jws(token, fresh, algorithms=(alg,))[1]["nonce"] == params["nonce"]
              and double.stats()["jwks_fetches"] == before + 1, "rotated_kid: verifies against the refetched JWKS")
        double.control(jwks="unavailable")
        check(requests.get(discovery["jwks_uri"], timeout=10).status_code == 503, "JWKS unavailable → 503")
        double.control(jwks="available")

        # Userinfo faults.
        for fault in ["bad_signature", "other_sub"]:
            double.control(userinfo=fault)
            _, params, got = sign_in(double)
            tokens = redeem(double, got["code"]).json()
            jwt = requests.get(f"{double.issuer}/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"},
                               timeout=10).text
            if fault == "bad_signature":
                try:
                    fcd.verify_jws(jwt, fresh, algorithms=(alg,))
                    ok = False
                except ValueError:
                    ok = True
                check(ok, "userinfo bad_signature fails verification")
            else:
                sub = fcd.verify_jws(jwt, fresh, algorithms=(alg,))[1]["sub"]
                check(sub != fcd.decode_jws(tokens["id_token"])[1] and sub != double.identity(CLIENT)["sub"],
                      "userinfo other_sub")
        # Expiry and access token lifetime.
        double.control(access_token_lifetime=1)
        _, params, got = sign_in(double)
        tokens = redeem(double, got["code"]).json()
        check(tokens["expires_in"] == 1, "access_token_lifetime knob")
        double.control(expire_access_tokens=True)
        dead = requests.get(f"{double.issuer}/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10)
        check(dead.status_code == 401 and 'error="invalid_token"' in dead.headers["WWW-Authenticate"]
              and not double.stats()["last_access_token_alive"], "an expired access token: 401 invalid_token")
        double.control(access_token_lifetime=60)

        # Callback iss knob, authorize errors, cancel.
        double.control(callback={"iss": "http://127.0.0.1:9/api/v2"})
        _, _, got = sign_in(double)
        check(got["iss"] == "http://127.0.0.1:9/api/v2", "callback iss knob")
        double.control(callback="omit_iss")
        _, _, got = sign_in(double)
        check("iss" not in got, "callback omit_iss knob")
        for error in ["server_error", "temporarily_unavailable", "invalid_request"]:
            double.control(authorize_error=error)
            url, params = authorize_url(double)
            got = query(requests.get(url, allow_redirects=False, timeout=10).headers["Location"])
            check(got["error"] == error and got["state"] == params["state"], f"authorize_error {error}")
        url, params = authorize_url(double)
        canceller = fcd.Browser(cancel=True)
        got = query(canceller.follow(url, CALLBACK))
        check(got == {"error": "access_denied", "error_description": "User auth aborted", "state": params["state"],
                      "iss": double.issuer}, "Annuler: access_denied with state and iss")

        # Logout.
        browser, params, got = sign_in(double)
        tokens = redeem(double, got["code"]).json()
        end = f"{double.issuer}/session/end"
        complete = {"id_token_hint": tokens["id_token"], "state": secrets.token_urlsafe(32),
                    "post_logout_redirect_uri": LOGOUT_CALLBACK}
        for missing in ["id_token_hint", "state", "post_logout_redirect_uri"]:
            answer = requests.get(end + "?" + urlencode({k: v for k, v in complete.items() if k != missing}),
                                  allow_redirects=False, timeout=10)
            check(answer.status_code == 400 and "Location" not in answer.headers, f"session/end without {missing}: 400 page")
        for name, changed in [("unregistered uri", {"post_logout_redirect_uri": "http://127.0.0.1:9/other"}),
                              ("forged hint", {"id_token_hint": tokens["id_token"][:-4] + "AAAA"})]:
            answer = requests.get(end + "?" + urlencode({**complete, **changed}), allow_redirects=False, timeout=10)
            check(answer.status_code == 400 and "Location" not in answer.headers, f"session/end {name}: 400 page")
        location = browser.follow(end + "?" + urlencode(complete), LOGOUT_CALLBACK)
        check(query(location) == {"state": complete["state"]}, "session/end redirects with the state")
        entry = double.stats()["session_end"][-1]
        check(entry["had_session_cookie"] and entry["id_token_hint_issued"] and entry["outcome"] == "redirect",
              "session/end saw the session cookie and a hint it issued")
        check(browser.cookie() is None, "the session cookie is gone")


def run_v1(workdir):
    config = {"version": "v1", "clients": [{"client_id": CLIENT, "client_secret": SECRET, "redirect_uris": [CALLBACK],
                                            "post_logout_redirect_uris": [LOGOUT_CALLBACK]}]}
    with fcd.start(workdir, "fc-v1", config) as double:
        check(double.issuer.endswith("/api/v1") and double.id_token_iss == double.url, "v1 base and iss")
        check(requests.get(f"{double.issuer}/.well-known/openid-configuration", timeout=10).status_code == 404, "no discovery in v1")
        browser, params, got = sign_in(double, acr_values=None)
        check(set(got) == {"code", "state"}, "v1 callback: no iss")
        tokens = redeem(double, got["code"]).json()
        header, claims = fcd.verify_jws(tokens["id_token"], hmac_key=SECRET.encode(), algorithms=("HS256",))
        check(header == {"typ": "JWT", "alg": "HS256"} and claims["iss"] == double.url and claims["aud"] == CLIENT
              and claims["nonce"] == params["nonce"], "v1 ID token: HS256 with the client secret, iss = origin")
        info = requests.get(f"{double.issuer}/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"}, timeout=10)
        check(info.headers["Content-Type"].startswith("application/json") and info.json()["sub"] == claims["sub"]
              and info.content.decode() == double.stats()["userinfo_payloads"][-1], "v1 userinfo is JSON")
        double.control(id_token="hs256_wrong_secret")
        _, _, got = sign_in(double)
        bad = redeem(double, got["code"]).json()["id_token"]
        try:
            fcd.verify_jws(bad, hmac_key=SECRET.encode(), algorithms=("HS256",))
            ok = False
        except ValueError:
            ok = True
        check(ok, "v1 hs256_wrong_secret fails")
        location = browser.follow(f"{double.issuer}/logout?" + urlencode(
            {"id_token_hint": tokens["id_token"], "state": "s" * 40, "post_logout_redirect_uri": LOGOUT_CALLBACK}), LOGOUT_CALLBACK)
        check(query(location) == {"state": "s" * 40}, "v1 logout")


def main():
    with tempfile.TemporaryDirectory() as directory:
        workdir = Path(directory)
        run_v2(workdir, "ES256")
        run_v2(workdir, "RS256")
        run_v1(workdir)
        for log in workdir.glob("*.log"):
            text = log.read_text()
            check("Traceback" not in text, f"{log.name}: no traceback")
    print(f"{len(CHECKS)} checks passed, 0 failed")


if __name__ == "__main__":
    main()
