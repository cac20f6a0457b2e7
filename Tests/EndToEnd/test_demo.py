"""The README's demo command runs its walkthrough to the end (what a new user sees first), and
every step says what it showed: the sign-in, the refresh, and the myVOO data calls (1a-1b: no
token, 401 and where to sign in; 6a-6b: the data with the caller's BPId, the second call from
the identity cache, a user whose BPId is inactive refused).

The demo writes its files (its Gatehouse's and its upstream's logs, its database, its key ring)
under the run's workdir, so the last test of the suite (test_zz) searches them too; this test
also checks them itself, with every secret the demo's upstream and app recorded.

`scripts/demo franceconnect` and `scripts/demo central` (deploy/demo/franceconnect.py, central.py,
in front of the sandbox/ look-alikes) run the same way, each step checked: the sign-in, the app's
tokens, /userinfo (FranceConnect) or the minted JWT verified with Gatehouse's JWKS (central), the
relayed call with the identity headers, and the logout that ends the session."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from sandbox.gatelog import fields, message

ROOT = Path(__file__).resolve().parents[2]


def step(stdout, label, title_words):
    """The detail lines printed under the step `[label] …title_words…`."""
    match = re.search(rf"^\[{re.escape(label)}\] [^\n]*{re.escape(title_words)}[^\n]*\n((?:    [^\n]*\n)+)", stdout, re.MULTILINE)
    assert match, f"the walkthrough printed no step [{label}] … {title_words} …"
    return match.group(1)


def test_demo_walkthrough_completes(workdir, seen):
    data = workdir / "demo"
    recorded_before = len(seen.record.read_text().splitlines())
    result = subprocess.run([sys.executable, str(ROOT / "deploy/demo/walkthrough.py"), "--no-wait", "--data", str(data)],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ))
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "Walkthrough complete." in out
    port = re.search(r"Gatehouse\S* http://127\.0\.0\.1:(\d+)", out).group(1)

    # 1a-1b: a data call without a token is refused, and the answer says where to sign in.
    anonymous = step(out, "1a-1b", "asks for data anyway")
    assert "GET /api/contracts/42 -> HTTP 401 invalid_token" in anonymous
    assert 'WWW-Authenticate: Bearer realm="gatehouse"' in anonymous
    assert f"sign_in: authorization_endpoint http://127.0.0.1:{port}/oauth/authorize, client_id com.example.app" in anonymous
    assert f"sign_in.url: http://127.0.0.1:{port}/oauth/authorize?response_type=code&client_id=com.example.app" in anonymous

    # The sign-in, the refresh and its retry, the stolen code.
    assert "its own state back: matches" in step(out, "3b-4c", "signs in at the upstream")
    assert "HTTP 200, Cache-Control: no-store" in step(out, "5a", "redeems the code")
    assert "HTTP 200, the same pair" in step(out, "5a", "burns a refresh token")
    assert "wrong code_verifier: HTTP 400 invalid_grant" in step(out, "PKCE", "stolen")

    # 6a-6b: the data, with the caller's BPId; the second call from the cache; an inactive BPId refused.
    data_call = step(out, "6a-6b", "gets its data")
    assert "GET /api/contracts/42 -> HTTP 200; the backend received X-BPId: 1000123" in data_call
    assert "no Authorization header: True" in data_call
    cached = step(out, "6a-6b", "identity cache")
    assert "HTTP 200; identity service calls for this token: 1;" in cached
    assert "Gatehouse's log: relay=fast" in cached
    inactive = step(out, "6a-6b", "not active")
    assert "HTTP 403 forbidden:" in inactive and "bpid_status" in inactive

    # The sealed app's part.
    assert "the same pair" in step(out, "5a", "rotates Gatehouse's tokens")
    assert "refreshing afterwards: HTTP 400 invalid_grant" in step(out, "RFC 7009", "signs out")

    # Gatehouse's own log agrees: the four data calls, in order, and which path served them.
    log = (data / "gatehouse.log").read_text()
    calls = [fields(line) for line in log.splitlines()
             if message(line) == "request" and fields(line).get("path", "").startswith("/api/contracts")]
    assert [(call["status"], call.get("relay")) for call in calls] == \
        [("401", "general"), ("200", "general"), ("200", "fast"), ("403", "general")], calls

    # Nothing secret in the demo's logs or database (test_zz searches them again at the end).
    seen.add_key_ring(data / "session-keys")
    seen.harvest()
    demo_kinds = {json.loads(line)["kind"] for line in seen.record.read_text().splitlines()[recorded_before:]}
    assert {"Gatehouse code", "app PKCE verifier", "upstream access token", "upstream refresh token",
            "upstream client secret", "Gatehouse refresh token", "Gatehouse state toward the upstream",
            "upstream authorization code"} <= demo_kinds, "the demo's upstream and app recorded their secrets"
    logs = sorted(data.glob("*.log"))
    assert {path.name for path in logs} >= {"gatehouse.log", "upstream.log"}
    assert [f"{path.name}: {kind} ({form})" for path in logs for kind, form in seen.find(path.read_bytes())] == []
    assert seen.find_in_sqlite(data / "gatehouse.sqlite") == []


def run_demo(script, data, seen):
    """Runs deploy/demo/SCRIPT --no-wait --data DATA; its stdout, once it completed, and the kinds of
    secret the demo's app and provider recorded meanwhile."""
    recorded_before = len(seen.record.read_text().splitlines())
    result = subprocess.run([sys.executable, str(ROOT / "deploy/demo" / script), "--no-wait", "--data", str(data)],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Walkthrough complete." in result.stdout
    kinds = {json.loads(line)["kind"] for line in seen.record.read_text().splitlines()[recorded_before:]}
    return result.stdout, kinds


def banner(out, sandbox):
    """Gatehouse's port and the sandbox provider's URL, from the demo's first line."""
    match = re.search(rf"Gatehouse\S* http://127\.0\.0\.1:(\d+) in front of the \S*{sandbox}\S* sandbox (http://127\.0\.0\.1:\d+)", out)
    assert match, out[:500]
    return match.groups()


def assert_no_secret_in(data, seen, logs):
    """The demo's logs and database hold none of the run's secrets (test_zz searches them again)."""
    seen.add_key_ring(data / "session-keys")
    seen.harvest()
    found = sorted(data.glob("*.log"))
    assert {path.name for path in found} >= set(logs)
    assert [f"{path.name}: {kind} ({form})" for path in found for kind, form in seen.find(path.read_bytes())] == []
    assert seen.find_in_sqlite(data / "gatehouse.sqlite") == []


def test_franceconnect_demo_walks_sign_in_tokens_userinfo_relay_and_logout(workdir, seen):
    data = workdir / "demo-franceconnect"
    out, kinds = run_demo("franceconnect.py", data, seen)
    assert {"Gatehouse code", "app PKCE verifier", "Gatehouse access token", "Gatehouse refresh token"} <= kinds, kinds
    port, provider = banner(out, "FranceConnect v2")
    assert f"sandbox {provider}/api/v2" in out
    config = (data / "gatehouse.yaml").read_text()
    assert "kind: franceconnect" in config and "client_secret_env: DEMO_FRANCECONNECT_SECRET" in config
    assert "client_secret:" not in config

    # 1-2: Gatehouse asks FranceConnect as documented; the person clicks "Continuer"; back to the app.
    asked = step(out, "1", "/oauth/authorize")
    assert f"HTTP 302 to {provider}/api/v2/authorize" in asked
    assert "acr_values=eidas1, scope=openid given_name family_name birthdate gender birthplace birthcountry email" in asked
    assert "state and nonce of 43 and 43 characters" in asked
    signed_in = step(out, "2", "Continuer")
    assert re.search(r"POST 127\.0\.0\.1:\d+/api/v2/interaction/\S+/login 303", signed_in)
    assert f"GET 127.0.0.1:{port}/oauth/callback 302" in signed_in
    assert "its own state back: matches" in signed_in

    # 3: Gatehouse's own tokens, and its own ID token for the sandbox person.
    tokens = step(out, "3", "redeems the code")
    assert "HTTP 200, Cache-Control: no-store" in tokens
    assert re.search(r"access_token=gha_\S+ refresh_token=ghr_\S+ expires_in=300 token_type=Bearer", tokens)
    assert f"ES256, verified with Gatehouse's JWKS: iss=http://127.0.0.1:{port} aud=com.example.myapp" in tokens

    # 4: /userinfo gives the sandbox person's pivot identity (sandbox.franceconnect IDENTITIES[0]), from the session.
    info = step(out, "4", "/userinfo")
    for line in ("GET /userinfo -> HTTP 200", "given_name: 'Angela Claire Louise'", "family_name: 'DUBOIS'",
                 "birthdate: '1962-08-24'", "birthplace: '75107'", "birthcountry: '99100'", "email: 'angela.dubois@example.test'",
                 "sub matches the ID token's: True; userinfo calls to FranceConnect meanwhile: 0"):
        assert line in info, (line, info)
    subject = re.search(r"x-subject: (\S+)", step(out, "5", "/api/demarches")).group(1)

    # 5: the relayed call reached the backend with the identity headers, without the token.
    relay = step(out, "5", "/api/demarches")
    assert "GET /api/demarches/42 -> HTTP 200" in relay
    assert "x-given-name: Angela Claire Louise" in relay and "x-family-name: DUBOIS" in relay and "x-birthdate: 1962-08-24" in relay
    assert "and an Authorization header: False" in relay
    assert re.fullmatch(r"[0-9a-f]{64}v1", subject), subject  # FranceConnect's pairwise sub

    # 6: the logout went through FranceConnect's /session/end and back, and ended the session.
    logout = step(out, "6", "signs out")
    assert f"GET 127.0.0.1:{port}/oauth/logout 302" in logout
    assert re.search(r"GET 127\.0\.0\.1:\d+/api/v2/session/end 303", logout)
    assert f"GET 127.0.0.1:{port}/oauth/logout/callback 302" in logout
    assert "with its own state: True; FranceConnect's session ended: True (its cookie left: False)" in logout
    assert "afterwards: /userinfo HTTP 401; refreshing: HTTP 400 invalid_grant" in logout

    # Gatehouse's own log agrees: one relayed call, 200, and the logout.
    requests_logged = [fields(line) for line in (data / "gatehouse.log").read_text().splitlines() if message(line) == "request"]
    assert [call["status"] for call in requests_logged if call.get("path", "").startswith("/api/demarches")] == ["200"]
    assert any(call.get("path") == "/oauth/logout/callback" and call["status"] == "302" for call in requests_logged)
    assert_no_secret_in(data, seen, {"gatehouse.log", "franceconnect.log"})


def test_central_demo_walks_sign_in_tokens_jwt_relay_and_logout(workdir, seen):
    data = workdir / "demo-central"
    out, kinds = run_demo("central.py", data, seen)
    assert {"Gatehouse code", "app PKCE verifier", "central auth code", "central sign-in cookie (Gatehouse state)"} <= kinds, kinds
    port, provider = banner(out, "central sign-in provider")
    config = (data / "gatehouse.yaml").read_text()
    assert "kind: central" in config and f"s2s_private_key_file: {data / 'central-app-s2s.pem'}" in config
    assert "PRIVATE KEY" not in config
    for key in ("central-app-s2s.pem", "central-jwt.pem"):  # made by the demo: Gatehouse must never log them
        seen.add(*[line for line in (data / key).read_text().splitlines() if line and not line.startswith("-----")],
                 kind="demo private key (PEM line)")

    # 1-2: /oauth/authorize → the provider's /auth → Gatehouse's callback, the code verified server to server.
    started = step(out, "1", "/oauth/authorize")
    assert f"HTTP 302 to {provider}/auth?app=tasquito&provider=google" in started
    assert "sign-in cookie (__Secure-gatehouse-signin, Secure, HttpOnly): yes" in started
    signed_in = step(out, "2", "signs in at the provider")
    assert f"HTTP 302 to http://127.0.0.1:{port}/app/auth/callback?code=" in signed_in
    assert "accepted by the provider: 1) -> HTTP 302 to com.broccoliapps.tasquito:/oauth2redirect" in signed_in
    assert "its own state back: matches" in signed_in

    # 3: the app's tokens.
    tokens = step(out, "3", "redeems the code")
    assert "HTTP 200, Cache-Control: no-store" in tokens
    assert re.search(r"access_token=eyJ\S+ \(a JWT\) refresh_token=\S+ \(128 characters\) expires_in=(29\d|300)\b", tokens)

    # 4: the minted JWT: verified with Gatehouse's JWKS, the sandbox user in its claims.
    minted = step(out, "4", "JWT Gatehouse minted")
    assert "header: alg=RS256 typ=JWT kid=" in minted
    assert "the kid is there: True" in minted and "signature verified (PyJWT, RS256)" in minted
    assert "iss: tasquito" in minted and "aud: tasquito" in minted
    user_id = re.search(r"^    sub: (\S+)$", minted, re.MULTILINE).group(1)
    assert f"'email': 'ada.lovelace@example.test', 'name': 'Ada Lovelace', 'provider': 'google', 'userId': '{user_id}'" in minted

    # 5: the relayed call reached the backend with the identity headers, without the token.
    relay = step(out, "5", "/api/tasks")
    assert "GET /api/tasks/42 -> HTTP 200" in relay
    for line in (f"x-user-id: {user_id}", "x-user-email: ada.lovelace@example.test", "x-user-name: Ada Lovelace",
                 "x-sign-in-provider: google", "and an Authorization header: False"):
        assert line in relay, (line, relay)

    # 6-7: a refresh rotates; the revocation ends the session (neither refresh token works any more).
    assert "HTTP 200" in step(out, "6", "refreshes") and "(a new one: True)" in step(out, "6", "refreshes")
    logout = step(out, "7", "signs out")
    assert "revoke: HTTP 200; refreshing afterwards: HTTP 400 invalid_grant; with the first refresh token: HTTP 400 invalid_grant" in logout

    # The provider's log agrees: one S2S verify, accepted.
    provider_log = (data / "central.log").read_text()
    assert re.findall(r"^POST /api/v1/auth/verify (\d+)$", provider_log, re.MULTILINE) == ["200"], provider_log[-1000:]
    assert_no_secret_in(data, seen, {"gatehouse.log", "central.log"})
