"""Issue 12, end to end: the relay's fast path now carries https backends (trusted through a
route's `backend_ca_file`) and request bodies framed by Content-Length of at most
min(the route's max_body_bytes, 64 KiB); a body is read whole before the backend is contacted,
and a POST or PATCH whose pooled backend connection fails is never sent twice.

As in test_relay: a test that takes `relay_path` runs once per path, for real. "general": a
fresh token, whose first relayed request is an identity-cache miss (Hummingbird +
AsyncHTTPClient); "fast": a warm token, whose identity is cached (the NIO handler); `served_by`
reads from the request's log line which path answered. Every route used here is on the
`legacy-json` upstream, so a token warmed on /api/json is warm for all of them.

The doubles (conftest `relay_doubles`): "tls_backend" is the echo backend over TLS with a
self-signed certificate for 127.0.0.1 (routes /api/tls, trusted, and /api/tls-untrusted, whose
backend_ca_file is another self-signed certificate); "dropping" answers the first request of
each connection and closes the connection, without an answer, on any later one (/api/dropping).
"""

import hashlib
import json
import os
import re
import subprocess

import pytest

from sandbox.gatelog import served_by
from rawhttp import RawClient, request

HTTP_ROUTE, HTTP_BACKEND = "/api/json", "/json"  # legacy-json, max_body_bytes 10 MiB (default)
TLS_ROUTE, TLS_BACKEND = "/api/tls", "/tls"  # the https backend, legacy-json, every method
UNTRUSTED_ROUTE = "/api/tls-untrusted"  # the same backend, checked against another certificate
WRONG_NAME_ROUTE = "/api/tls-wrong-name"  # a backend whose certificate names backend.invalid, reached as https://localhost:PORT
SMALL_ROUTE, SMALL_LIMIT = "/api/small", 1024  # plain http, max_body_bytes 1024
DROPPING_ROUTE, DROPPING_BACKEND = "/api/dropping", "/dropping"
FAST_BODY_LIMIT = 64 * 1024

ROUTES = {"http": (HTTP_ROUTE, HTTP_BACKEND), "https": (TLS_ROUTE, TLS_BACKEND)}


# --------------------------------------------------------------------------- helpers

def token_for(relay_path, tokens):
    """alice's token for a route of the legacy-json upstream: fresh for "general" (only its first
    relayed request is sure to go the general way), warm for "fast"."""
    return tokens.fresh() if relay_path == "general" else tokens.warm(HTTP_ROUTE)


def auth(token):
    return [("Authorization", f"Bearer {token}")]


def send(gatehouse, method, target, token=None, headers=(), body=b"", **options):
    """One request on a connection of its own; the answer (None if closed without one)."""
    headers = (auth(token) if token else []) + list(headers)
    with RawClient(gatehouse["port"], timeout=30) as client:
        return client.exchange(request(method, target, headers, body, **options), head_request=method == "HEAD")


def problem(response, status, code):
    """Asserts `response` is the problem+json answer `status` / `code`."""
    assert response is not None, "the connection was closed without an answer"
    assert response.status == status, response
    assert response.header("Content-Type", "").startswith("application/problem+json"), response.headers
    assert response.json().get("code") == code, (response, response.headers, response.json())


def json_body(size):
    """A JSON document of exactly `size` bytes (UTF-8, with multi-byte characters)."""
    document = {"contract": "42", "lines": [{"n": index, "label": f"ligne {index} \u00e9\u20ac"} for index in range(12)], "pad": ""}
    raw = json.dumps(document, ensure_ascii=False).encode()
    document["pad"] = "p" * (size - len(raw))
    raw = json.dumps(document, ensure_ascii=False).encode()
    assert len(raw) == size
    return raw


#: A small binary body with everything a framing bug would trip on: NULs, CR LF, an empty line,
#: what looks like a response head, and every byte value.
BINARY_BODY = (bytes(range(256)) + b"\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" + b"\x00" * 17
               + bytes(range(255, -1, -1)) + b"\r\n0\r\n\r\n")


def assert_echoed(response, method, backend_path, body, content_type=None):
    """The echo backend's record in `response`: `body` arrived byte for byte, with its length."""
    assert response is not None and response.status == 200, response
    echoed = response.json()
    assert echoed["method"] == method
    assert echoed["path"] == backend_path
    assert echoed["body_bytes"] == len(body)
    assert echoed["body_sha256"] == hashlib.sha256(body).hexdigest()
    if body or method in ("POST", "PUT", "PATCH"):
        assert echoed["headers"].get("content-length") == str(len(body)), echoed["headers"]
    else:  # no body: no length, or 0
        assert echoed["headers"].get("content-length") in (None, "0"), echoed["headers"]
    assert "transfer-encoding" not in echoed["headers"], echoed["headers"]
    if content_type is not None:
        assert echoed["headers"].get("content-type") == content_type
    return echoed


def backend_of(relay_doubles, route):
    return relay_doubles["tls_backend"] if route.startswith(TLS_ROUTE) else relay_doubles["backend"]


# =========================================================================== A. https backends

def test_a_get_over_tls_reaches_the_backend_with_identity_headers_and_the_rest_of_the_path(gatehouse, relay_doubles, tokens,
                                                                                            relay_path):
    backend = relay_doubles["tls_backend"]
    calls, mark = backend.calls, backend.mark()
    response = send(gatehouse, "GET", TLS_ROUTE + "/42/lines?from=2026-01", token_for(relay_path, tokens))
    assert response is not None and response.status == 200, response
    assert served_by(gatehouse, response) == relay_path
    echoed = response.json()
    assert echoed["path"] == TLS_BACKEND + "/42/lines?from=2026-01"
    headers = echoed["headers"]
    assert (headers["x-bpid"], headers["x-subject"]) == ("1000123", "alice")
    assert "authorization" not in headers
    assert headers["x-request-id"] == response.request_id
    assert headers["x-forwarded-proto"] == "http"  # the app's scheme, not the backend's
    assert headers["host"] == f"127.0.0.1:{backend.port}"
    assert response.header("X-Backend") == "echo" and response.header("Keep-Alive") is None
    # Exactly one request, and it came over TLS: the plain backend has no /tls path to echo.
    assert backend.calls == calls + 1
    assert backend.request_lines_since(mark) == [(b"GET", (TLS_BACKEND + "/42/lines?from=2026-01").encode())]


def test_a_head_over_tls_has_the_length_and_no_body_and_the_connection_stays_usable(gatehouse, relay_doubles, tokens, relay_path):
    backend = relay_doubles["tls_backend"]
    with RawClient(gatehouse["port"], timeout=30) as client:
        token = token_for(relay_path, tokens)
        head = client.exchange(request("HEAD", TLS_ROUTE + "/download?bytes=1000", auth(token)), head_request=True)
        assert head is not None and head.status == 200, head
        assert head.header("Content-Length") == "1000"
        assert served_by(gatehouse, head) == relay_path
        assert backend.last_request["method"] == "HEAD"
        # Had any body byte followed the HEAD's answer, it would be read as the next answer's start.
        after = client.exchange(request("GET", TLS_ROUTE + "/after-head", auth(token)))
        assert after is not None and after.status == 200, after
        assert after.json()["path"] == TLS_BACKEND + "/after-head"


def test_a_large_download_over_tls_arrives_whole(gatehouse, relay_doubles, tokens, relay_path):
    size = 3 * 1024 * 1024 + 17  # many TLS records, and more than any socket buffer
    response = send(gatehouse, "GET", TLS_ROUTE + f"/download?bytes={size}", token_for(relay_path, tokens))
    assert response is not None and response.status == 200, response
    assert served_by(gatehouse, response) == relay_path
    assert len(response.body) == size
    assert hashlib.sha256(response.body).hexdigest() == relay_doubles["tls_backend"].pattern_sha256(size)


@pytest.mark.parametrize("route", [UNTRUSTED_ROUTE, WRONG_NAME_ROUTE], ids=["untrusted", "wrong-name"])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_an_untrusted_tls_backend_is_502_and_never_gets_a_request(gatehouse, relay_doubles, tokens, relay_path, method, route):
    """/api/tls-untrusted's backend_ca_file is a certificate the backend does not have;
    /api/tls-wrong-name trusts its backend's certificate but reaches it as `localhost`, a name
    the certificate (DNS:backend.invalid only) does not carry. Gatehouse connects, refuses the
    handshake, and answers 502. The backend sees a connection and a broken-off handshake, never
    a request. (NIOSSL also accepts a certificate whose IP address entry is the address
    connected to, whatever the URL's name: docs/security.md.)"""
    backend = relay_doubles["tls_named_backend" if route == WRONG_NAME_ROUTE else "tls_backend"]
    token = token_for(relay_path, tokens)
    calls, mark, connections = backend.calls, backend.mark(), backend.connections
    handshakes, failures = backend.handshakes, backend.handshake_failures
    body = json_body(2048) if method == "POST" else b""
    response = send(gatehouse, method, route + "/x", token, body=body)
    problem(response, 502, "backend_unavailable")
    assert served_by(gatehouse, response) == relay_path
    assert backend.connections > connections, "Gatehouse never connected: the 502 is not the handshake's"
    if route == UNTRUSTED_ROUTE:
        # The chain is refused within the handshake. A wrong name is found by NIOSSL once the
        # handshake is done on the client's side (in TLS 1.3 the server may count it complete).
        assert backend.wait_for_handshake_failures(failures + 1, 10) > failures, "no handshake was broken off"
        assert backend.handshakes == handshakes, "a handshake with the untrusted certificate completed"
    assert backend.calls == calls and backend.request_lines_since(mark) == []


def test_tls_connections_to_the_backend_are_pooled_on_the_fast_path(gatehouse, relay_doubles, tokens):
    backend = relay_doubles["tls_backend"]
    token = tokens.warm(HTTP_ROUTE)
    with RawClient(gatehouse["port"], timeout=30) as client:
        first = client.exchange(request("GET", TLS_ROUTE + "/pooled/first", auth(token)))
        assert first is not None and first.status == 200, first
        connections, handshakes = backend.connections, backend.handshakes
        answers = [client.exchange(request("GET", TLS_ROUTE + f"/pooled/{index}", auth(token))) for index in range(20)]
    assert [answer.status if answer else None for answer in answers] == [200] * 20
    assert [served_by(gatehouse, answer) for answer in answers] == ["fast"] * 20
    assert [answer.json()["path"] for answer in answers] == [TLS_BACKEND + f"/pooled/{index}" for index in range(20)]
    # Twenty sequential requests from one client connection (one event loop) on the pooled one.
    assert backend.connections == connections and backend.handshakes == handshakes, \
        f"{backend.connections - connections} new TLS connections for 20 sequential requests"


def check_config(gatehouse, upstream, path):
    return subprocess.run([str(gatehouse["binary"]), "check-config", str(path)], capture_output=True, text=True, timeout=60,
                          env=upstream["env"])


def test_backend_ca_file_is_refused_where_it_cannot_apply(gatehouse, upstream, relay_doubles, workdir):
    text = gatehouse["config"].read_text()
    accepted = check_config(gatehouse, upstream, gatehouse["config"])
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr  # the suite's own routes, backend_ca_file included
    index = len(re.findall(r"^  - prefix: ", text.split("\nroutes:", 1)[1].split("\nsessions:", 1)[0], re.MULTILINE))
    no_certificate = workdir / "ca-without-certificate.pem"
    key_only = relay_doubles["tls_certificate"].with_suffix(".key")  # a PEM file: a private key, no certificate
    no_certificate.write_text("# not a certificate\n")
    cases = {
        "on an http:// backend": (relay_doubles["backend"].url + "/x", relay_doubles["tls_certificate"]),
        "an unreadable file": (relay_doubles["tls_backend"].url + "/x", workdir / "no-such-ca.pem"),
        "a file without a certificate": (relay_doubles["tls_backend"].url + "/x", no_certificate),
        "a private key only": (relay_doubles["tls_backend"].url + "/x", key_only),
    }
    wrong = []
    for name, (backend, ca_file) in cases.items():
        route = f"""
  - prefix: /api/refused
    backend: {backend}
    methods: [GET]
    upstream: legacy-json
    backend_ca_file: {ca_file}"""
        path = workdir / f"refused-{re.sub(r'[^a-z]+', '-', name)}.yaml"
        path.write_text(text.replace("\nsessions:", route + "\nsessions:", 1))
        result = check_config(gatehouse, upstream, path)
        if result.returncode != 78 or f"routes[{index}].backend_ca_file" not in result.stdout:
            wrong.append(f"{name}: exit {result.returncode}: {result.stdout.strip()[-400:]}")
    assert wrong == [], "\n".join(wrong)


# =========================================================================== B. bodies

BODIES = {
    "post-json-2k": ("POST", json_body(2048), "application/json"),
    "put-binary": ("PUT", BINARY_BODY, "application/octet-stream"),
}


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("kind", list(BODIES))
def test_a_small_body_arrives_byte_identical_with_its_length(gatehouse, relay_doubles, tokens, relay_path, scheme, kind):
    method, body, content_type = BODIES[kind]
    route, backend_path = ROUTES[scheme]
    backend = backend_of(relay_doubles, route)
    token = token_for(relay_path, tokens)  # (warming is a request to the backend)
    calls = backend.calls
    response = send(gatehouse, method, route + f"/{kind}", token, [("Content-Type", content_type)], body)
    assert_echoed(response, method, backend_path + f"/{kind}", body, content_type)
    assert served_by(gatehouse, response) == relay_path
    assert backend.calls == calls + 1  # delivered once


@pytest.mark.parametrize("route, method", [(HTTP_ROUTE, "POST"), (HTTP_ROUTE, "PUT"), (TLS_ROUTE, "PATCH"), (TLS_ROUTE, "DELETE")],
                         ids=["http-POST", "http-PUT", "https-PATCH", "https-DELETE"])
def test_the_log_line_gives_the_real_method(gatehouse, relay_doubles, tokens, relay_path, route, method):
    body = json_body(600)
    target = route + f"/logged-{method.lower()}"
    response = send(gatehouse, method, target, token_for(relay_path, tokens), [("Content-Type", "application/json")], body)
    assert_echoed(response, method, route.replace("/api", "", 1) + f"/logged-{method.lower()}", body)
    meta = gatehouse["lines"].request(response.request_id)
    assert meta.get("relay") == relay_path, meta
    assert meta.get("method") == method, meta
    assert meta.get("path") == target and meta.get("status") == "200", meta


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_an_empty_post_is_relayed_with_content_length_zero(gatehouse, relay_doubles, tokens, relay_path, scheme):
    route, backend_path = ROUTES[scheme]
    response = send(gatehouse, "POST", route + "/empty", token_for(relay_path, tokens), [("Content-Length", "0")])
    assert_echoed(response, "POST", backend_path + "/empty", b"")
    assert served_by(gatehouse, response) == relay_path


def test_a_body_exactly_at_the_routes_limit_passes(gatehouse, relay_doubles, tokens, relay_path):
    body = bytes(range(256)) * (SMALL_LIMIT // 256)
    assert len(body) == SMALL_LIMIT
    response = send(gatehouse, "POST", SMALL_ROUTE + "/at-limit", token_for(relay_path, tokens), body=body)
    assert_echoed(response, "POST", "/small/at-limit", body)
    assert served_by(gatehouse, response) == relay_path


def test_a_body_one_byte_over_the_routes_limit_is_413_and_never_relayed(gatehouse, relay_doubles, tokens, relay_path):
    backend = relay_doubles["backend"]
    token, warm = token_for(relay_path, tokens), tokens.warm(HTTP_ROUTE)  # (warming is a request to the backend)
    calls, mark = backend.calls, backend.mark()
    response = send(gatehouse, "POST", SMALL_ROUTE + "/over-limit", token, body=b"x" * (SMALL_LIMIT + 1))
    problem(response, 413, "payload_too_large")
    assert served_by(gatehouse, response) == "general"  # refusals are the general path's
    # A request after it is answered, so a late relay of the refused one would be seen too.
    assert send(gatehouse, "GET", SMALL_ROUTE + "/after-413", warm).status == 200
    assert backend.request_lines_since(mark) == [(b"GET", b"/small/after-413")]
    assert backend.calls == calls + 1


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("size, path", [(FAST_BODY_LIMIT, "fast"), (FAST_BODY_LIMIT + 1, "general"), (300 * 1024, "general")],
                         ids=["64KiB", "64KiB+1", "300KiB"])
def test_the_fast_path_takes_bodies_up_to_64_kib_and_larger_ones_still_arrive(gatehouse, relay_doubles, tokens, scheme, size, path):
    route, backend_path = ROUTES[scheme]
    body = os.urandom(size)
    response = send(gatehouse, "PUT", route + f"/sized-{size}", tokens.warm(HTTP_ROUTE), body=body)
    assert_echoed(response, "PUT", backend_path + f"/sized-{size}", body)
    assert served_by(gatehouse, response) == path


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("status", [201, 204, 404, 503])
def test_the_backends_answer_to_a_body_is_relayed_as_it_is_and_the_connection_stays_in_step(gatehouse, tokens, relay_path, scheme,
                                                                                           status):
    route, backend_path = ROUTES[scheme]
    token = token_for(relay_path, tokens)
    with RawClient(gatehouse["port"], timeout=30) as client:
        answer = client.exchange(request("POST", route + f"/status/{status}", auth(token), json_body(2048)))
        assert answer is not None and answer.status == status, answer
        assert served_by(gatehouse, answer) == relay_path
        if status == 204:
            assert answer.body == b"" and answer.header("Content-Length") is None
        else:
            assert answer.json() == {"status": status}
        # A 204 with a stray body, or a body cut short, would shift every later answer.
        then = client.exchange(request("PUT", route + "/after-status", auth(token), BINARY_BODY))
        assert_echoed(then, "PUT", backend_path + "/after-status", BINARY_BODY)
        assert client.buffer == b""


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_body_sent_in_small_pieces_arrives_whole(gatehouse, tokens, relay_path, scheme):
    """The head and a 2 KiB body written 7 bytes at a time (TCP_NODELAY: many small segments)."""
    route, backend_path = ROUTES[scheme]
    body = json_body(2048)
    payload = request("POST", route + "/pieces", auth(token_for(relay_path, tokens)), body)
    with RawClient(gatehouse["port"], timeout=30) as client:
        for offset in range(0, len(payload), 7):
            client.send(payload[offset:offset + 7])
        answer = client.read_response()
    assert_echoed(answer, "POST", backend_path + "/pieces", body)
    assert served_by(gatehouse, answer) == relay_path


def chunked(data, size):
    return b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size]) for i in range(0, len(data), size)) + b"0\r\n\r\n"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_small_chunked_body_goes_the_general_way_and_arrives_whole(gatehouse, tokens, scheme):
    route, backend_path = ROUTES[scheme]
    body = json_body(2048)
    response = send(gatehouse, "POST", route + "/chunked", tokens.warm(HTTP_ROUTE), [("Transfer-Encoding", "chunked")],
                    chunked(body, 100), length=False)
    assert response is not None and response.status == 200, response
    echoed = response.json()
    assert echoed["body_bytes"] == len(body) and echoed["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert echoed["path"] == backend_path + "/chunked"
    assert served_by(gatehouse, response) == "general"


@pytest.mark.parametrize("framing", [
    [("Content-Length", "5"), ("Content-Length", "10")],
    [("Content-Length", "5, 10")],
    [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
    [("Content-Length", "-5")],
    [("Content-Length", "0x5")],
], ids=["two-lengths", "length-list", "length-and-chunked", "negative", "hex"])
def test_ambiguous_body_framing_is_refused_and_never_relayed(gatehouse, relay_doubles, tokens, framing):
    """With a warm token (the fast path reads bodies now): a request whose body length two
    readers could read differently is refused, and nothing, neither it nor what follows it on the
    connection, reaches the backend."""
    backend = relay_doubles["backend"]
    warm = tokens.warm(HTTP_ROUTE)  # (warming is a request to the backend)
    calls, mark = backend.calls, backend.mark()
    smuggled = request("GET", HTTP_ROUTE + "/smuggled", auth(warm))
    with RawClient(gatehouse["port"], timeout=30) as client:
        client.send(request("POST", HTTP_ROUTE + "/ambiguous", auth(warm) + framing, b"hello" + smuggled,
                            length=False))
        try:
            answer = client.read_response()
        except EOFError:
            answer = None
        if answer is not None:
            assert 400 <= answer.status < 500, answer
            assert client.wait_closed(5), "the connection stayed open after ambiguous framing"
    assert backend.calls == calls and backend.request_lines_since(mark) == []


# =========================================================================== C. raw sockets

@pytest.mark.parametrize("route", [SMALL_ROUTE, HTTP_ROUTE, TLS_ROUTE], ids=["small", "http", "https"])
@pytest.mark.parametrize("ending", ["closes", "finishes"])
def test_a_body_that_stops_halfway_never_produces_a_request_at_the_backend(gatehouse, relay_doubles, tokens, relay_path, route, ending):
    """The head and half of a 1000-byte body, then nothing: the backend gets no request while the
    rest is missing (requests on other connections are served meanwhile, and counted), and none
    at all if the client closes. If the rest comes, the request arrives whole, once. (The fast
    path reads every body it takes whole first; the general path reads bodies of at most 64 KiB
    whole too, and streams larger ones.)"""
    backend = backend_of(relay_doubles, route)
    backend_path = route.replace("/api", "", 1)
    body = os.urandom(1000)
    token, warm = token_for(relay_path, tokens), tokens.warm(HTTP_ROUTE)  # (warming is a request to the backend)
    calls, mark = backend.calls, backend.mark()
    half = RawClient(gatehouse["port"], timeout=30)
    try:
        whole = request("POST", route + "/half", auth(token), body)
        half.send(whole[:-len(body) // 2])
        # A request on another connection, answered: had the half one been relayed on arrival
        # of its head, the backend would have read it by now.
        other = send(gatehouse, "GET", route + "/meanwhile", warm)
        assert other is not None and other.status == 200, other
        assert backend.request_lines_since(mark) == [(b"GET", (backend_path + "/meanwhile").encode())]
        assert backend.calls == calls + 1  # the counter moves for a request that did arrive
        if ending == "closes":
            half.close()
            after = send(gatehouse, "GET", route + "/after-close", warm)
            assert after is not None and after.status == 200, after
            assert backend.request_lines_since(mark) == [(b"GET", (backend_path + "/meanwhile").encode()),
                                                         (b"GET", (backend_path + "/after-close").encode())]
            assert backend.calls == calls + 2
        else:
            half.send(whole[-len(body) // 2:])
            response = half.read_response()
            assert_echoed(response, "POST", backend_path + "/half", body)
            assert served_by(gatehouse, response) == relay_path
            lines = backend.request_lines_since(mark)
            assert lines.count((b"POST", (backend_path + "/half").encode())) == 1, lines
    finally:
        half.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_pipelined_requests_with_bodies_are_answered_in_order_each_with_its_own_body(gatehouse, relay_doubles, tokens, relay_path,
                                                                                      scheme):
    route, backend_path = ROUTES[scheme]
    token, warm = token_for(relay_path, tokens), tokens.warm(HTTP_ROUTE)
    backend = backend_of(relay_doubles, route)
    mark = backend.mark()
    # A body that is itself a whole request: if framing slipped, it would be relayed on its own.
    smuggled = request("GET", route + "/smuggled", auth(warm))
    sequence = [  # (method, name, body, the path that must serve it or None when either may)
        ("POST", "first", json_body(2048), relay_path),
        ("POST", "smuggling", smuggled, None),
        ("PUT", "binary", BINARY_BODY, None),
        ("GET", "plain", b"", None),
        ("POST", "empty", b"", None),
        ("PATCH" if scheme == "https" else "POST", "odd", b"x" * 4097, None),
        ("POST", "large", os.urandom(FAST_BODY_LIMIT + 10), "general"),
        ("DELETE" if scheme == "https" else "PUT", "last", b"{}", None),
    ]
    payloads = [request(method, route + f"/{name}", auth(token), body) for method, name, body, _ in sequence]
    with RawClient(gatehouse["port"], timeout=60) as client:
        client.send(b"".join(payloads))
        answers = [client.read_response() for _ in sequence]
        assert client.buffer == b"", f"bytes after the last answer: {client.buffer[:200]!r}"
        extra = client.exchange(request("GET", route + "/then", auth(token)))  # the connection is still in step
        assert extra is not None and extra.json()["path"] == backend_path + "/then", extra
    for answer, (method, name, body, path) in zip(answers, sequence):
        assert_echoed(answer, method, backend_path + f"/{name}", body)
        served = served_by(gatehouse, answer)
        assert served == path if path else served in ("fast", "general"), (name, served)
    ids = [answer.request_id for answer in answers]
    assert len(set(ids)) == len(ids)
    assert (b"GET", (backend_path + "/smuggled").encode()) not in backend.request_lines_since(mark)


@pytest.mark.parametrize("method", ["POST", "PATCH"])
def test_a_post_whose_pooled_connection_the_backend_closed_is_answered_and_never_sent_twice(gatehouse, relay_doubles, tokens,
                                                                                             relay_path, method):
    dropping = relay_doubles["dropping"]
    name = f"{method.lower()}-{relay_path}-{os.urandom(4).hex()}"
    body = json_body(2048)
    # A fresh token per request on the general path (a second request of one token may go fast).
    warm_up_token, token = (tokens.fresh(), tokens.fresh()) if relay_path == "general" else (tokens.warm(HTTP_ROUTE),) * 2
    with RawClient(gatehouse["port"], timeout=30) as client:
        warm_up = client.exchange(request("GET", DROPPING_ROUTE + f"/{name}-warm-up", auth(warm_up_token)))
        assert warm_up is not None and warm_up.status == 200, warm_up
        answer = client.exchange(request(method, DROPPING_ROUTE + f"/{name}", auth(token), body), timeout=20)
    assert answer is not None, "closed without an answer"
    assert served_by(gatehouse, answer) == relay_path
    deliveries = dropping.deliveries(f"{DROPPING_BACKEND}/{name}")
    assert len(deliveries) == 1, f"the {method} reached the backend {len(deliveries)} times: {deliveries}"
    delivered = deliveries[0]
    assert delivered["method"] == method and delivered["body_sha256"] == hashlib.sha256(body).hexdigest()
    if delivered["answered"]:  # it went on a new connection, which the backend answered
        assert answer.status == 200, answer
    else:  # on the pooled connection the backend closed: a 502, not a second attempt
        problem(answer, 502, "backend_unavailable")
    print(f"{method} on the {relay_path} path: {'a new connection' if delivered['answered'] else 'the reused connection'}, "
          f"answered {answer.status}")


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_an_idempotent_request_whose_pooled_connection_the_backend_closed_is_sent_again(gatehouse, relay_doubles, tokens, method):
    dropping = relay_doubles["dropping"]
    name = f"{method.lower()}-{os.urandom(4).hex()}"
    body = BINARY_BODY if method == "PUT" else b""
    token = tokens.warm(HTTP_ROUTE)
    with RawClient(gatehouse["port"], timeout=30) as client:
        warm_up = client.exchange(request("GET", DROPPING_ROUTE + f"/{name}-warm-up", auth(token)))
        assert warm_up is not None and warm_up.status == 200, warm_up
        answer = client.exchange(request(method, DROPPING_ROUTE + f"/{name}", auth(token), body), timeout=20)
    assert answer is not None and answer.status == 200, answer
    assert served_by(gatehouse, answer) == "fast"
    deliveries = dropping.deliveries(f"{DROPPING_BACKEND}/{name}")
    # The pooled connection of the warm-up was taken and dropped, then a new one answered.
    assert [delivery["answered"] for delivery in deliveries] == [False, True], deliveries
    assert all(delivery["body_sha256"] == hashlib.sha256(body).hexdigest() for delivery in deliveries)
    assert answer.json()["body_sha256"] == hashlib.sha256(body).hexdigest()
