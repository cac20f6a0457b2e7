"""Sealed sessions end to end: the app holds only Gatehouse's tokens; the real upstream's
tokens stay sealed in the store and reach backends through the token-handler swap."""

import sqlite3
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import requests

from sandbox.gatelog import served_by
from sandbox.nativeapp import App, query


def sealed_sign_in(gatehouse, seen):
    app = App(gatehouse, seen, client_id="com.example.sealed")
    response = app.redeem(app.sign_in()["code"])
    assert response.status_code == 200, response.text
    return app, response.json()


def relay(gatehouse, path, token):
    return requests.get(gatehouse["url"] + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_the_app_gets_gatehouse_tokens_and_the_backend_the_upstream_token(gatehouse, seen, upstream):
    _, pair = sealed_sign_in(gatehouse, seen)
    assert pair["access_token"].startswith("gha_") and pair["refresh_token"].startswith("ghr_")
    for path in ("general", "fast"):  # the session's first call fills the caches, the second is fast
        response = relay(gatehouse, "/api/sealed/x", pair["access_token"])
        assert response.status_code == 200, response.text
        assert served_by(gatehouse, response) == path
        headers = response.json()["headers"]
        assert headers["x-bpid"] == "1000123"
        upstream_token = headers["authorization"].removeprefix("Bearer ")
        assert not upstream_token.startswith("gha_")
        seen.add(upstream_token)
    introspection = requests.post(upstream["url"] + "/o/introspect/", data={"token": upstream_token},
                                  auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"]), timeout=10).json()
    assert introspection["active"] is True and introspection["username"] == "alice"


def test_fifty_concurrent_refreshes_rotate_once_and_share_one_pair(gatehouse, seen):
    app, pair = sealed_sign_in(gatehouse, seen)
    barrier = threading.Barrier(50)

    def refresh(_):
        barrier.wait()
        return app.refresh(pair["refresh_token"])

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(refresh, range(50)))
    assert [a.status_code for a in answers] == [200] * 50
    assert len({(a.json()["access_token"], a.json()["refresh_token"]) for a in answers}) == 1
    new = answers[0].json()
    assert new["refresh_token"] != pair["refresh_token"]
    assert relay(gatehouse, "/api/sealed/x", new["access_token"]).status_code == 200


def test_revoked_session_is_refused_and_its_upstream_tokens_are_revoked_upstream(gatehouse, seen, upstream):
    app, pair = sealed_sign_in(gatehouse, seen)
    first = relay(gatehouse, "/api/sealed/x", pair["access_token"])
    assert first.status_code == 200
    upstream_token = first.json()["headers"]["authorization"].removeprefix("Bearer ")
    seen.add(upstream_token)
    revoked = requests.post(gatehouse["url"] + "/oauth/revoke", timeout=10,
                            data={"token": pair["refresh_token"], "client_id": "com.example.sealed"})
    assert revoked.status_code == 200
    assert relay(gatehouse, "/api/sealed/x", pair["access_token"]).status_code == 401
    assert app.refresh(pair["refresh_token"]).json()["error"] == "invalid_grant"
    # Gatehouse revoked the upstream refresh token at the upstream (RFC 7009), which takes its access token along.
    introspection = requests.post(upstream["url"] + "/o/introspect/", data={"token": upstream_token},
                                  auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"]), timeout=10).json()
    assert introspection["active"] is False


def test_admin_commands_list_and_revoke_a_subjects_sessions(gatehouse, seen, upstream):
    app, pair = sealed_sign_in(gatehouse, seen)
    command = [str(gatehouse["binary"]), "sessions"]
    listed = subprocess.run(command + ["list", "--config", str(gatehouse["config"]), "--subject", "alice"],
                            capture_output=True, text=True, timeout=30, env=upstream["env"])
    assert listed.returncode == 0, listed.stderr
    assert "com.example.sealed" in listed.stdout and "live" in listed.stdout
    revoked = subprocess.run(command + ["revoke", "--config", str(gatehouse["config"]), "--subject", "alice"],
                             capture_output=True, text=True, timeout=30, env=upstream["env"])
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    assert app.refresh(pair["refresh_token"]).json()["error"] == "invalid_grant"


#: What the store must never hold readable, and which this test makes sure the run has seen.
KINDS_THE_STORE_MUST_NOT_HOLD = {
    "Gatehouse code", "Gatehouse access token", "Gatehouse refresh token", "app PKCE verifier",
    "upstream access token", "upstream refresh token", "upstream authorization code",
    "PKCE verifier toward the upstream", "Gatehouse state toward the upstream",
    "upstream client secret", "session key",
}


def test_the_database_holds_no_token_or_secret_in_plain_text(gatehouse, seen):
    """Every cell of every table, BLOBs as bytes, and the file's own bytes (deleted rows
    linger there), searched for every secret of the run: as it is, in hex, in base64 /
    base64url, and for base64url secrets (keys, Gatehouse tokens) the bytes they stand for."""
    _, pair = sealed_sign_in(gatehouse, seen)
    assert relay(gatehouse, "/api/sealed/x", pair["access_token"]).status_code == 200  # the session's upstream tokens are in use
    modern = App(gatehouse, seen, client_id="com.example.modern")  # Gatehouse's own PKCE toward the upstream
    assert modern.redeem(modern.sign_in()["code"]).status_code == 200
    in_flight = App(gatehouse, seen)  # a transaction still in the store
    started = requests.get(in_flight.authorize_url(), allow_redirects=False, timeout=10)
    assert started.status_code == 302
    seen.add(query(started.headers["Location"])["state"], kind="Gatehouse state toward the upstream")

    seen.harvest()
    missing = KINDS_THE_STORE_MUST_NOT_HOLD - set(seen.kinds.values())
    assert not missing, f"the run should have recorded secrets of every kind; none of {sorted(missing)}"
    connection = sqlite3.connect(f"file:{gatehouse['database']}?mode=ro", uri=True)
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    blobs = connection.execute("SELECT count(*) FROM sessions WHERE typeof(sealed_tokens) = 'blob'").fetchone()[0]
    connection.close()
    assert {"sessions", "refresh_tokens", "access_tokens", "issued_codes", "authorization_transactions"} <= tables
    assert blobs > 0  # the search reads BLOBs, and there are some
    assert seen.find_in_sqlite(gatehouse["database"]) == []


def test_a_gatehouse_refresh_token_is_never_a_bearer_token(gatehouse, seen, relay_doubles):
    _, pair = sealed_sign_in(gatehouse, seen)
    before = relay_doubles["personal"].total_calls
    assert relay(gatehouse, "/api/sealed/x", pair["refresh_token"]).status_code == 401
    assert relay_doubles["personal"].total_calls == before  # not even shown to the identity service


def test_a_route_that_removes_authorization_never_sees_the_session_tokens(gatehouse, seen, relay_path):
    """On a route with `authorization: remove` neither the app's Gatehouse token nor the
    session's upstream token reaches the backend, on either path."""
    _, pair = sealed_sign_in(gatehouse, seen)
    token = pair["access_token"]
    if relay_path == "fast":
        assert relay(gatehouse, "/api/contracts/warm", token).status_code == 200
    response = relay(gatehouse, "/api/contracts/x", token)
    assert response.status_code == 200, response.text
    assert served_by(gatehouse, response) == relay_path
    headers = response.json()["headers"]
    assert "authorization" not in headers
    assert not any(token in value for value in headers.values())
