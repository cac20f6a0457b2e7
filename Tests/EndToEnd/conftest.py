"""Fixtures for Gatehouse's end-to-end tests.

Everything here is real: the Gatehouse binary built by `swift build`, started as a
process with a YAML configuration (sandbox/gatehouse.py), in front of django-oauth-toolkit
(sandbox/dot) started as another process. The only doubles are the three broken upstreams that no
package offers: one whose port is closed, one that accepts and never answers, and
one that answers 200 with a body that is not JSON.

Readiness is read from each process's own output (its "ready" line), never slept for.
Gatehouse's log is followed as it is written (`gatehouse["lines"]`, a gatelog.LogFollower):
a test waits for a line, or asks which relay path served an answer (`served_by`).

Every secret of the run is recorded (`seen`, a Secrets): what the tests see, and through the
secrets record (GATEHOUSE_SECRETS_RECORD) what they do not: what each upstream received and
issued, what the demo's app saw. test_zz searches every log and database of the run for them.
"""

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
import socket
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "Tests/Support"))
sys.path.insert(0, str(ROOT))  # the sandbox package

from sandbox.backends import EchoBackend, JWTIssuer, PersonalInformationService, TLSEchoBackend, self_signed_certificate  # noqa: E402
from sandbox.gatelog import LogFollower, served_by  # noqa: E402,F401
from sandbox.nativeapp import APP_REDIRECT, PASSWORD, USERNAME, App, InAppBrowser, free_port, pump, query, wait_for_line  # noqa: E402,F401
from relaytokens import PASSWORDS, TokenSupply  # noqa: E402
from sandbox.stubserver import StubHandler, StubServer  # noqa: E402
from processes import run_gatehouse, session_keys  # noqa: E402
from sandbox import dot  # noqa: E402

#: eve's business partner id, as her identity service answers it: with a CR LF and what
#: would be a header of its own if Gatehouse wrote it as it is.
EVE_BPID = "1000999\r\nX-Injected: yes"


#: The environment variable naming the suite's secrets record: a JSON-lines file that every
#: process the suite starts may append {"kind": …, "value": …} to. sandbox/dot/serve.py writes
#: there every code, verifier, token and client secret it receives or issues (what Gatehouse
#: exchanged with it, which the tests never see), the demo's walkthrough what its app saw.
SECRETS_RECORD = "GATEHOUSE_SECRETS_RECORD"

UNKNOWN_KIND = "code or token"

#: Every real secret of the run is 24 characters or more (codes, tokens, verifiers, states, client
#: secrets, keys); shorter values in the secrets record are made-up inputs some tests show an
#: upstream on purpose ("any-token"), words that could appear in a log for other reasons.
RECORDED_MIN_LENGTH = 16
_WINDOW = 8  # bytes of the index windows (Secrets.find); forms shorter than 2 windows are searched directly
_PREFIXES = ("gha_", "ghr_", "ghd_", "ghc_")  # every prefix of a Gatehouse token (SessionServices)


def _b64_cores(raw):
    """What base64 and base64url encodings that contain `raw` (at any of the three byte
    alignments) must contain: the encoding of `raw` shifted by 0, 1 or 2 bytes, without the
    characters that depend on the neighbouring bytes."""
    cores = []
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + raw)
        head = (shift * 8 + 5) // 6  # characters that carry bits of the bytes in front
        end = (shift + len(raw)) * 8 // 6  # characters made of these bytes only (not of what follows)
        core = encoded[head:end]
        if len(core) >= 16:
            cores.append((f"base64 (shift {shift})", core))
            cores.append((f"base64url (shift {shift})", core.replace(b"+", b"-").replace(b"/", b"_")))
    return cores


def _decoded(value):
    """The bytes a base64url secret stands for (a Gatehouse token without its prefix, a key
    of the key ring), when it is one of at least 16 bytes."""
    text = value
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix)
    if not re.fullmatch(r"[A-Za-z0-9_-]{22,}", text):
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) >= 16 else None


def secret_forms(value):
    """(form, bytes) pairs a secret could be found as: as it is, and for secrets of 16
    characters or more also its hex (both cases), its base64 / base64url at every alignment,
    and the raw bytes a base64url secret stands for (and their hex)."""
    raw = value.encode()
    forms = [("as is", raw)]
    if len(raw) >= 16:
        forms += [("hex", raw.hex().encode()), ("HEX", raw.hex().upper().encode())]
        forms += _b64_cores(raw)
        decoded = _decoded(value)
        if decoded is not None:
            forms += [("decoded bytes", decoded), ("decoded bytes, hex", decoded.hex().encode()),
                      ("decoded bytes, HEX", decoded.hex().upper().encode())]
    return forms


class Secrets:
    """Every secret, code and token the run saw or made, each with its kind ("upstream
    refresh token", "session key"…), and the search for them in logs and databases.

    `values` is the set of the secrets themselves; `add(*values, kind=…)` records more;
    `harvest()` adds what the secrets record and the key rings hold; `find(data)` says which
    kinds of secret, in which form, occur in some bytes. Failure messages name kinds and
    forms, never a secret."""

    def __init__(self, record=None):
        self.kinds = {}
        self.lock = threading.Lock()
        self.record = record  # the secrets record (see SECRETS_RECORD)
        self.key_rings = []
        self._index = None  # (windows, short forms), rebuilt when secrets were added

    @property
    def values(self):
        with self.lock:
            return set(self.kinds)

    def add(self, *values, kind=UNKNOWN_KIND):
        with self.lock:
            for value in values:
                if value and isinstance(value, str) and self.kinds.get(value, UNKNOWN_KIND) == UNKNOWN_KIND:
                    self.kinds[value] = kind  # the first kind named sticks; a named kind replaces the generic one
                    self._index = None

    def add_key_ring(self, path):
        """The keys of a session key ring file (`gatehouse keys generate`: lines "ID KEY")."""
        path = Path(path)
        if path not in self.key_rings:
            self.key_rings.append(path)
        self._read_key_ring(path)

    def _read_key_ring(self, path):
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) == 2 and not line.startswith("#"):
                self.add(fields[1], kind="session key")

    def harvest(self):
        """Adds what the run recorded but no test saw: the secrets record (every code, verifier,
        token and secret the upstreams received or issued) and the keys of every key ring (a
        rotation may have added some). Returns the number of secrets known."""
        if self.record is not None and self.record.exists():
            for line in self.record.read_text().splitlines(keepends=True):
                if not line.endswith("\n"):
                    continue  # a line still being written
                entry = json.loads(line)
                if len(entry["value"]) >= RECORDED_MIN_LENGTH:
                    self.add(entry["value"], kind=entry["kind"])
        for path in self.key_rings:
            if path.exists():
                self._read_key_ring(path)
        return len(self.kinds)

    def redact(self, text):
        """`text` with every known secret replaced by "[secret: kind]" (for output that may show one)."""
        self.harvest()
        with self.lock:
            values = sorted(self.kinds.items(), key=lambda item: -len(item[0]))
        for value, kind in values:
            if value in text:
                text = text.replace(value, f"[secret: {kind}]")
        return text

    def recorded(self, kind):
        """The values the secrets record holds under `kind`, in order (e.g. every refresh token
        POSTed to an upstream: "refresh token presented to the upstream")."""
        if self.record is None or not self.record.exists():
            return []
        entries = (json.loads(line) for line in self.record.read_text().splitlines(keepends=True) if line.endswith("\n"))
        return [entry["value"] for entry in entries if entry["kind"] == kind]

    def _build_index(self):
        with self.lock:
            if self._index is not None:
                return self._index
            windows, short = {}, []
            for value, kind in self.kinds.items():
                for form, data in secret_forms(value):
                    if len(data) < 2 * _WINDOW - 1:
                        short.append((data, kind, form))
                        continue
                    for offset in range(_WINDOW):  # where the first window the scan looks at can start
                        windows.setdefault(data[offset:offset + _WINDOW], []).append((offset, data, kind, form))
            self._index = (windows, short)
            return self._index

    def find(self, data):
        """The (kind, form) of every secret found in `data` (bytes), each once, sorted.
        A form of 15 bytes or more has a whole window that starts at a multiple of _WINDOW,
        at one of its first _WINDOW offsets (which the index holds), so the data is looked
        at every _WINDOW bytes only."""
        if isinstance(data, str):
            data = data.encode()
        windows, short = self._build_index()
        found = set()
        for position in range(0, len(data) - _WINDOW + 1, _WINDOW):
            for offset, form_bytes, kind, form in windows.get(data[position:position + _WINDOW], ()):
                start = position - offset
                if start >= 0 and data[start:start + len(form_bytes)] == form_bytes:
                    found.add((kind, form))
        # A short secret (a 6-digit code) is looked for as a whole token: not inside a longer run
        # of letters and digits, where a long log (PostgreSQL's, every statement with its
        # parameters) holds any 6 digits by chance; a leaked code stands on its own (quoted, a
        # parameter, a JSON value, a form field).
        for form_bytes, kind, form in short:
            if form_bytes in data and re.search(rb"(?<![A-Za-z0-9])" + re.escape(form_bytes) + rb"(?![A-Za-z0-9])", data):
                found.add((kind, form))
        return sorted(found)

    def find_in_sqlite(self, path):
        """Leaks in an SQLite database: every column of every row of every table, text and
        BLOBs read as bytes (a `.dump` would show BLOBs as X'…'), then the raw bytes of the
        file and its journals, where deleted rows linger. Returns ["where: kind (form)"]."""
        path = Path(path)
        leaks = []
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            assert tables, f"{path.name} holds no table"
            for table in tables:
                columns = [row[1] for row in connection.execute(f'PRAGMA table_info("{table}")')]
                for column in columns:
                    for (cell,) in connection.execute(f'SELECT "{column}" FROM "{table}"'):
                        if isinstance(cell, str):
                            cell = cell.encode()
                        if isinstance(cell, bytes):
                            leaks += [f"{path.name} {table}.{column}: {kind} ({form})" for kind, form in self.find(cell)]
        finally:
            connection.close()
        for file in [path, *(path.parent / (path.name + suffix) for suffix in ("-wal", "-journal"))]:
            if file.exists():
                leaks += [f"{file.name} (file bytes, deleted rows included): {kind} ({form})"
                          for kind, form in self.find(file.read_bytes())]
        return sorted(set(leaks))


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def seen(workdir):
    """The run's secrets (Secrets). Every process started from here on records what it
    exchanged into workdir/secrets-record.jsonl (SECRETS_RECORD; never a *.log: the log
    checks must not find their own record)."""
    record = workdir / "secrets-record.jsonl"
    record.touch(mode=0o600)
    previous = os.environ.get(SECRETS_RECORD)
    os.environ[SECRETS_RECORD] = str(record)
    yield Secrets(record)
    if previous is None:
        os.environ.pop(SECRETS_RECORD, None)
    else:
        os.environ[SECRETS_RECORD] = previous


@pytest.fixture(scope="session")
def gatehouse_port():
    return free_port()


@pytest.fixture(scope="session")
def upstream(workdir, gatehouse_port, seen):
    """django-oauth-toolkit with a legacy client (no PKCE, refresh rotation, grace 0)
    and a modern one (PKCE required)."""
    callback = f"http://127.0.0.1:{gatehouse_port}/oauth/callback"
    env = dict(os.environ, UPSTREAM_SECRET_LEGACY=secrets.token_urlsafe(24), UPSTREAM_SECRET_MODERN=secrets.token_urlsafe(24),
               UPSTREAM_SECRET_OIDC=secrets.token_urlsafe(24))
    seen.add(env["UPSTREAM_SECRET_LEGACY"], env["UPSTREAM_SECRET_MODERN"], env["UPSTREAM_SECRET_OIDC"],
             kind="upstream client secret")
    config = {
        "users": [{"username": USERNAME, "password": PASSWORD, "email": "alice@example.test"},
                  {"username": "bob", "password": PASSWORDS["bob"], "email": "bob@example.test"},
                  {"username": "eve", "password": PASSWORDS["eve"], "email": "eve@example.test"}],
        "applications": [
            {"client_id": "gatehouse-legacy", "client_secret_env": "UPSTREAM_SECRET_LEGACY",
             "redirect_uris": [callback, APP_REDIRECT], "pkce_required": False},
            {"client_id": "gatehouse-modern", "client_secret_env": "UPSTREAM_SECRET_MODERN",
             "redirect_uris": [callback], "pkce_required": True},
            {"client_id": "gatehouse-oidc", "client_secret_env": "UPSTREAM_SECRET_OIDC",
             "redirect_uris": [callback], "pkce_required": False, "algorithm": "RS256"},
        ],
        "rotate_refresh_token": True,
        "refresh_token_grace_period_seconds": 0,
        "allowed_redirect_uri_schemes": ["http", "https", "com.example.app"],
    }
    with dot.run(workdir, "upstream", config, env=env) as running:
        yield {"url": running.url, "env": env}


class LoopbackAcceptor:
    """A socket listening on 127.0.0.1 on a free port (`socket`, `port`; backlog 64) whose accept
    loop, in a daemon thread, hands every connection to `accepted(connection)`. A subclass sets
    its own state before calling `__init__`. Closing `socket` ends the loop."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.accepted(connection)

    def accepted(self, connection):
        raise NotImplementedError


class SilentServer(LoopbackAcceptor):
    """Accepts connections and never answers: an upstream slower than any timeout."""

    def __init__(self):
        self.held = []
        super().__init__()

    def accepted(self, connection):
        self.held.append(connection)

    def stop(self):
        self.socket.close()
        for connection in self.held:
            connection.close()


class GarbageServer(StubServer):
    """Answers every request with 200 and a body that is not JSON."""

    class Handler(StubHandler):
        def do_POST(self):
            self.read_body()
            self.reply(200, b"<html>this is not json</html>", "text/html")


class DroppingBackend(LoopbackAcceptor):
    """A backend that answers the first request of each connection (200, keep-alive, a JSON
    record of what it received, as EchoBackend's) and, on any later request of the same
    connection, reads it whole, records it and closes the connection without a word: a pooled
    keep-alive connection the backend closed just as the relay reused it. Every request it read
    is recorded, so a request relayed twice is seen twice (`deliveries(target)`)."""

    def __init__(self):
        self.condition = threading.Condition()
        self.received = []  # {"method", "target", "body_bytes", "body_sha256", "nth", "answered"}
        self.connections = 0
        self.open = set()
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def accepted(self, connection):
        with self.condition:
            self.connections += 1
            self.open.add(connection)
        threading.Thread(target=self.serve, args=(connection,), daemon=True).start()

    @staticmethod
    def _read_request(connection, buffer):
        """(method, target, body, rest of the buffer), or None at the end of the connection."""
        while b"\r\n\r\n" not in buffer:
            data = connection.recv(65536)
            if not data:
                return None
            buffer += data
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        method, target = lines[0].split(b" ")[:2]
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(buffer) < length:
            data = connection.recv(65536)
            if not data:
                return None
            buffer += data
        return method.decode(), target.decode("latin-1"), buffer[:length], buffer[length:]

    def serve(self, connection):
        connection.settimeout(60)
        buffer, nth = b"", 0
        try:
            while True:
                got = self._read_request(connection, buffer)
                if got is None:
                    return
                method, target, body, buffer = got
                nth += 1
                record = {"method": method, "target": target, "body_bytes": len(body),
                          "body_sha256": hashlib.sha256(body).hexdigest(), "nth": nth, "answered": nth == 1}
                with self.condition:
                    self.received.append(record)
                    self.condition.notify_all()
                if nth > 1:
                    return  # closed without an answer
                answer = json.dumps(record).encode()
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                                   b"Content-Length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer)
        except OSError:
            return
        finally:
            with self.condition:
                self.open.discard(connection)
            connection.close()

    def deliveries(self, target):
        """The records of the requests read for exactly `target`, in order."""
        with self.condition:
            return [record for record in self.received if record["target"] == target]

    def stop(self):
        self.socket.close()
        with self.condition:
            connections = list(self.open)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture(scope="session")
def relay_doubles(upstream, workdir):
    """The backend ("ESB"), the myVOO personal-information service (which checks tokens by
    introspection at the real upstream) and a JWT issuer; the same echo backend over TLS
    ("tls_backend", with a self-signed certificate for 127.0.0.1: "tls_certificate"), another
    self-signed certificate that backend does not have ("untrusted_certificate"), and a backend
    that drops every reused keep-alive connection ("dropping", DroppingBackend)."""
    backend = EchoBackend()
    personal = PersonalInformationService(
        introspection_url=upstream["url"] + "/o/introspect/", client_id="gatehouse-legacy",
        client_secret=upstream["env"]["UPSTREAM_SECRET_LEGACY"],
        users={USERNAME: ("1000123", "active"), "bob": ("1000456", "blocked"), "eve": (EVE_BPID, "active")})
    issuer = JWTIssuer()
    certificate, key = self_signed_certificate(workdir, "tls-backend")
    untrusted, _ = self_signed_certificate(workdir, "tls-untrusted")
    tls_backend = TLSEchoBackend(certificate, key)
    # A backend whose certificate names a DNS name only (no IP address): reached as `localhost`,
    # a name it does not carry, its handshake must fail.
    named_certificate, named_key = self_signed_certificate(workdir, "tls-named", host="backend.invalid", san="DNS:backend.invalid")
    tls_named_backend = TLSEchoBackend(named_certificate, named_key)
    dropping = DroppingBackend()
    yield {"backend": backend, "personal": personal, "jwt": issuer, "tls_backend": tls_backend,
           "tls_certificate": certificate, "untrusted_certificate": untrusted, "dropping": dropping,
           "tls_named_backend": tls_named_backend, "tls_named_certificate": named_certificate}
    for server in (backend, personal, issuer, tls_backend, tls_named_backend, dropping):
        server.stop()


@pytest.fixture(scope="session")
def gatehouse(workdir, gatehouse_port, upstream, relay_doubles, seen):
    """The Gatehouse binary on SQLite, configured for every scenario of the suite."""
    silent, garbage, closed_port = SilentServer(), GarbageServer(), free_port()
    base = f"http://127.0.0.1:{gatehouse_port}"
    up = upstream["url"]

    def oauth2(name, token_endpoint, client_id="gatehouse-legacy", secret_env="UPSTREAM_SECRET_LEGACY",
               auth="client_secret_basic", pkce=False, timeout="3s", identity=""):
        return f"""
  - name: {name}
    kind: oauth2
    authorization_endpoint: {up}/o/authorize/
    token_endpoint: {token_endpoint}
    revocation_endpoint: {up}/o/revoke_token/
    client_id: {client_id}
    client_secret_env: {secret_env}
    client_auth: {auth}
    scopes: [read, write]
    pkce: {str(pkce).lower()}
    timeout: {timeout}{identity}"""

    def client(client_id, upstream_name, wiring="callback", redirects=(APP_REDIRECT, "http://127.0.0.1/callback"),
               scopes="[read, write]", exposure="passthrough"):
        uris = ", ".join(f'"{r}"' for r in redirects)
        return f"""
  - client_id: {client_id}
    upstream: {upstream_name}
    wiring: {wiring}
    token_exposure: {exposure}
    scopes: {scopes}
    redirect_uris: [{uris}]"""

    config = f"""
server:
  public_base_url: {base}
  host: 127.0.0.1
  port: {gatehouse_port}
store:
  sqlite_path: {workdir}/gatehouse.sqlite
upstreams:{oauth2("legacy", up + "/o/token/", identity=PERSONAL_XML.format(relay_doubles["personal"].url))}{oauth2("modern", up + "/o/token/", "gatehouse-modern", "UPSTREAM_SECRET_MODERN", "client_secret_post", True)}{oauth2("down", f"http://127.0.0.1:{closed_port}/token")}{oauth2("slow", f"http://127.0.0.1:{silent.port}/token", timeout="1s")}{oauth2("garbage", f"http://127.0.0.1:{garbage.port}/token")}{oauth2("legacy-json", up + "/o/token/", identity=PERSONAL_JSON.format(relay_doubles["personal"].url))}{oauth2("legacy-introspection", up + "/o/token/", identity=INTROSPECTION.format(up))}{oauth2("oidc", up + "/o/token/", "gatehouse-oidc", "UPSTREAM_SECRET_OIDC", identity=USERINFO.format(up))}{oauth2("jwt", relay_doubles["jwt"].url + "/token", identity=JWT.format(relay_doubles["jwt"].url))}{oauth2("identity-down", up + "/o/token/", identity=PERSONAL_JSON.format(f"http://127.0.0.1:{closed_port}"))}
clients:{client("com.example.app", "legacy")}{client("com.example.relay", "legacy", "relay", (APP_REDIRECT,))}{client("com.example.modern", "modern")}{client("com.example.down", "down")}{client("com.example.slow", "slow")}{client("com.example.garbage", "garbage")}{client("com.example.oidc", "oidc", scopes="[openid, email, read]")}{client("com.example.sealed", "legacy", exposure="sealed")}{client("com.example.app2", "legacy")}{client("com.example.sealed2", "legacy", exposure="sealed")}
{routes(relay_doubles["backend"].url, closed_port, relay_doubles)}
"""
    keys = session_keys(workdir, "session-keys", seen)
    config += f"""
sessions:
  encryption_keys_file: {keys}
  access_token_lifetime: 5m
  refresh_grace: 30s
"""
    with run_gatehouse(workdir, "gatehouse", config, upstream["env"]) as running:
        yield {**running, "database": workdir / "gatehouse.sqlite"}


@pytest.fixture(scope="session")
def tokens(gatehouse, seen):
    """Fresh and warm access tokens (relaytokens.TokenSupply)."""
    return TokenSupply(gatehouse, seen)


@pytest.fixture(params=["general", "fast"])
def relay_path(request):
    """The relay path a test's relayed GET is meant to take (the test asserts it did)."""
    return request.param


@pytest.fixture
def relay_token(relay_path, tokens):
    """`relay_token(route, client_id=…, username=…, scope=…)`: for "general" a fresh token
    (its first relayed request is a cache miss), for "fast" a warm one (identity cached).
    Only the first relayed request of a fresh token is sure to take the general path."""
    def make(route="/api/contracts", **who):
        return tokens.fresh(**who) if relay_path == "general" else tokens.warm(route, **who)
    return make


PERSONAL_XML = """
    identity:
      kind: personal_information
      url: {0}/UCP_SCIF_XML/UserManagement/GetPersonalInformation
      format: xml
      subject: /GetPersonalInformationResponse/PersonalInformation/Login
      bpid: /GetPersonalInformationResponse/PersonalInformation/BPId
      attributes:
        bpid_status: /GetPersonalInformationResponse/PersonalInformation/BPIdStatus
      cache_ttl: 5m
      negative_ttl: 30s
      timeout: 5s"""

PERSONAL_JSON = """
    identity:
      kind: personal_information
      url: {0}/json/UserManagement/GetPersonalInformation
      format: json
      subject: /personalInformation/login
      bpid: /personalInformation/bpId
      attributes:
        bpid_status: /personalInformation/bpIdStatus
      timeout: 2s"""

INTROSPECTION = """
    identity:
      kind: introspection
      url: {0}/o/introspect/"""

USERINFO = """
    identity:
      kind: userinfo
      url: {0}/o/userinfo/
      attributes:
        email: /email"""

JWT = """
    identity:
      kind: jwt
      jwks_url: {0}/jwks.json
      issuer: {0}
      audience: gatehouse-api
      algorithms: [RS256]
      bpid: /bpid"""


def routes(backend, closed_port, doubles=None):
    def route(prefix, target, upstream, methods="[GET, HEAD, POST, PUT]", extra=""):
        return f"""
  - prefix: {prefix}
    backend: {target}
    methods: {methods}
    upstream: {upstream}
    identity_headers:
      X-BPId: bpid
      X-Subject: subject{extra}"""

    return "routes:" + "".join([
        route("/api/contracts", backend + "/contracts", "legacy", extra="""
      X-BPId-Status: bpid_status
    require:
      attributes:
        bpid_status: active
    max_body_bytes: 4294967296
    sign_in_client: com.example.app"""),
        route("/api/json", backend + "/json", "legacy-json"),
        route("/api/introspected", backend + "/introspected", "legacy-introspection", extra="""
    require:
      scopes: [read]"""),
        route("/api/admin", backend + "/admin", "legacy-introspection", extra="""
    require:
      scopes: [admin]"""),
        route("/api/userinfo", backend + "/userinfo", "oidc", extra="""
      X-Email: email"""),
        route("/api/jwt", backend + "/jwt", "jwt", extra="""
    require:
      scopes: [read]
    authorization: assertion"""),
        route("/api/passthrough", backend + "/passthrough", "legacy-json", extra="""
    authorization: passthrough"""),
        route("/api/slow", backend + "/slow", "legacy-json", extra="""
    timeout: 1s"""),
        route("/api/down", f"http://127.0.0.1:{closed_port}/down", "legacy-json"),
        route("/api/identity-down", backend + "/x", "identity-down"),
        route("/api/small", backend + "/small", "legacy-json", extra="""
    max_body_bytes: 1024"""),
        route("/api/sealed", backend + "/sealed", "legacy", extra="""
    authorization: passthrough"""),
        # Every method the OpenAPI description documents for /api/{rest}, for schemathesis.
        route("/api/schema", backend + "/schema", "legacy", methods="[GET, HEAD, POST, PUT, PATCH, DELETE]"),
    ] + ([] if doubles is None else [
        # Issue 12 (test_relay_fast_bodies_tls): an https backend trusted through backend_ca_file,
        # the same backend checked against a certificate it does not have or by a name its
        # certificate does not carry, and a backend that drops reused keep-alive connections.
        # Prefixes no earlier route owns.
        route("/api/tls", doubles["tls_backend"].url + "/tls", "legacy-json", methods="[GET, HEAD, POST, PUT, PATCH, DELETE]",
              extra=f"""
    backend_ca_file: {doubles["tls_certificate"]}"""),
        route("/api/tls-untrusted", doubles["tls_backend"].url + "/tls-untrusted", "legacy-json", extra=f"""
    backend_ca_file: {doubles["untrusted_certificate"]}"""),
        # A trusted certificate reached by a name it does not carry (it names backend.invalid only).
        route("/api/tls-wrong-name", f"https://localhost:{doubles['tls_named_backend'].port}/tls-wrong-name", "legacy-json", extra=f"""
    backend_ca_file: {doubles["tls_named_certificate"]}"""),
        route("/api/dropping", doubles["dropping"].url + "/dropping", "legacy-json", methods="[GET, HEAD, POST, PUT, PATCH, DELETE]",
              extra="""
    timeout: 5s"""),
    ]))
