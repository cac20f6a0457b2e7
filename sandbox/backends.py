"""In-process test doubles for Gatehouse's resource relay: the backend it relays to,
the legacy identity service it asks who a token belongs to, and a JWT issuer.

Each server listens on 127.0.0.1 on a free port in a daemon thread, speaks HTTP/1.1
(keep-alive), has a `.url`, a `.stop()` (also usable as a context manager) and
thread-safe counters:

    calls          requests received (every method, every path)
    connections    TCP connections accepted (tests of connection reuse)
    in_flight      requests being handled right now; max_in_flight: the high-water mark
    reset()        zeroes the counters

`.stop()` stops listening, wakes every request waiting in a delay and shuts down
every open connection, so a stopped server is really gone (no pooled keep-alive
connection keeps talking to it).

    EchoBackend                  the "ESB": echoes what it received, streams downloads
    TLSEchoBackend               the same over TLS (https://), with a certificate of the test's
                                 making (self_signed_certificate)
    PersonalInformationService   legacy myVOO SCIF GetPersonalInformation (XML + JSON twin),
                                 validating tokens by RFC 7662 introspection
    JWTIssuer                    RFC 9068 JWT access tokens + its JWKS (RFC 7517)
"""

import base64
import hashlib
import hmac
import json
import re
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import requests
from jwcrypto import jwk, jwt

CHUNK = 64 * 1024


# --------------------------------------------------------------------------- plumbing

class _HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer (daemon threads) that remembers its open connections."""

    request_queue_size = 1024  # listen backlog: bursts of hundreds of concurrent connections
    daemon_threads = True

    def __init__(self, owner, handler, port=0):
        self.owner = owner
        self.open_connections = set()
        self.connections_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), handler)  # SO_REUSEADDR: a stopped port can be taken again at once

    def process_request(self, request, client_address):
        with self.connections_lock:
            self.open_connections.add(request)
        self.owner._connected()
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self.connections_lock:
            self.open_connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        # A client (or stop()) closing the connection mid-request is routine here.
        if not isinstance(sys.exc_info()[1], OSError):  # resets, broken pipes, timeouts
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 handler: every method goes to `respond()`, counted by the owner."""

    protocol_version = "HTTP/1.1"
    timeout = 120  # idle/slow socket limit per connection; stop() ends them sooner
    # The head and the body go out in two writes: without TCP_NODELAY the body waits for
    # the peer's delayed ACK of the head (40 ms per answer on Linux loopback).
    disable_nagle_algorithm = True

    def __getattr__(self, name):  # do_GET, do_POST, do_PATCH, ... all go to _dispatch
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    @property
    def owner(self):
        return self.server.owner

    def _dispatch(self):
        self.owner._begin()
        try:
            self.respond()
        finally:
            self.owner._end()

    def respond(self):
        raise NotImplementedError

    def log_message(self, *args):
        pass

    def client_wants_close(self):
        return "close" in self.headers.get("Connection", "").lower()

    def read_body(self, sink=None):
        """Reads the request body in chunks (Content-Length or chunked, RFC 9112 §6-7),
        passing each to `sink`; returns its size. Never holds the whole body in memory."""
        size = 0
        encoding = self.headers.get("Transfer-Encoding")
        if encoding is not None:  # Transfer-Encoding overrides Content-Length (RFC 9112 §6.3)
            if encoding.split(",")[-1].strip().lower() != "chunked":
                raise ValueError(f"unsupported Transfer-Encoding {encoding!r}")
            while True:
                line = self.rfile.readline(1024)
                if not line.endswith(b"\n"):
                    raise ValueError("truncated chunk size line")
                length = int(line.split(b";")[0].strip(), 16)  # ignore chunk extensions
                if length == 0:
                    break
                while length:
                    data = self.rfile.read(min(CHUNK, length))
                    if not data:
                        raise ValueError("truncated chunk")
                    length -= len(data)
                    size += len(data)
                    if sink:
                        sink(data)
                if self.rfile.readline(1024).strip():
                    raise ValueError("chunk not followed by CRLF")
            while self.rfile.readline(8192).strip():  # trailer section, up to the empty line
                pass
            return size
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0:
            raise ValueError("negative Content-Length")
        while size < length:
            data = self.rfile.read(min(CHUNK, length - size))
            if not data:
                raise ValueError("truncated body")
            size += len(data)
            if sink:
                sink(data)
        return size

    def start(self, status, content_type=None, length=None, headers=()):
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        for name, value in headers:
            self.send_header(name, value)
        if self.client_wants_close():
            self.send_header("Connection", "close")
        self.end_headers()

    def send_body(self, status, body, content_type, headers=()):
        no_body = self.command == "HEAD" or status in (204, 304)
        self.start(status, content_type, None if status == 204 else len(body), headers)
        if not no_body:
            self.wfile.write(body)

    def send_json(self, status, value, headers=()):
        self.send_body(status, json.dumps(value).encode(), "application/json", headers)


class _TLSHTTPServer(_HTTPServer):
    """_HTTPServer over TLS: every accepted socket is wrapped with the owner's `tls_context`
    (server side); the handshake is made in the connection's own thread, so a client that
    never completes it holds nobody else up. The owner counts handshakes (`_handshake_done`)."""

    def get_request(self):
        request, address = super().get_request()
        return self.owner.tls_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False), address

    def finish_request(self, request, client_address):
        request.settimeout(10)
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError):
            self.owner._handshake_done(False)
            return  # no HTTP request can come on this connection
        self.owner._handshake_done(True)
        super().finish_request(request, client_address)


class _Server:
    """Starts `handler` on 127.0.0.1:`port` (0: a free one) in a daemon thread; counts calls
    and connections. After `stop()`, `restart()` listens again on the same port."""

    _server_class = _HTTPServer

    def __init__(self, handler, port=0):
        self._lock = threading.Lock()
        self.stopping = threading.Event()  # set by stop(): releases every artificial wait
        self.reset()
        self._handler = handler
        self._listen(port)
        self.url = f"http://127.0.0.1:{self.port}"

    def _listen(self, port):
        self._httpd = self._server_class(self, self._handler, port)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=type(self).__name__, daemon=True)
        self._thread.start()

    def restart(self):
        """Listens again on the port of before `stop()`, counters and state kept: a server back
        from an outage, at the address its clients know."""
        self.stopping.clear()
        self._listen(self.port)

    def reset(self):
        with self._lock:
            self.calls = self.connections = self.in_flight = self.max_in_flight = 0

    def _connected(self):
        with self._lock:
            self.connections += 1

    def _begin(self):
        with self._lock:
            self.calls += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _end(self):
        with self._lock:
            self.in_flight -= 1

    def pause(self, seconds):
        """Waits `seconds` unless stop() comes first; returns True if stopped."""
        return self.stopping.wait(seconds)

    def stop(self):
        """Stops listening, cuts every open connection (keep-alive ones included), then
        releases the requests waiting in an artificial delay: their answers go nowhere."""
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._httpd.connections_lock:
            open_connections = list(self._httpd.open_connections)
        for connection in open_connections:  # also wakes handlers blocked on reads
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.stopping.set()
        self._thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# --------------------------------------------------------------------------- EchoBackend

class _EchoHandler(_Handler):
    def parse_request(self):
        # Recorded before http.server parses it: a target it would refuse or split still counts.
        self.owner._record_line(self.raw_requestline)
        return super().parse_request()

    def respond(self):
        backend = self.owner
        digest = hashlib.sha256()
        try:
            size = self.read_body(digest.update)
        except ValueError as error:
            self.close_connection = True
            return self.send_json(400, {"error": str(error)}, [("Connection", "close")])
        headers = {}
        for name, value in self.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        record = {"method": self.command, "path": self.path, "headers": headers,
                  "body_bytes": size, "body_sha256": digest.hexdigest()}
        backend._record(record)

        path, query = urlsplit(self.path).path, parse_qs(urlsplit(self.path).query)
        extra = [] if self.client_wants_close() else EchoBackend.RESPONSE_HEADERS
        extra = extra + [("X-Backend", "echo")]
        status_match = re.search(r"/status/(\d{3})$", path)
        try:
            if self.command in ("GET", "HEAD") and path.endswith("/download"):
                return self.download(int(query.get("bytes", ["0"])[0]), extra)
            if self.command == "GET" and path.endswith("/slow"):
                seconds = float(query.get("seconds", ["1"])[0])
                stopped = backend.pause(seconds)
                return self.send_json(200, {"slept": seconds, "stopped": stopped}, extra)
        except ValueError:
            return self.send_json(400, {"error": "bad query parameter"}, extra)
        if status_match and 200 <= int(status_match.group(1)) <= 599:
            status = int(status_match.group(1))
            return self.send_json(status, {"status": status}, extra)
        self.send_json(200, record, extra)

    def download(self, size, headers):
        if size < 0:
            raise ValueError(size)
        self.start(200, "application/octet-stream", size, headers)
        if self.command == "HEAD":
            return
        block = EchoBackend.BLOCK
        for _ in range(size // len(block)):
            self.wfile.write(block)
        self.wfile.write(memoryview(block)[: size % len(block)])


class EchoBackend(_Server):
    """The backend ("ESB") behind Gatehouse's resource relay: answers any method on any path.

    HTTP/1.1 (RFC 9110/9112) with keep-alive. Request bodies (Content-Length or chunked)
    are read in 64 KiB chunks and hashed on the fly, never held in memory.

        GET  …/download?bytes=N   N bytes of application/octet-stream with Content-Length;
                                  byte i is i % 256 (see pattern_sha256); streamed from one
                                  preallocated 1 MiB block, so 1 GiB costs no memory
        GET  …/slow?seconds=S     waits S seconds (stop() ends the wait), then 200
                                  {"slept": S, "stopped": bool}
        ANY  …/status/NNN         answers status NNN (200-599) with {"status": NNN}
        ANY  anything else        200 {"method", "path" (path + query as received),
                                  "headers" (every request header, names lower-cased,
                                  repeated ones joined with ", "), "body_bytes", "body_sha256"}

    Every response carries `Connection: keep-alive`, the hop-by-hop `Keep-Alive: timeout=5`
    (both left out when the client asked Connection: close) and `X-Backend: echo`, so tests
    can check Gatehouse strips hop-by-hop headers and keeps end-to-end ones.

    Attributes: `requests` (the last `history` request records, oldest first, each the
    dict above; the body itself is never kept), `last_request`, plus the counters of
    every server here (calls, connections, in_flight, max_in_flight, reset()).

    Request lines: every request line the backend read, raw, before any parsing (so one
    http.server would refuse is recorded too): `mark()` is a position, and
    `request_lines_since(mark)` the (method, target) pairs (bytes) read since it.
    """

    RESPONSE_HEADERS = [("Connection", "keep-alive"), ("Keep-Alive", "timeout=5")]
    BLOCK = bytes(range(256)) * (4 * 1024)  # 1 MiB: sixteen copies of a 64 KiB pattern

    def __init__(self, history=100):
        self._history = deque(maxlen=history)
        self._lines = []
        super().__init__(_EchoHandler)

    def _record(self, record):
        with self._lock:
            self._history.append(record)

    def _record_line(self, raw):
        line = raw.rstrip(b"\r\n")
        method, _, rest = line.partition(b" ")
        target = rest.rpartition(b" ")[0] if rest.endswith((b" HTTP/1.1", b" HTTP/1.0")) else rest
        with self._lock:
            self._lines.append((method, target))

    def mark(self):
        """A position in the request lines read so far."""
        with self._lock:
            return len(self._lines)

    def request_lines_since(self, mark):
        """(method, target) of every request line read since `mark`, raw bytes."""
        with self._lock:
            return list(self._lines[mark:])

    @property
    def requests(self):
        with self._lock:
            return list(self._history)

    @property
    def last_request(self):
        with self._lock:
            return self._history[-1] if self._history else None

    def reset(self):
        super().reset()
        if hasattr(self, "_history"):
            with self._lock:
                self._history.clear()

    @staticmethod
    def pattern_chunks(size):
        """The bytes of `…/download?bytes=size`, as a generator of chunks."""
        block = EchoBackend.BLOCK
        for _ in range(size // len(block)):
            yield block
        yield block[: size % len(block)]

    @staticmethod
    def pattern_sha256(size):
        """SHA-256 (hex) of the body `…/download?bytes=size` sends."""
        digest = hashlib.sha256()
        for chunk in EchoBackend.pattern_chunks(size):
            digest.update(chunk)
        return digest.hexdigest()


def self_signed_certificate(directory, name, host="127.0.0.1", san=None):
    """(certificate, key): PEM files `name`.pem and `name`.key in `directory`, a fresh
    self-signed RSA certificate for `host` (its CN) with the subjectAltName `san` (default: the
    IP address `host`), valid for a day, made by the openssl command line."""
    certificate, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName={san or 'IP:' + host}", "-keyout", str(key), "-out", str(certificate)],
                   check=True, capture_output=True, timeout=120)
    return certificate, key


class TLSEchoBackend(EchoBackend):
    """EchoBackend over TLS 1.2+ (`.url` is https://127.0.0.1:PORT), keep-alive as the plain one,
    serving the certificate `certificate` with its `key` (PEM files, e.g. self_signed_certificate).

    Besides EchoBackend's counters (`connections` counts TCP connections accepted, `calls`
    HTTP requests): `handshakes` (TLS handshakes completed) and `handshake_failures` (handshakes
    a client broke off, e.g. because it does not trust the certificate; no HTTP request can
    follow one). `wait_for_handshake_failures(count, timeout)` waits until at least `count`
    were counted since the last reset() and returns the number (it may be less at the deadline).
    """

    _server_class = _TLSHTTPServer

    def __init__(self, certificate, key, history=100):
        self._handshake_condition = threading.Condition()
        self.tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls_context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.tls_context.load_cert_chain(str(certificate), str(key))
        self.certificate = certificate
        super().__init__(history)
        self.url = f"https://127.0.0.1:{self.port}"

    def reset(self):
        super().reset()
        with self._handshake_condition:
            self.handshakes = self.handshake_failures = 0

    def _handshake_done(self, succeeded):
        with self._handshake_condition:
            if succeeded:
                self.handshakes += 1
            else:
                self.handshake_failures += 1
            self._handshake_condition.notify_all()

    def wait_for_handshake_failures(self, count, timeout):
        with self._handshake_condition:
            self._handshake_condition.wait_for(lambda: self.handshake_failures >= count, timeout)
            return self.handshake_failures


# --------------------------------------------------------------------------- PersonalInformationService

SCIF_NAMESPACE = "urn:voo:scif:usermanagement"
XML_PATH = "/UCP_SCIF_XML/UserManagement/GetPersonalInformation"
JSON_PATH = "/json/UserManagement/GetPersonalInformation"

FAULTS = {  # code: (HTTP status, message)
    "TOKEN_MISSING": (401, "access_token missing"),
    "TOKEN_EXPIRED": (401, "access_token expired"),
    "USER_NOT_FOUND": (404, "no business partner for this login"),
    "SERVICE_UNAVAILABLE": (503, "service unavailable"),
}


def token_sha256(token):
    return hashlib.sha256(token.encode()).hexdigest()


class _PersonalInformationHandler(_Handler):
    def respond(self):
        service = self.owner
        try:
            self.read_body()
        except ValueError:
            self.close_connection = True
        path = urlsplit(self.path).path
        kind = {XML_PATH: "xml", JSON_PATH: "json"}.get(path)
        if kind is None:
            return self.send_json(404, {"error": "not found"})
        if self.command != "GET":
            return self.send_json(405, {"error": "method not allowed"}, [("Allow", "GET")])

        match = re.fullmatch(r"Bearer +(\S+) *", self.headers.get("Authorization", ""), re.IGNORECASE)
        token = match and match.group(1)
        service._count_token(token)
        if service.down:
            return self.fault(kind, "SERVICE_UNAVAILABLE")
        if service.slow:
            service.pause(service.slow_seconds)
        if service.delay_seconds:
            service.pause(service.delay_seconds)
        if not token:
            return self.fault(kind, "TOKEN_MISSING")
        try:
            info = service.introspect(token)
        except (requests.RequestException, ValueError):
            return self.fault(kind, "SERVICE_UNAVAILABLE")
        if not info.get("active"):
            return self.fault(kind, "TOKEN_EXPIRED")
        login = info.get("username")
        if login not in service.users:
            return self.fault(kind, "USER_NOT_FOUND")
        bpid, status, *rest = service.users[login]
        email = rest[0] if rest else f"{login}@example.test"
        if kind == "json":
            return self.send_json(200, {"personalInformation": {
                "login": login, "bpId": bpid, "bpIdStatus": status, "email": email}})
        fields = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in
                         (("Login", login), ("BPId", bpid), ("BPIdStatus", status), ("Email", email)))
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f'<GetPersonalInformationResponse xmlns="{SCIF_NAMESPACE}">\n'
                f"  <PersonalInformation>{fields}</PersonalInformation>\n"
                "</GetPersonalInformationResponse>\n")
        self.send_body(200, body.encode(), "text/xml; charset=utf-8")

    def fault(self, kind, code):
        status, message = FAULTS[code]
        if kind == "json":
            return self.send_json(status, {"fault": {"code": code, "message": message}})
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Fault><Code>{code}</Code><Message>{message}</Message></Fault>\n")
        self.send_body(status, body.encode(), "text/xml; charset=utf-8")


class PersonalInformationService(_Server):
    """Double of the legacy myVOO "SCIF" service GetPersonalInformation.

        GET /UCP_SCIF_XML/UserManagement/GetPersonalInformation   XML answer
        GET /json/UserManagement/GetPersonalInformation           JSON twin
        Authorization: Bearer <access token>

    Like the real one it validates the token with the authorization server's RFC 7662
    introspection endpoint (POST token=…, client credentials by HTTP Basic, RFC 7662 §2.1),
    then maps the introspection's `username` to a business partner through `users`,
    e.g. {"alice": ("1000123", "active"), "bob": ("1000456", "blocked")}; an optional
    third element is the e-mail (default "<login>@example.test").

    200 XML (text/xml; charset=utf-8):
        <?xml version="1.0" encoding="UTF-8"?>
        <GetPersonalInformationResponse xmlns="urn:voo:scif:usermanagement">
          <PersonalInformation><Login>alice</Login><BPId>1000123</BPId><BPIdStatus>active</BPIdStatus><Email>alice@example.test</Email></PersonalInformation>
        </GetPersonalInformationResponse>
    200 JSON: {"personalInformation": {"login", "bpId", "bpIdStatus", "email"}}
    Faults (XML `<Fault><Code>…</Code><Message>…</Message></Fault>`, no namespace;
    JSON {"fault": {"code", "message"}}):
        401 TOKEN_MISSING        no Bearer token
        401 TOKEN_EXPIRED        introspection says inactive (expired, revoked, unknown, garbage)
        404 USER_NOT_FOUND       active token whose username is not in `users` (or has none)
        503 SERVICE_UNAVAILABLE  `down` is set, or introspection failed

    Knobs (plain attributes, change them any time): `down` (answer 503 at once),
    `delay_seconds` (wait before answering, so concurrent calls overlap), `slow` (wait
    `slow_seconds`, default 60, i.e. beyond any sane client timeout). Waits end at stop().

    Counters: `total_calls` (requests to either endpoint), `calls_for(token)` (requests
    that presented this token; only SHA-256 digests of tokens are kept), `introspections`,
    plus calls, connections, in_flight, max_in_flight, reset() of every server here.
    """

    def __init__(self, introspection_url, client_id, client_secret, users, introspection_timeout=10):
        self.introspection_url = introspection_url
        self.client_auth = (client_id, client_secret)
        self.introspection_timeout = introspection_timeout
        self.users = dict(users)
        self.down = False
        self.slow = False
        self.slow_seconds = 60.0
        self.delay_seconds = 0.0
        super().__init__(_PersonalInformationHandler)

    def reset(self):
        super().reset()
        with self._lock:
            self.total_calls = self.introspections = 0
            self._by_token = Counter()

    def _count_token(self, token):
        with self._lock:
            self.total_calls += 1
            if token:
                self._by_token[token_sha256(token)] += 1

    def calls_for(self, token):
        with self._lock:
            return self._by_token[token_sha256(token)]

    def introspect(self, token):
        with self._lock:
            self.introspections += 1
        response = requests.post(self.introspection_url, data={"token": token, "token_type_hint": "access_token"},
                                 auth=self.client_auth, timeout=self.introspection_timeout)
        if response.status_code != 200:
            raise ValueError(f"introspection answered {response.status_code}")
        return response.json()


# --------------------------------------------------------------------------- JWTIssuer

def _b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _JWTIssuerHandler(_Handler):
    def respond(self):
        issuer = self.owner
        self.read_body()
        path = urlsplit(self.path).path
        if self.command == "GET" and path == "/jwks.json":
            with issuer._lock:
                issuer.jwks_fetches += 1
            return self.send_json(200, issuer.jwks(), [("Cache-Control", "no-store")])
        if self.command == "GET" and path == "/.well-known/oauth-authorization-server":
            return self.send_json(200, {"issuer": issuer.url, "jwks_uri": issuer.jwks_uri})
        self.send_json(404, {"error": "not found"})


class JWTIssuer(_Server):
    """Double of an authorization server issuing RFC 9068 JWT access tokens.

        GET /jwks.json                              JWKS (RFC 7517 §5) of the published keys; counted
        GET /.well-known/oauth-authorization-server RFC 8414 metadata, issuer + jwks_uri only

    Tokens are JWS compact serializations (RFC 7515) with header
    {"alg", "typ": "at+jwt", "kid"} and the claims of RFC 9068 §2.2: iss, sub, aud, exp,
    iat, jti, client_id, scope (space-separated), plus `extra_claims` (e.g. {"bpid": …});
    an extra claim overrides a standard one, and None removes it (e.g. {"exp": None}).

    Negative-test helpers: mint_with_unknown_key (a valid signature by a key not in the
    JWKS, kid "unknown-…"), mint_unsigned (alg "none", or HS256 keyed with the published
    RSA public key in PEM: the classic algorithm-confusion forgery), typ="JWT" on mint.
    rotate_key() publishes a fresh signing key (kid changes), keeping the old one or not.
    """

    def __init__(self, key_size=2048):
        self._key_size = key_size
        self.key = self._new_key("key")
        self._published = [self.key]
        self._unknown_key = self._new_key("unknown")
        super().__init__(_JWTIssuerHandler)
        self.jwks_uri = f"{self.url}/jwks.json"

    def reset(self):
        super().reset()
        with self._lock:
            self.jwks_fetches = 0

    def _new_key(self, prefix):
        return jwk.JWK.generate(kty="RSA", size=self._key_size, kid=f"{prefix}-{secrets.token_hex(4)}")

    @property
    def kid(self):
        return self.key.key_id

    def jwks(self):
        return {"keys": [dict(k.export_public(as_dict=True), use="sig") for k in self._published]}

    def jwk_set(self):
        """The published keys as a jwcrypto JWKSet (what a verifier would fetch)."""
        return jwk.JWKSet.from_json(json.dumps(self.jwks()))

    def rotate_key(self, keep_old=True):
        """Signs with a new key from now on; the JWKS lists it (and the old one if keep_old)."""
        new = self._new_key("key")
        self._published = [new] + (self._published if keep_old else [])
        self.key = new
        return new.key_id

    def claims(self, subject, scope="read", expires_in=300, audience="gatehouse-api", issuer=None,
               extra_claims=None, client_id="com.example.app"):
        now = int(time.time())
        claims = {"iss": issuer or self.url, "sub": subject, "aud": audience, "exp": now + expires_in,
                  "iat": now, "jti": secrets.token_urlsafe(16), "client_id": client_id,
                  "scope": scope if isinstance(scope, str) else " ".join(scope)}
        for name, value in (extra_claims or {}).items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        return claims

    def _sign(self, key, algorithm, typ, claims):
        token = jwt.JWT(header={"alg": algorithm, "typ": typ, "kid": key.key_id}, claims=claims)
        token.make_signed_token(key)
        return token.serialize()

    def mint(self, subject, scope="read", expires_in=300, audience="gatehouse-api", issuer=None,
             extra_claims=None, algorithm="RS256", client_id="com.example.app", typ="at+jwt"):
        """A valid access token signed by the current key (RS256/384/512 or PS256/384/512)."""
        claims = self.claims(subject, scope, expires_in, audience, issuer, extra_claims, client_id)
        return self._sign(self.key, algorithm, typ, claims)

    def mint_with_unknown_key(self, subject, scope="read", expires_in=300, audience="gatehouse-api",
                              issuer=None, extra_claims=None, algorithm="RS256", client_id="com.example.app"):
        """Well-formed and signed, but by a key whose kid the JWKS does not list."""
        claims = self.claims(subject, scope, expires_in, audience, issuer, extra_claims, client_id)
        return self._sign(self._unknown_key, algorithm, "at+jwt", claims)

    def mint_unsigned(self, subject, scope="read", expires_in=300, audience="gatehouse-api", issuer=None,
                      extra_claims=None, algorithm="none", client_id="com.example.app", hmac_secret=None):
        """A forgery a verifier must reject. algorithm "none": unsecured JWS (RFC 7515 §A.5),
        empty signature. "HS256": HMAC-SHA256 keyed with `hmac_secret`, by default the
        published RSA public key in PEM form, with the real key's kid."""
        claims = self.claims(subject, scope, expires_in, audience, issuer, extra_claims, client_id)
        header = {"alg": algorithm, "typ": "at+jwt"}
        if algorithm != "none":
            header["kid"] = self.key.key_id
        signing_input = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode())
                                 for part in (header, claims))
        if algorithm == "none":
            return signing_input + "."
        if algorithm != "HS256":
            raise ValueError(f"mint_unsigned forges 'none' or 'HS256', not {algorithm!r}")
        secret = hmac_secret if hmac_secret is not None else self.key.export_to_pem()
        secret = secret.encode() if isinstance(secret, str) else secret
        signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{_b64url(signature)}"
