"""Fixtures for Gatehouse's end-to-end tests.

Everything here is real: the Gatehouse binary built by `swift build`, started as a
process with a YAML configuration, in front of django-oauth-toolkit (Tests/Upstream)
started as another process. The only doubles are the three broken upstreams that no
package offers: one whose port is closed, one that accepts and never answers, and
one that answers 200 with a body that is not JSON.

Readiness is read from each process's own output (its "ready" line), never slept for.
Gatehouse's log is followed as it is written (`gatehouse["lines"]`, a gatelog.LogFollower):
a test waits for a line, or asks which relay path served an answer (`served_by`).
"""

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "Tests/Support"))

from backends import EchoBackend, JWTIssuer, PersonalInformationService  # noqa: E402
from gatelog import LogFollower, served_by  # noqa: E402,F401
from nativeapp import APP_REDIRECT, PASSWORD, USERNAME, App, InAppBrowser, free_port, pump, query, wait_for_line  # noqa: E402,F401
from relaytokens import PASSWORDS, TokenSupply  # noqa: E402

#: eve's business partner id, as her identity service answers it: with a CR LF and what
#: would be a header of its own if Gatehouse wrote it as it is.
EVE_BPID = "1000999\r\nX-Injected: yes"


@dataclass
class Secrets:
    """Every secret, code and token seen in the run; the log test checks none was logged."""
    values: set = field(default_factory=set)

    def add(self, *values):
        self.values.update(v for v in values if v)


@pytest.fixture(scope="session")
def seen():
    return Secrets()


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e")


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
    seen.add(env["UPSTREAM_SECRET_LEGACY"], env["UPSTREAM_SECRET_MODERN"], env["UPSTREAM_SECRET_OIDC"])
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
    config_path = workdir / "upstream.json"
    config_path.write_text(json.dumps(config))
    log = open(workdir / "upstream.log", "w")
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "Tests/Upstream/serve.py"), "--config", str(config_path), "--port", "0", "--quiet"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        line = wait_for_line(process.stdout, r'"ready"', 60, "the upstream authorization server")
        url = json.loads(line)["url"]
        yield {"url": url, "env": env}
    finally:
        process.terminate()
        process.wait(10)
        log.close()


class SilentServer:
    """Accepts connections and never answers: an upstream slower than any timeout."""

    def __init__(self):
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port = self.socket.getsockname()[1]
        self.held = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            self.held.append(connection)


class GarbageServer:
    """Answers every request with 200 and a body that is not JSON."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = b"<html>this is not json</html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="session")
def relay_doubles(upstream):
    """The backend ("ESB"), the myVOO personal-information service (which checks tokens by
    introspection at the real upstream) and a JWT issuer."""
    backend = EchoBackend()
    personal = PersonalInformationService(
        introspection_url=upstream["url"] + "/o/introspect/", client_id="gatehouse-legacy",
        client_secret=upstream["env"]["UPSTREAM_SECRET_LEGACY"],
        users={USERNAME: ("1000123", "active"), "bob": ("1000456", "blocked"), "eve": (EVE_BPID, "active")})
    issuer = JWTIssuer()
    yield {"backend": backend, "personal": personal, "jwt": issuer}
    for server in (backend, personal, issuer):
        server.stop()


@pytest.fixture(scope="session")
def gatehouse(workdir, gatehouse_port, upstream, relay_doubles, seen):
    """The Gatehouse binary on SQLite, configured for every scenario of the suite."""
    binary = Path(os.environ.get("GATEHOUSE_BIN", ROOT / ".build/debug/gatehouse"))
    if not binary.exists():
        raise RuntimeError(f"{binary} does not exist: build it first (swift build)")
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
clients:{client("com.example.app", "legacy")}{client("com.example.relay", "legacy", "relay", (APP_REDIRECT,))}{client("com.example.modern", "modern")}{client("com.example.down", "down")}{client("com.example.slow", "slow")}{client("com.example.garbage", "garbage")}{client("com.example.oidc", "oidc", scopes="[openid, email, read]")}{client("com.example.sealed", "legacy", exposure="sealed")}
{routes(relay_doubles["backend"].url, closed_port)}
"""
    keys = workdir / "session-keys"
    subprocess.run([str(binary), "keys", "generate", "--file", str(keys)], check=True, capture_output=True, timeout=30)
    config += f"""
sessions:
  encryption_keys_file: {keys}
  access_token_lifetime: 5m
  refresh_grace: 30s
"""
    config_path = workdir / "gatehouse.yaml"
    config_path.write_text(config)
    log_path = workdir / "gatehouse.log"
    log = open(log_path, "w")
    process = subprocess.Popen([str(binary), "serve", "--config", str(config_path), "--log-level", "debug"],
                               stdout=log, stderr=subprocess.PIPE, text=True, errors="replace", env=upstream["env"])
    try:
        ready = wait_for_line(process.stderr, r"gatehouse is ready", 30, "Gatehouse")
        log.write(ready)
        log.flush()
        lines = LogFollower()
        lines.feed(ready)
        pump(process.stderr, log, lines.feed)
        yield {"url": base, "port": gatehouse_port, "log": log_path, "lines": lines, "process": process,
               "config": config_path, "binary": binary, "database": workdir / "gatehouse.sqlite"}
    finally:
        process.terminate()
        process.wait(10)
        log.close()


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


def routes(backend, closed_port):
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
    ])
