"""Structured JSON logs and the audit stream (issue 11, item 3), end to end.

A Gatehouse of this module's own runs with `--log-format json` in front of a django-oauth-toolkit
of its own (OIDC on, so a sealed session has a subject): every line it writes to standard error
is one JSON object with ts, level and msg; request lines carry request_id, and so does every line
written while serving that request (an upstream's refusal, for one); the audit events of sign-ins,
refreshes, a refresh-token reuse and a revocation appear with client_id and subject_hash (the
first 16 hex digits of SHA-256 of the subject), never the subject in clear, never a token.

A second Gatehouse writes its audit events to a file (`observability.audit.file`): they are
there, one a line, each with audit_event, and not on standard error.

The access log: 2,000 fast-path requests on 32 keep-alive connections, then SIGTERM: exactly one
request line per answered request, none lost, none torn, in text and in JSON (the lines are
written in batches per event loop). With `observability.access_log: off` no request line at all,
while the other lines remain.

Files: the JSON logs are WORKDIR/*.json.log and the audit files WORKDIR/*.audit.log, which the
suite's last test (test_zz) parses and searches for secrets once more.
"""

import base64
import hashlib
import http.client
import json
import re
import secrets
import signal
import threading
import time

import pytest
import requests

from sandbox.nativeapp import APP_REDIRECT, App, free_port
from sandbox.gatelog import fields, message
from operations import IdentityDouble, gateway, gateway_config, json_lines, poll, relay_sign_in, route_yaml
from processes import run_upstream, session_keys
from sandbox.gatehouse import server_and_store

LEVELS = {"trace", "debug", "info", "notice", "warning", "error", "critical"}
AUDIT_EVENTS = {"sign_in", "refresh", "reuse_detected", "family_revoked", "revoke", "logout", "admin_revocation",
                "rate_limited"}
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)$")


def payload(jwt):
    segment = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def subject_hash(subject):
    return hashlib.sha256(subject.encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def logged(workdir, seen):
    """The JSON-logging Gatehouse and its own django-oauth-toolkit: upstream `legacy` (oauth2,
    passthrough client com.example.relay) and `dot` (oidc, sealed client com.example.oidc,
    refresh_grace 0s so a second use of a refresh token is a reuse)."""
    port = free_port()
    callback = f"http://127.0.0.1:{port}/oauth/callback"
    applications = [
        {"client_id": "gatehouse-legacy", "client_secret_env": "UPSTREAM_SECRET_LEGACY",
         "redirect_uris": [callback, APP_REDIRECT], "pkce_required": False},
        {"client_id": "gatehouse-oidc", "client_secret_env": "UPSTREAM_SECRET_LEGACY", "algorithm": "RS256",
         "redirect_uris": [callback, APP_REDIRECT], "pkce_required": True},
    ]
    with run_upstream(workdir, "upstream-logs", seen, [callback], applications=applications) as up:
        config = server_and_store(port, f"{workdir}/logs-json.sqlite").replace("\nstore:", "\n  shutdown_drain: 0s\nstore:") + f"""
upstreams:
  - name: legacy
    authorization_endpoint: {up["url"]}/o/authorize/
    token_endpoint: {up["url"]}/o/token/
    revocation_endpoint: {up["url"]}/o/revoke_token/
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]
  - name: dot
    kind: oidc
    issuer: {up["url"]}/o
    client_id: gatehouse-oidc
    client_secret_env: UPSTREAM_SECRET_LEGACY
    id_token_signing_alg: RS256
    scopes: [openid, profile, email]
    timeout: 10s
clients:
  - client_id: com.example.relay
    upstream: legacy
    wiring: relay
    token_exposure: passthrough
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]
  - client_id: com.example.oidc
    upstream: dot
    token_exposure: sealed
    scopes: [openid, profile, email]
    redirect_uris: ["{APP_REDIRECT}"]
sessions:
  encryption_keys_file: {session_keys(workdir, "session-keys", seen)}
  refresh_grace: 0s
"""
        with gateway(workdir, "logs-json", config, up["env"], json_logs=True) as instance:
            instance["upstream"] = up
            yield instance


class OidcApp(App):
    def authorize_url(self, **overrides):
        return super().authorize_url(**{"scope": "openid profile email", "nonce": "n-" + "x" * 22, **overrides})


@pytest.fixture(scope="module")
def journey(logged, seen):
    """What the tests look for in the log: sign-ins (sealed OIDC, passthrough), a refresh, a
    reuse of the replaced refresh token, a revocation, an upstream refusing a refresh."""
    base = logged["url"]
    app = OidcApp({"url": base}, seen, client_id="com.example.oidc")
    signed_in = app.redeem(app.sign_in()["code"])
    assert signed_in.status_code == 200, signed_in.text
    first = signed_in.json()
    assert "id_token" in first, f"the sealed OIDC sign-in gave no ID token: {sorted(first)}"
    subject = payload(first["id_token"])["sub"]
    seen.add(first["id_token"], kind="Gatehouse ID token")
    refreshed = app.refresh(first["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    reused = app.refresh(first["refresh_token"])  # replaced, and refresh_grace is 0 s: a reuse
    assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant", reused.text

    again = OidcApp({"url": base}, seen, client_id="com.example.oidc")
    second = again.redeem(again.sign_in()["code"])
    assert second.status_code == 200, second.text
    revoked = requests.post(base + "/oauth/revoke", timeout=10,
                            data={"token": second.json()["refresh_token"], "client_id": "com.example.oidc"})
    assert revoked.status_code == 200, revoked.text

    _, passthrough = relay_sign_in(base, seen)
    refused = App({"url": base}, seen, client_id="com.example.relay").refresh("not-a-refresh-token-" + "z" * 12)
    assert refused.status_code == 400, refused.text

    responses = [signed_in, refreshed, reused, second, revoked, refused]
    return {"subject": subject, "responses": responses, "refused": refused,
            "tokens": [first["access_token"], first["refresh_token"], second.json()["access_token"],
                       second.json()["refresh_token"], passthrough["access_token"], passthrough["refresh_token"]]}


def objects(instance):
    return json_lines(instance["lines"].lines_since(0))


def test_every_line_is_one_json_object_with_ts_level_and_msg(logged, journey):
    lines = logged["lines"].lines_since(0)
    assert len(lines) > 10
    for value in json_lines(lines):
        assert TS.match(value.get("ts", "")), value
        assert value.get("level") in LEVELS, value
        assert isinstance(value.get("msg"), str) and value["msg"], value
        assert all(isinstance(item, str) for item in value.values()), f"metadata values are strings: {value}"
    ready = [value for value in json_lines(lines) if value["msg"] == "gatehouse is ready"]
    assert ready and ready[0]["label"] == "gatehouse"


def test_request_lines_carry_the_request_id_of_the_answer(logged, journey):
    values = objects(logged)
    requests_logged = [value for value in values if value["msg"] == "request"]
    assert requests_logged and all("request_id" in value for value in requests_logged)
    ids = {value["request_id"] for value in requests_logged}
    for response in journey["responses"]:
        assert response.headers["X-Request-Id"] in ids


def test_lines_written_inside_a_request_carry_its_request_id(logged, journey):
    request_id = journey["refused"].headers["X-Request-Id"]

    def warning():
        found = [value for value in objects(logged) if value["level"] == "warning" and "refused" in value["msg"]
                 and value.get("upstream") == "legacy"]
        return found

    (refusal,) = poll(warning, 10, "the upstream's refusal logged as a warning")
    assert refusal.get("request_id") == request_id, refusal
    same = [value for value in objects(logged) if value.get("request_id") == request_id]
    assert {value["msg"] for value in same} >= {"request", refusal["msg"]}, same


def test_audit_events_have_client_id_and_subject_hash_never_the_subject_or_a_token(logged, journey, seen):
    wanted = {"sign_in", "refresh", "reuse_detected", "family_revoked", "revoke"}

    def audit():
        events = [value for value in objects(logged) if "audit_event" in value]
        return events if wanted <= {value["audit_event"] for value in events} else None

    events = poll(audit, 10, f"the audit events {sorted(wanted)}")
    subject = journey["subject"]
    oidc = [value for value in events if value.get("client_id") == "com.example.oidc"]
    assert wanted <= {value["audit_event"] for value in oidc}, [value["audit_event"] for value in oidc]
    for value in events:
        assert value["audit_event"] in AUDIT_EVENTS, value
        assert value["msg"] == value["audit_event"], value
        assert value.get("label") == "gatehouse.audit", value
        assert value["level"] == "notice", value
        assert value.get("client_id") in ("com.example.oidc", "com.example.relay"), value
        if "subject_hash" in value:
            assert re.fullmatch(r"[0-9a-f]{16}", value["subject_hash"]), value
        assert subject not in [item for key, item in value.items() if key != "ts"], value
        text = json.dumps(value)
        for token in journey["tokens"]:
            assert token not in text
    for value in oidc:
        assert value.get("subject_hash") == subject_hash(subject), value
    reuse = [value for value in oidc if value["audit_event"] == "reuse_detected"]
    assert reuse and reuse[0].get("reason"), reuse
    seen.harvest()
    assert seen.find("\n".join(json.dumps(value) for value in events)) == []


# --------------------------------------------------------------------------- the audit file

@pytest.fixture(scope="module")
def audited(workdir, upstream, relay_doubles, seen):
    port = free_port()
    identity = IdentityDouble()
    audit_file = workdir / "logs-audit-file.audit.log"
    config = gateway_config(port, workdir, "logs-audit-file", upstream["url"], identity.url_for_config,
                            relay_doubles["backend"].url, seen, sections=f"""observability:
  audit:
    file: {audit_file}
""")
    try:
        with gateway(workdir, "logs-audit-file", config, upstream["env"]) as instance:
            instance["audit_file"] = audit_file
            yield instance
    finally:
        identity.stop()


def test_audit_events_go_to_the_configured_file_and_not_to_standard_error(audited, seen):
    app, tokens = relay_sign_in(audited["url"], seen)
    assert app.refresh(tokens["refresh_token"]).status_code == 200
    path = audited["audit_file"]

    def events():
        if not path.exists():
            return None
        lines = [line for line in path.read_text().splitlines() if line]
        names = " ".join(lines)
        return lines if "sign_in" in names and "refresh" in names else None

    lines = poll(events, 10, f"sign_in and refresh in {path.name}")
    for line in lines:
        assert "audit_event" in line, line
        assert "com.example.relay" in line, line
        for token in tokens["access_token"], tokens["refresh_token"]:
            assert token not in line
    assert not any("audit_event" in line for line in audited["lines"].lines_since(0)), "audit lines on standard error"


# --------------------------------------------------------------------------- the access log

REQUESTS = 2000
CONNECTIONS = 32
#: A whole text request line (gatelog's format); anything else holding " request" is torn.
TEXT_REQUEST = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} info gatehouse: (\S+=\S+ )*status=\d{3}"
                          r"( \S+=\S+)* \[GatehouseServer\] request$")


@pytest.fixture(scope="module")
def access_identity():
    identity = IdentityDouble()
    yield identity
    identity.stop()


@pytest.fixture(scope="module")
def access_token(access_identity, seen):
    token = "access-log-" + secrets.token_urlsafe(32)
    seen.add(token, kind="relayed access token (access log test)")
    access_identity.register(token, "alice")
    return token


def access_gateway(workdir, upstream, relay_doubles, seen, identity, name, sections="", json_logs=False, log_level="info"):
    port = free_port()
    backend = relay_doubles["backend"].url
    config = gateway_config(port, workdir, name, upstream["url"], identity.url_for_config, backend, seen,
                            routes=route_yaml("/api/access", backend + "/access", "legacy"), sections=sections)
    return gateway(workdir, name, config, upstream["env"], json_logs=json_logs, log_level=log_level)


def load(port, token, requests_in_all, connections):
    """`requests_in_all` GETs of /api/access/… over `connections` keep-alive connections at
    once; the X-Request-Id of every answer (all 200)."""
    answered = []
    failures = []
    lock = threading.Lock()
    start = threading.Barrier(connections)

    def worker(index):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            start.wait(30)
            for number in range(index, requests_in_all, connections):
                connection.request("GET", f"/api/access/{index}/{number}", headers={"Authorization": f"Bearer {token}"})
                response = connection.getresponse()
                response.read()
                with lock:
                    if response.status == 200:
                        answered.append(response.getheader("X-Request-Id"))
                    else:
                        failures.append(response.status)
        except (OSError, http.client.HTTPException) as error:
            with lock:
                failures.append(type(error).__name__)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(index,), daemon=True) for index in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == [], failures[:10]
    assert len(answered) == requests_in_all
    return answered


def stop_and_read(instance):
    """SIGTERM, exit 0, and every line the process wrote (its standard error read to the end)."""
    process = instance["process"]
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    instance["lines"].wait_for(r"gatehouse stopped", timeout=10)
    # The process has exited: the reader thread copies what is left in the pipe; until it stops growing.
    count = -1
    while count != instance["lines"].mark():
        count = instance["lines"].mark()
        time.sleep(0.3)
    return instance["lines"].lines_since(0)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_every_answered_request_has_exactly_one_whole_line_after_sigterm(log_format, workdir, upstream, relay_doubles, seen,
                                                                         access_identity, access_token):
    json_logs = log_format == "json"
    with access_gateway(workdir, upstream, relay_doubles, seen, access_identity, f"access-log-{log_format}",
                        json_logs=json_logs) as instance:
        warm = requests.get(instance["url"] + "/api/access/warm", headers={"Authorization": f"Bearer {access_token}"}, timeout=10)
        assert warm.status_code == 200, warm.text  # the identity is cached: the GETs take the fast path
        answered = load(instance["port"], access_token, REQUESTS, CONNECTIONS)
        lines = stop_and_read(instance)

    if json_logs:
        values = json_lines(lines)  # every line is one whole JSON object
        request_lines = [value for value in values if value["msg"] == "request"]
    else:
        torn = [line for line in lines if message(line) is None]  # a piece of a line, or two lines in one
        assert torn == [], torn[:5]
        texts = [line for line in lines if message(line) == "request"]
        assert [line for line in texts if not TEXT_REQUEST.match(line)] == []
        request_lines = [fields(line) for line in texts]
    ids = [value["request_id"] for value in request_lines]
    counted = {}
    for request_id in ids:
        counted[request_id] = counted.get(request_id, 0) + 1
    assert [request_id for request_id, count in counted.items() if count > 1] == [], "a request logged twice"
    missing = set(answered) - set(counted)
    assert missing == set(), f"{len(missing)} answered requests have no line"
    assert len(ids) == REQUESTS + 1  # and the warm-up request
    fast = [value for value in request_lines if value.get("relay") == "fast"]
    assert len(fast) >= REQUESTS * 0.9, f"only {len(fast)} of {REQUESTS} requests took the fast path"
    for value in fast:
        assert value["method"] == "GET" and value["status"] == "200" and value["path"].startswith("/api/access/"), value
        assert re.fullmatch(r"\d+\.\d", value["ms"]), value


def test_access_log_off_writes_no_request_line_and_keeps_the_others(workdir, upstream, relay_doubles, seen, access_identity,
                                                                    access_token):
    with access_gateway(workdir, upstream, relay_doubles, seen, access_identity, "access-log-off", json_logs=True,
                        sections="observability:\n  access_log: off\n") as instance:
        base = instance["url"]
        headers = {"Authorization": f"Bearer {access_token}"}
        for path in ["/api/access/warm", "/api/access/fast", "/healthz", "/nowhere"]:
            assert requests.get(base + path, headers=headers, timeout=10).status_code in (200, 404)
        load(instance["port"], access_token, 200, 4)
        lines = stop_and_read(instance)
    values = json_lines(lines)
    assert [value for value in values if value["msg"] == "request"] == []
    messages = {value["msg"] for value in values}
    assert {"gatehouse is ready", "gatehouse stopped"} <= messages, sorted(messages)
