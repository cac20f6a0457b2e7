"""Guarantees that hold against real inputs and hostile clients, end to end against the real
binary and a real django-oauth-toolkit upstream:

- `attestation: required` cannot be bypassed: not by the app's own client id (sealed or
  passthrough), not by an instance that signed in before a reload turned the policy on (refresh,
  session codes, new sign-ins);
- real-sized App Attest objects (Apple's receipt, some 7,400 characters of base64) certify;
- a DPoP proof is spent durably: replayed after a restart on the same SQLite store it is refused;
- registration cannot fill the store: per-address and per-app limits on by default, instances
  that never sign in live minutes, at most `max_pending` of them per app, a row-count gauge;
- made-up refresh tokens cannot be turned into upstream calls;
- a registration that narrows its redirect URIs is held to them;
- the audit stream writes every instance id by one rule, never in full;
- a reload that adds a Play-attesting client (new key files) is accepted.
"""

import json
import os
import re
import signal
import sqlite3
import time

import pytest
import requests

from attestation import AppleAuthority, DeviceKey, PlayKeys, attest
from sandbox.dpop import Key
from sandbox.nativeapp import APP_REDIRECT, App, query
from operations import metric_sum, parse_exposition, poll, scrape
from processes import with_suite_limits
from sandbox.secretsrecord import stop
from trusted import trusted_gatehouse

REQUIRED = "com.example.guard"
PASSTHROUGH_REQUIRED = "com.example.guard.pass"
PENDING = "com.example.guard.pending"
JUNK = "com.example.guard.junk"
SHIPPED_ROOT = "com.example.guard.apple"
OPEN = "com.example.guard.open"
APP_ID = "ABCDE12345.com.example.guard"
OTHER_REDIRECT = "http://127.0.0.1/guard-callback"


@pytest.fixture(scope="module")
def authority():
    return AppleAuthority()


def client(client_id, *lines, redirects=(APP_REDIRECT,)):
    """One `clients:` entry of the legacy upstream; `lines` are its other settings, YAML lines
    indented under the entry (four spaces)."""
    uris = ", ".join(f'"{uri}"' for uri in redirects)
    return f"""
  - client_id: {client_id}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: [{uris}]""" + "".join("\n    " + line for line in lines)


def apple_required(root=None):
    """The `instances:` lines of an app whose instances must certify with App Attest."""
    return ["instances:", "  attestation: required", "  apple:", f"    app_id: {APP_ID}"] + (
        [f"    root_ca_file: {root}"] if root else [])


@pytest.fixture(scope="module")
def guarded(workdir, seen, authority):
    root = authority.write_root(workdir / "guard-root.pem")
    clients = (client(REQUIRED, *apple_required(root))
               + client(PASSTHROUGH_REQUIRED, "token_exposure: passthrough", *apple_required(root))
               + client(PENDING, "instances:", "  unused_lifetime: 2h", "  pending_lifetime: 2m", "  max_pending: 3",
                        redirects=(APP_REDIRECT, OTHER_REDIRECT))
               + client(OPEN, "instances:", "  unused_lifetime: 2h", redirects=(APP_REDIRECT, OTHER_REDIRECT))
               + client(SHIPPED_ROOT, *apple_required())
               + client(JUNK, "token_exposure: passthrough", "unknown_refresh_tokens: refuse"))
    extra = f"""observability:
  metrics:
    allow: ["127.0.0.1"]
  audit:
    file: {workdir}/guard-audit.log"""
    store = f"{workdir}/guard.sqlite\n  sweep_interval: 1s"
    with trusted_gatehouse(workdir, seen, "guard", clients, extra=extra, store=store) as running:
        yield running


def attested(gatehouse, authority, client_id, **options):
    """An App Attest attestation of a new key for `client_id`'s fresh challenge: (answer, object's base64)."""
    nonce = requests.post(gatehouse["url"] + "/oauth/attestation/challenge", data={"client_id": client_id}, timeout=10).json()["challenge"]
    key_id, obj = attest(authority, DeviceKey(), nonce, APP_ID, **options)
    answer = requests.post(gatehouse["url"] + "/oauth/attestation", timeout=10, data={
        "client_id": client_id, "challenge": nonce, "type": "apple", "key_id": key_id, "attestation_object": obj})
    return answer, obj


def authorize_error(gatehouse, client_id, redirect_uri=APP_REDIRECT):
    app = App(gatehouse, client_id=client_id, redirect_uri=redirect_uri)
    answer = requests.get(app.authorize_url(), allow_redirects=False, timeout=10)
    return answer, app


def register(gatehouse, body, headers=None):
    return requests.post(gatehouse["url"] + "/oauth/register", json=body, headers=headers, timeout=10)


# ------------------------------------------------------------------ attestation: required, every way around it


@pytest.mark.parametrize("client_id", [REQUIRED, PASSTHROUGH_REQUIRED], ids=["sealed", "passthrough"])
def test_the_apps_own_client_id_gets_no_tokens_when_its_instances_must_be_certified(guarded, client_id):
    # The sign-in is refused before the upstream is asked: the app is sent back with the error.
    answer, app = authorize_error(guarded, client_id)
    assert answer.status_code in (302, 303), answer.text
    location = answer.headers["Location"]
    assert location.startswith(APP_REDIRECT), location
    assert query(location)["error"] == "unauthorized_client" and query(location)["state"] == app.state
    # Every grant of the token endpoint too: a code (whatever it is) and a refresh token.
    for response in (app.redeem("any-code"), app.refresh("any-refresh-token")):
        assert response.status_code == 400, response.text
        assert response.json()["error"] == "unauthorized_client", response.text
        assert "instance" in response.json()["error_description"]


def test_an_uncertified_instance_of_a_passthrough_app_gets_no_upstream_tokens(guarded, seen):
    client_id = register(guarded, {"software_id": PASSTHROUGH_REQUIRED}).json()["client_id"]
    answer, app = authorize_error(guarded, client_id)
    assert query(answer.headers["Location"])["error"] == "unauthorized_client"
    refused = App(guarded, seen, client_id=client_id).refresh("an-upstream-refresh-token")
    assert refused.status_code == 400 and refused.json()["error"] == "unauthorized_client", refused.text


def test_a_real_sized_app_attest_object_certifies_an_instance(guarded, seen, authority):
    client_id = register(guarded, {"software_id": REQUIRED}).json()["client_id"]
    answer, obj = attested(guarded, authority, client_id)
    # Apple's receipt makes a genuine object several kilobytes: over the 4 KiB of any other form field.
    assert len(obj) > 6000, len(obj)
    assert answer.status_code == 200, answer.text
    app = App(guarded, seen, client_id=client_id)
    tokens = app.redeem(app.sign_in()["code"])
    assert tokens.status_code == 200, tokens.text


def test_an_oversized_attestation_object_gets_a_precise_error_never_a_500(guarded, authority):
    client_id = register(guarded, {"software_id": REQUIRED}).json()["client_id"]
    answer, _ = attested(guarded, authority, client_id, receipt_size=14_000)
    # Over the body limit (16 KiB by default): the OAuth error says so.
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_request", answer.text
    assert "larger than 16384 bytes" in answer.json()["error_description"]


def test_without_root_ca_file_the_shipped_apple_root_is_the_only_trust(guarded, authority):
    # A chain under any other root (here the test root every other test trusts) is refused.
    client_id = register(guarded, {"software_id": SHIPPED_ROOT}).json()["client_id"]
    answer, _ = attested(guarded, authority, client_id)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_attestation", answer.text
    assert "root" in answer.json()["error_description"], answer.text


@pytest.fixture(scope="module")
def limited(workdir, seen):
    decryption, verification = PlayKeys().write(workdir, "limited-play")
    clients = client(PENDING, "instances:", "  attestation: preferred", "  play:", f"    package_name: {PENDING}",
                     f"    decryption_key_file: {decryption}", f"    verification_key_file: {verification}")
    extra = 'rate_limits:\n  oauth_per_client: {per_second: 0.01, burst: 3}\n  oauth_per_address: {per_second: 0.01, burst: 40}\nwebviews:\n  origins: ["https://app.example.test"]'
    with trusted_gatehouse(workdir, seen, "guard-limited", clients, extra=extra) as running:
        yield running


@pytest.mark.parametrize("path", ["/oauth/attestation/challenge", "/oauth/attestation"])
def test_attestation_endpoints_are_limited_per_app_whatever_instance_asks(limited, path):
    # Instance ids are free to make: each counts against its app's bucket (burst 3).
    statuses = []
    for index in range(6):
        client_id = PENDING + "~" + f"{index:02d}" + "B" * 41
        statuses.append(requests.post(limited["url"] + path, data={"client_id": client_id, "challenge": "c", "type": "play"},
                                      timeout=10).status_code)
    assert 429 in statuses and statuses.count(429) >= 3, statuses
    refused = requests.post(limited["url"] + path, data={"client_id": PENDING + "~" + "C" * 43}, timeout=10)
    assert refused.status_code == 429 and refused.json()["error"] == "temporarily_unavailable", refused.text


def test_session_codes_are_limited_per_address(limited):
    statuses = [requests.post(limited["url"] + "/oauth/session_code", headers={"Authorization": "Bearer gha_made_up"},
                              timeout=10).status_code for _ in range(45)]
    assert set(statuses) <= {401, 429} and statuses[-1] == 429, statuses
    refused = requests.post(limited["url"] + "/oauth/session_code", headers={"Authorization": "Bearer gha_made_up"}, timeout=10)
    assert refused.json()["error"] == "temporarily_unavailable" and int(refused.headers["Retry-After"]) > 0


# ------------------------------------------------------------------ registration cannot fill the store


def instance_row(gatehouse, client_id):
    with sqlite3.connect(gatehouse["database"]) as database:
        return database.execute("SELECT created_at, expires_at, last_used_at FROM instances WHERE id = ?", (client_id,)).fetchone()


def test_an_instance_that_never_signs_in_lives_minutes_and_a_sign_in_keeps_it(guarded, seen):
    client_id = register(guarded, {"software_id": PENDING}).json()["client_id"]
    created, expires, _ = instance_row(guarded, client_id)
    assert expires - created == 120_000  # pending_lifetime: 2m, not unused_lifetime
    app = App(guarded, seen, client_id=client_id)
    assert app.redeem(app.sign_in()["code"]).status_code == 200
    _, expires, used = instance_row(guarded, client_id)
    assert expires - used == 2 * 3600 * 1000  # unused_lifetime once it signed in


def test_an_app_holds_at_most_max_pending_instances_that_never_signed_in(guarded, seen):
    with sqlite3.connect(guarded["database"]) as database:
        pending = database.execute("SELECT count(*) FROM instances WHERE software_id = ? AND last_used_at = created_at",
                                   (PENDING,)).fetchone()[0]
    made = [register(guarded, {"software_id": PENDING}) for _ in range(max(0, 3 - pending))]
    assert all(answer.status_code == 201 for answer in made), [a.text for a in made]
    refused = register(guarded, {"software_id": PENDING})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"] == "temporarily_unavailable" and int(refused.headers["Retry-After"]) > 0
    # An instance that signs in no longer counts: one more may register.
    signed = made[0].json()["client_id"] if made else None
    if signed is None:
        with sqlite3.connect(guarded["database"]) as database:
            signed = database.execute("SELECT id FROM instances WHERE software_id = ? AND last_used_at = created_at LIMIT 1",
                                      (PENDING,)).fetchone()[0]
    app = App(guarded, seen, client_id=signed)
    assert app.redeem(app.sign_in()["code"]).status_code == 200
    assert register(guarded, {"software_id": PENDING}).status_code == 201


def test_the_instance_rows_are_reported_as_a_metric(guarded):
    register(guarded, {"software_id": PENDING})
    with sqlite3.connect(guarded["database"]) as database:
        rows = database.execute("SELECT count(*) FROM instances").fetchone()[0]
    # Read at each sweep (every second here).
    value = poll(lambda: (lambda v: v if v >= rows else None)(
        metric_sum(parse_exposition(scrape(guarded["url"] + "/metrics")), "gatehouse_instances")), 15, "gatehouse_instances")
    assert value >= rows > 0, (value, rows)


def test_a_registration_that_narrows_its_redirect_uris_is_held_to_them(guarded, seen):
    answer = register(guarded, {"software_id": OPEN, "redirect_uris": [OTHER_REDIRECT]})
    assert answer.status_code == 201, answer.text
    client_id = answer.json()["client_id"]
    assert answer.json()["redirect_uris"] == [OTHER_REDIRECT]
    # The app's other redirect URI is not this instance's: refused before anything else.
    refused = requests.get(App(guarded, client_id=client_id).authorize_url(), allow_redirects=False, timeout=10)
    assert refused.status_code == 400, refused.text
    allowed = requests.get(App(guarded, client_id=client_id, redirect_uri=OTHER_REDIRECT).authorize_url(), allow_redirects=False,
                           timeout=10)
    assert allowed.status_code in (302, 303) and not allowed.headers["Location"].startswith(OTHER_REDIRECT), allowed.text


# ------------------------------------------------------------------ junk refresh tokens


def upstream_calls(gatehouse):
    return metric_sum(parse_exposition(scrape(gatehouse["url"] + "/metrics")), "gatehouse_upstream_requests_total")


def test_made_up_refresh_tokens_are_refused_without_an_upstream_call(guarded, seen):
    before = upstream_calls(guarded)
    for index in range(20):
        answer = App(guarded, seen, client_id=JUNK).refresh(f"junk-{index}-" + "x" * 20)
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant", answer.text
    assert upstream_calls(guarded) == before
    # A token the app got through Gatehouse still refreshes.
    app = App(guarded, seen, client_id=JUNK)
    pair = app.redeem(app.sign_in()["code"]).json()
    refreshed = app.refresh(pair["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text


# ------------------------------------------------------------------ the audit stream


def test_the_audit_stream_never_writes_an_instance_id_in_full(guarded, seen, workdir):
    client_id = register(guarded, {"software_id": OPEN}).json()["client_id"]
    app = App(guarded, seen, client_id=client_id)
    pair = app.redeem(app.sign_in()["code"]).json()
    assert app.refresh(pair["refresh_token"]).status_code == 200
    assert requests.post(guarded["url"] + "/oauth/revoke", data={"client_id": client_id, "token": pair["refresh_token"]},
                         timeout=10).status_code == 200
    made_up = OPEN + "~" + "A" * 43
    requests.post(guarded["url"] + "/oauth/revoke", data={"client_id": made_up, "token": "whatever"}, timeout=10)
    audit = (workdir / "guard-audit.log").read_text()
    events = [line for line in audit.splitlines() if "instance=" in line or '"instance"' in line]
    assert len(events) >= 3, audit[-2000:]
    assert client_id not in audit and client_id.split("~")[1] not in audit
    assert made_up not in audit


# ------------------------------------------------------------------ reloads


@pytest.fixture
def switching(workdir, seen, authority):
    root = authority.write_root(workdir / "switch-root.pem")
    entry = client(REQUIRED, "instances:", "  unused_lifetime: 2h")
    with trusted_gatehouse(workdir, seen, "switch", entry, extra='webviews:\n  origins: ["https://app.example.test"]') as running:
        running["root"] = root
        running["clients"] = entry
        yield running


def reload(gatehouse, text, expect):
    mark = gatehouse["lines"].mark()
    gatehouse["config"].write_text(with_suite_limits(text))
    os.kill(gatehouse["process"].pid, signal.SIGHUP)
    gatehouse["lines"].wait_for(expect, timeout=15, since=mark)
    return gatehouse["lines"].lines_since(mark)


def test_a_reload_that_requires_attestation_stops_what_uncertified_instances_signed_in_before(switching, seen):
    client_id = register(switching, {"software_id": REQUIRED}).json()["client_id"]
    app = App(switching, seen, client_id=client_id)
    pair = app.redeem(app.sign_in()["code"]).json()
    pair = app.refresh(pair["refresh_token"]).json()
    required = client(REQUIRED, "instances:", "  unused_lifetime: 2h", *apple_required(switching["root"])[1:])
    text = switching["text"].replace(switching["clients"], required)
    reload(switching, text, r"configuration reloaded")
    refused = app.refresh(pair["refresh_token"])
    assert refused.status_code == 400 and refused.json()["error"] == "unauthorized_client", refused.text
    code = requests.post(switching["url"] + "/oauth/session_code", headers={"Authorization": f"Bearer {pair['access_token']}"},
                         timeout=10)
    assert code.status_code == 400 and code.json()["error"] == "unauthorized_client", code.text
    answer, _ = authorize_error(switching, client_id)
    assert query(answer.headers["Location"])["error"] == "unauthorized_client"


def test_a_reload_that_adds_a_play_attesting_client_is_applied(switching, workdir):
    decryption, verification = PlayKeys().write(workdir, "switch-play")
    added = client("com.example.guard.android", "instances:", "  attestation: required", "  play:",
                   "    package_name: com.example.guard.android", f"    decryption_key_file: {decryption}",
                   f"    verification_key_file: {verification}")
    # Its two key files are read for the first time: new, not "changed".
    lines = reload(switching, switching["text"].replace(switching["clients"], switching["clients"] + added),
                   r"configuration reload(ed| refused)")
    assert any("configuration reloaded" in line for line in lines), "\n".join(lines)
    assert register(switching, {"software_id": "com.example.guard.android"}).status_code == 201


# ------------------------------------------------------------------ DPoP replay across a restart


def test_a_dpop_proof_used_once_is_refused_after_a_restart_on_sqlite(workdir, seen):
    with trusted_gatehouse(workdir, seen, "dpop-restart", client("com.example.guard.dpop", "dpop: optional")) as gatehouse:
        key = Key()
        token_url = gatehouse["url"] + "/oauth/token"
        app = App(gatehouse, seen, client_id="com.example.guard.dpop")
        pair = app.redeem(app.sign_in()["code"], headers={"DPoP": key.proof("POST", token_url)}).json()
        refresh_proof = key.proof("POST", token_url)
        userinfo_url = gatehouse["url"] + "/userinfo"
        pair = app.refresh(pair["refresh_token"], headers={"DPoP": refresh_proof}).json()
        userinfo_proof = key.proof("GET", userinfo_url, access_token=pair["access_token"])
        first = requests.get(userinfo_url, headers={"Authorization": f"DPoP {pair['access_token']}", "DPoP": userinfo_proof}, timeout=10)
        assert first.status_code in (200, 404), first.text  # the upstream may have no userinfo to give; the proof was spent
        stop(gatehouse["process"])
        with gatehouse["relaunch"]("again"):
            # The same proofs, well within their lifetime: the memory that saw them is gone, the store is not.
            replay = app.refresh(pair["refresh_token"], headers={"DPoP": refresh_proof})
            assert replay.status_code == 400 and replay.json()["error"] == "invalid_dpop_proof", replay.text
            again = requests.get(userinfo_url, headers={"Authorization": f"DPoP {pair['access_token']}", "DPoP": userinfo_proof},
                                 timeout=10)
            assert again.status_code == 401 and "invalid_dpop_proof" in again.headers.get("WWW-Authenticate", ""), again.text
            # A fresh proof works.
            fresh = app.refresh(pair["refresh_token"], headers={"DPoP": key.proof("POST", token_url)})
            assert fresh.status_code == 200, fresh.text


# ------------------------------------------------------------------ the limits that are on by default


@pytest.fixture(scope="module")
def defaults(workdir, seen):
    clients = client(PENDING, "instances: {}") + client(JUNK, "token_exposure: passthrough")
    extra = 'observability:\n  metrics:\n    allow: ["127.0.0.1"]'
    with trusted_gatehouse(workdir, seen, "guard-defaults", clients, extra=extra, default_limits=True) as running:
        yield running


def test_registration_is_limited_per_address_by_default(defaults):
    answers = [register(defaults, {"software_id": PENDING}) for _ in range(40)]
    statuses = [answer.status_code for answer in answers]
    assert statuses.count(201) <= 25 and statuses.count(429) >= 15, statuses
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert refused.json()["error"] == "temporarily_unavailable" and int(refused.headers["Retry-After"]) > 0
    # Another address (a trusted proxy is not configured: the peer is the address) is another bucket:
    # nothing here can make one, so the per-app limit is checked with the rows instead.
    with sqlite3.connect(defaults["database"]) as database:
        assert database.execute("SELECT count(*) FROM instances").fetchone()[0] == statuses.count(201)


def test_made_up_refresh_tokens_are_limited_per_address_by_default(defaults, seen):
    before = upstream_calls(defaults)
    statuses = [App(defaults, seen, client_id=JUNK).refresh(f"junk-{index}-" + "y" * 20).status_code for index in range(25)]
    forwarded = upstream_calls(defaults) - before
    assert statuses.count(429) >= 10 and forwarded <= 12, (statuses, forwarded)
