"""OpenTelemetry traces (issue 11, item 2), end to end.

A Gatehouse of this module's own exports its spans (OTLP/HTTP protobuf) to a receiver in the
test (Tests/Support/otlp.py, decoding with `opentelemetry-proto`), with the batch processor's
delay at 100 ms (OTEL_BSP_SCHEDULE_DELAY). One sign-in (through the real django-oauth-toolkit)
and relayed calls go through; the receiver gets a server span per request, an `upstream token`
client span, `identity …` and `backend …` spans; the W3C `traceparent` the test sends continues
into Gatehouse's spans and on to the identity service and the echo backend; no attribute holds
a token, code, verifier, state, secret or query string.
"""

import secrets

import pytest
import requests

from sandbox.gatelog import served_by
from sandbox.nativeapp import free_port
from operations import identity, gateway, gateway_config, relay_sign_in, route_yaml
from otlp import OTLPReceiver

ROUTE_LABEL = "/api/trace/*"


@pytest.fixture(scope="module")
def receiver():
    with OTLPReceiver() as otlp:
        yield otlp


@pytest.fixture(scope="module")
def traced(workdir, upstream, relay_doubles, seen, identity, receiver):
    port = free_port()
    backend = relay_doubles["backend"].url
    config = gateway_config(port, workdir, "tracing", upstream["url"], identity.url_for_config, backend, seen,
                            routes=route_yaml("/api/trace", backend + "/trace", "legacy"),
                            sections=f"""observability:
  tracing:
    otlp_endpoint: {receiver.url}
    service_name: gatehouse
    sample_ratio: 1.0
""")
    with gateway(workdir, "tracing", config, upstream["env"], extra_env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as instance:
        yield instance


@pytest.fixture(scope="module")
def journey(traced, identity, relay_doubles, seen, upstream):
    """One sign-in and two relayed calls (the first with the test's own traceparent); what the
    test needs to find their spans."""
    base = traced["url"]
    app, tokens = relay_sign_in(base, seen)
    relay_token = "trace-" + secrets.token_urlsafe(32)
    query_secret = "q-" + secrets.token_urlsafe(24)
    seen.add(relay_token, kind="relayed access token (tracing test)")
    seen.add(query_secret, kind="query string value (tracing test)")
    identity.register(relay_token, "alice")
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    backend = relay_doubles["backend"]
    mark = backend.mark()
    with requests.Session() as session:
        first = session.get(base + f"/api/trace/x?code={query_secret}", timeout=10, headers={
            "Authorization": f"Bearer {relay_token}", "traceparent": f"00-{trace_id}-{parent_id}-01"})
        assert first.status_code == 200, first.text
        echoed_first = first.json()
        second = session.get(base + "/api/trace/y", headers={"Authorization": f"Bearer {relay_token}"}, timeout=10)
        assert second.status_code == 200, second.text
    assert len(backend.request_lines_since(mark)) == 2
    secrets_used = [tokens["access_token"], tokens["refresh_token"], app.verifier, app.state, relay_token, query_secret,
                    *(value for name, value in upstream["env"].items() if name.startswith("UPSTREAM_SECRET"))]
    return {"app": app, "tokens": tokens, "relay_token": relay_token,
            "trace_id": trace_id, "parent_id": parent_id, "first": first, "second": second, "echoed": echoed_first,
            "secrets": secrets_used, "query_secret": query_secret}


def server_span(spans, request_id):
    matches = [s for s in spans if s.kind == "server" and s.attributes.get("gatehouse.request_id") == request_id]
    return matches[0] if matches else None


def test_sign_in_has_a_server_span_per_request_and_an_upstream_token_client_span(traced, journey, receiver):
    def token_spans(spans):
        servers = [s for s in spans if s.kind == "server" and s.attributes.get("http.route") == "/oauth/token"]
        upstream = [s for s in spans if s.name == "upstream token"]
        return servers and upstream

    spans = receiver.wait_for(token_spans, 15, "the token endpoint's server span and its `upstream token` span")
    (token_server,) = [s for s in spans if s.kind == "server" and s.attributes.get("http.route") == "/oauth/token"]
    assert token_server.name == "HTTP POST /oauth/token"
    assert token_server.attributes["http.request.method"] == "POST"
    assert token_server.attributes["http.response.status_code"] == 200
    assert token_server.attributes.get("gatehouse.request_id")
    (upstream_span,) = [s for s in spans if s.name == "upstream token"]
    assert upstream_span.kind == "client"
    assert upstream_span.trace_id == token_server.trace_id
    assert upstream_span.parent_span_id == token_server.span_id
    assert upstream_span.attributes["gatehouse.upstream"] == "legacy"
    assert upstream_span.attributes["gatehouse.endpoint"] == "token"
    assert upstream_span.attributes["gatehouse.outcome"] == "ok"
    assert upstream_span.attributes["http.response.status_code"] == 200
    # The browser's GET /oauth/authorize had its own server span.
    authorize = [s for s in spans if s.kind == "server" and s.attributes.get("http.route") == "/oauth/authorize"]
    assert authorize and authorize[0].name == "HTTP GET /oauth/authorize"
    assert all(s.resource.get("service.name") == "gatehouse" for s in spans)


def test_the_apps_traceparent_continues_through_identity_and_backend(traced, journey, receiver, identity):
    trace_id, request_id = journey["trace_id"], journey["first"].headers["X-Request-Id"]

    def relayed(spans):
        mine = [s for s in spans if s.trace_id == trace_id]
        return (server_span(mine, request_id) and any(s.name.startswith("backend ") for s in mine)
                and any(s.name.startswith("identity ") for s in mine))

    spans = [s for s in receiver.wait_for(relayed, 15, "the relayed call's server, identity and backend spans")
             if s.trace_id == trace_id]
    server = server_span(spans, request_id)
    assert server.name == f"HTTP GET {ROUTE_LABEL}"
    assert server.parent_span_id == journey["parent_id"], "the app's traceparent is the server span's parent"
    assert server.attributes["http.route"] == ROUTE_LABEL
    assert server.attributes["http.request.method"] == "GET"
    assert server.attributes["http.response.status_code"] == 200
    (identity_span,) = [s for s in spans if s.name.startswith("identity ")]
    assert identity_span.name == "identity legacy"
    (backend_span,) = [s for s in spans if s.name.startswith("backend ")]
    assert backend_span.name == f"backend {ROUTE_LABEL}"
    assert backend_span.attributes["server.address"] == "127.0.0.1"
    assert backend_span.attributes["http.response.status_code"] == 200
    ids = {s.span_id for s in spans}
    assert backend_span.parent_span_id in ids and identity_span.parent_span_id in ids

    # The echo backend saw the same trace, its parent the backend span.
    traceparent = journey["echoed"]["headers"].get("traceparent")
    assert traceparent, "no traceparent reached the backend"
    assert "," not in traceparent, f"the backend got several traceparent fields: {traceparent}"
    version, backend_trace, backend_parent, flags = traceparent.split("-")
    assert backend_trace == trace_id
    assert backend_parent == backend_span.span_id
    # And so did the identity service.
    assert any(tp and tp.split("-")[1] == trace_id for tp in identity.traceparents), identity.traceparents
    assert all(tp is None or "," not in tp for tp in identity.traceparents), \
        f"the identity service got several traceparent fields: {identity.traceparents}"


def test_tracing_turns_the_fast_path_off(traced, journey, receiver):
    # The second relayed call had its identity cached: without tracing the fast path would serve it.
    assert served_by(traced["lines"], journey["second"]) == "general"
    request_id = journey["second"].headers["X-Request-Id"]

    def has_backend(spans):
        server = server_span(spans, request_id)
        return server and any(s.name.startswith("backend ") and s.trace_id == server.trace_id for s in spans)

    receiver.wait_for(has_backend, 15, "the second relayed call's server and backend spans")


def test_no_span_attribute_holds_a_token_code_verifier_secret_or_query(traced, journey, receiver, seen):
    spans = receiver.wait_for(lambda spans: len(spans) >= 6, 15, "the journey's spans")
    seen.harvest()
    carrying = []  # (span, attribute): never the value, which may be a secret
    for span in spans:
        for where, values in (("attribute", span.attributes), ("resource", span.resource)):
            for key, value in values.items():
                text = str(value)
                if any(secret in text for secret in journey["secrets"]) or seen.find(text):
                    carrying.append((span.name, where, key, "a secret"))
                elif "?" in text or "code=" in text:
                    carrying.append((span.name, where, key, "a query string"))
        if any(secret in span.name for secret in journey["secrets"]) or "?" in span.name:
            carrying.append((span.name, "name", "", "a secret or query"))
    assert carrying == [], "span attributes carrying secrets or query strings"
    assert receiver.refused == []
