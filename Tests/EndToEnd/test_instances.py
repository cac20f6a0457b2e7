"""Registered app instances (RFC 7591) end to end, against the real binary and a real
django-oauth-toolkit upstream: each install registers at /oauth/register and signs in under its
own client_id; the admin CLI lists and revokes instances (ending their sessions); an app whose
instances must be certified gets no tokens for an uncertified one. Attestation itself is
test_attestation.py's, DPoP test_dpop.py's, the e-mailed code test_manual_certification.py's."""

import json
import sqlite3
import subprocess

import pytest
import requests

from sandbox.backends import self_signed_certificate
from sandbox.nativeapp import APP_REDIRECT, App, query
from trusted import trusted_gatehouse

APP = "com.example.inst"
REQUIRED = "com.example.inst.required"
PLAIN = "com.example.plain"


@pytest.fixture(scope="module")
def instances(workdir, seen):
    root, _ = self_signed_certificate(workdir, "instances-apple-root")
    clients = f"""
  - client_id: {APP}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}", "http://127.0.0.1/callback"]
    instances:
      unused_lifetime: 2h
  - client_id: {REQUIRED}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]
    instances:
      attestation: required
      apple:
        app_id: ABCDE12345.com.example.inst
        root_ca_file: {root}
  - client_id: {PLAIN}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]"""
    routes = """
  - prefix: /api/inst
    backend: {backend}/inst
    upstream: legacy
    authorization: passthrough"""
    with trusted_gatehouse(workdir, seen, "instances", clients, routes) as gatehouse:
        yield gatehouse


def register(gatehouse, body, content_type="application/json"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(gatehouse["url"] + "/oauth/register", data=data, headers={"Content-Type": content_type}, timeout=10)


def new_instance(gatehouse, app=APP):
    answer = register(gatehouse, {"software_id": app, "client_name": "Alice's phone"})
    assert answer.status_code == 201, answer.text
    return answer.json()["client_id"]


def signed_in(gatehouse, seen, client_id):
    app = App(gatehouse, seen, client_id=client_id)
    answer = app.redeem(app.sign_in()["code"])
    assert answer.status_code == 200, answer.text
    return app, answer.json()


def admin(gatehouse, *arguments):
    return subprocess.run([str(gatehouse["binary"]), "instances", *arguments, "--config", str(gatehouse["config"])],
                          capture_output=True, text=True, timeout=60, env=gatehouse["env"])


def test_discovery_names_the_registration_endpoint(instances):
    metadata = requests.get(instances["url"] + "/.well-known/oauth-authorization-server", timeout=10).json()
    assert metadata["registration_endpoint"] == instances["url"] + "/oauth/register"


def test_an_instance_registers_and_gets_its_own_client_id_bound_to_the_apps_registration(instances):
    answer = register(instances, {"software_id": APP, "redirect_uris": [APP_REDIRECT], "token_endpoint_auth_method": "none",
                                  "grant_types": ["authorization_code", "refresh_token"], "logo_uri": "ignored"})
    assert answer.status_code == 201, answer.text
    assert answer.headers["Cache-Control"] == "no-store"
    body = answer.json()
    assert body["client_id"].startswith(APP + "~") and len(body["client_id"]) > len(APP) + 40
    assert body["software_id"] == APP and body["redirect_uris"] == [APP_REDIRECT]
    assert body["token_endpoint_auth_method"] == "none" and body["scope"] == "read write"
    assert body["attestation"] == "off" and body["dpop_bound_access_tokens"] is False
    assert "client_secret" not in body
    again = register(instances, {"software_id": APP}).json()
    assert again["client_id"] != body["client_id"]
    assert sorted(again["redirect_uris"]) == sorted([APP_REDIRECT, "http://127.0.0.1/callback"])


@pytest.mark.parametrize("body, content_type, status, error", [
    ({"software_id": APP}, "application/x-www-form-urlencoded", 415, "invalid_client_metadata"),
    ("{not json", "application/json", 400, "invalid_client_metadata"),
    ([APP], "application/json", 400, "invalid_client_metadata"),
    ({}, "application/json", 400, "invalid_client_metadata"),
    ({"software_id": "com.example.unknown"}, "application/json", 400, "invalid_client_metadata"),
    ({"software_id": PLAIN}, "application/json", 400, "invalid_client_metadata"),
    ({"software_id": APP, "redirect_uris": ["https://evil.example/cb"]}, "application/json", 400, "invalid_redirect_uri"),
    ({"software_id": APP, "redirect_uris": []}, "application/json", 400, "invalid_redirect_uri"),
    ({"software_id": APP, "token_endpoint_auth_method": "client_secret_basic"}, "application/json", 400, "invalid_client_metadata"),
    ({"software_id": APP, "grant_types": ["client_credentials"]}, "application/json", 400, "invalid_client_metadata"),
    ({"software_id": APP, "response_types": ["token"]}, "application/json", 400, "invalid_client_metadata"),
])
def test_bad_registrations_get_a_precise_rfc_7591_error(instances, body, content_type, status, error):
    answer = register(instances, body, content_type)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"] == error


def test_a_huge_registration_is_refused_without_a_row(instances):
    before = sqlite3.connect(instances["database"]).execute("SELECT count(*) FROM instances").fetchone()[0]
    answer = register(instances, json.dumps({"software_id": APP, "client_name": "x" * 100_000}))
    assert answer.status_code == 413
    after = sqlite3.connect(instances["database"]).execute("SELECT count(*) FROM instances").fetchone()[0]
    assert after == before


def test_an_instance_signs_in_refreshes_and_calls_the_api_under_its_own_client_id(instances, seen):
    instance = new_instance(instances)
    app, pair = signed_in(instances, seen, instance)
    assert pair["access_token"].startswith("gha_") and pair["token_type"] == "Bearer"
    called = requests.get(instances["url"] + "/api/inst/x", headers={"Authorization": f"Bearer {pair['access_token']}"}, timeout=10)
    assert called.status_code == 200, called.text
    refreshed = app.refresh(pair["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    # The refresh token is the instance's: the app's own client id, or another instance, cannot use it.
    other = App(instances, seen, client_id=new_instance(instances))
    assert other.refresh(refreshed.json()["refresh_token"]).json()["error"] == "invalid_grant"
    assert App(instances, seen, client_id=APP).refresh(refreshed.json()["refresh_token"]).json()["error"] == "invalid_grant"


def test_a_code_issued_to_one_instance_is_refused_to_another(instances, seen):
    first = App(instances, seen, client_id=new_instance(instances))
    code = first.sign_in()["code"]
    second = App(instances, seen, client_id=new_instance(instances))
    second.verifier = first.verifier
    answer = second.redeem(code)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant"


def test_a_made_up_instance_id_is_no_client(instances, seen):
    forged = APP + "~" + "A" * 43
    app = App(instances, seen, client_id=forged)
    page = requests.get(app.authorize_url(), allow_redirects=False, timeout=10)
    assert page.status_code == 400  # never a redirect: the client is unknown (RFC 6749 §4.1.2.1)
    assert app.refresh("ghr_whatever").json()["error"] == "invalid_client"
    # An instance id of an app that has no instances is no client either.
    plain = App(instances, seen, client_id=PLAIN + "~" + "A" * 43)
    assert requests.get(plain.authorize_url(), allow_redirects=False, timeout=10).status_code == 400


def test_the_admin_lists_and_revokes_an_instance_which_ends_its_sessions(instances, seen):
    instance = new_instance(instances)
    app, pair = signed_in(instances, seen, instance)
    listed = admin(instances, "list", "--client", APP)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(instance))
    assert "\tlive" in row and "\tnone\t" in row
    as_json = [json.loads(line) for line in admin(instances, "list", "--json").stdout.splitlines()]
    assert {"client_id": instance, "app": APP, "state": "live"}.items() <= next(i for i in as_json if i["client_id"] == instance).items()

    revoked = admin(instances, "revoke", instance)
    assert revoked.returncode == 0, revoked.stderr
    assert "ended 1 session" in revoked.stdout
    assert app.refresh(pair["refresh_token"]).json()["error"] in ("invalid_grant", "invalid_client")
    page = requests.get(App(instances, seen, client_id=instance).authorize_url(), allow_redirects=False, timeout=10)
    assert page.status_code == 400
    listed = admin(instances, "list").stdout
    assert "\trevoked" in next(line for line in listed.splitlines() if line.startswith(instance))
    unknown = admin(instances, "revoke", APP + "~" + "B" * 43)
    assert unknown.returncode != 0 and "no instance" in unknown.stderr


def test_an_expired_instance_is_no_client_any_more(instances, seen):
    instance = new_instance(instances)
    app, pair = signed_in(instances, seen, instance)
    connection = sqlite3.connect(instances["database"])
    with connection:
        changed = connection.execute("UPDATE instances SET expires_at = 0 WHERE id = ?", (instance,)).rowcount
    connection.close()
    assert changed == 1
    refused = app.refresh(pair["refresh_token"])
    assert refused.status_code == 401 and refused.json()["error"] == "invalid_client"
    assert requests.get(App(instances, seen, client_id=instance).authorize_url(), allow_redirects=False, timeout=10).status_code == 400


def test_an_uncertified_instance_of_an_app_that_requires_attestation_gets_no_tokens(instances, seen):
    instance = new_instance(instances, REQUIRED)
    app = App(instances, seen, client_id=instance)
    # Nothing could certify it during the sign-in (no manual certification): refused before the upstream.
    started = requests.get(app.authorize_url(), allow_redirects=False, timeout=10)
    assert started.status_code == 302
    received = query(started.headers["Location"])
    assert started.headers["Location"].startswith(APP_REDIRECT)
    assert received["error"] == "unauthorized_client" and received["state"] == app.state
    assert "/oauth/attestation" in received["error_description"]
    refused = app.redeem("some-code")
    assert refused.status_code == 400 and refused.json()["error"] == "unauthorized_client"
    # The app's challenge endpoint answers it, though: that is how it certifies itself.
    challenge = requests.post(instances["url"] + "/oauth/attestation/challenge", data={"client_id": instance}, timeout=10)
    assert challenge.status_code == 200 and len(challenge.json()["challenge"]) >= 43 and challenge.json()["expires_in"] == 300


def test_attestation_endpoints_refuse_what_is_not_an_attesting_instance(instances):
    url = instances["url"] + "/oauth/attestation/challenge"
    assert requests.post(url, data={"client_id": APP}, timeout=10).json()["error"] == "invalid_client"
    assert requests.post(url, data={"client_id": new_instance(instances)}, timeout=10).json()["error"] == "unauthorized_client"
    assert requests.post(url, json={"client_id": APP}, timeout=10).status_code == 415
    instance = new_instance(instances, REQUIRED)
    attest = requests.post(instances["url"] + "/oauth/attestation", timeout=10, data={
        "client_id": instance, "challenge": "never-issued", "type": "apple", "key_id": "AAAA", "attestation_object": "AAAA"})
    assert attest.status_code == 400 and attest.json()["error"] == "invalid_attestation"


def test_registrations_are_rate_limited_per_address_with_an_oauth_error(workdir, seen):
    clients = f"""
  - client_id: {APP}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]
    instances: {{}}"""
    extra = "rate_limits:\n  oauth_per_address: {per_second: 0.01, burst: 3}"
    with trusted_gatehouse(workdir, seen, "instances-limited", clients, extra=extra) as gatehouse:
        answers = [register(gatehouse, {"software_id": APP}) for _ in range(4)]
        assert [a.status_code for a in answers] == [201, 201, 201, 429]
        assert answers[3].json()["error"] == "temporarily_unavailable" and int(answers[3].headers["Retry-After"]) > 0
        rows = sqlite3.connect(gatehouse["database"]).execute("SELECT count(*) FROM instances").fetchone()[0]
        assert rows == 3
