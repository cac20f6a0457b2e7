"""Forward auth (docs/relay.md, "Behind your ingress"): Gatehouse deciding for an ingress that keeps
the data path, through the REAL recipes of deploy/forward-auth/ run by a real nginx (auth_request)
and a real Caddy (forward_auth), and, for the engines not installable here (Envoy, Traefik), the
exact requests their sources say they send, replayed against the endpoint.

One Gatehouse serves both: its routes are ordinary relay routes (whose backend is the recording
backend, at the same paths), so every behaviour is checked three ways, "relay" (the app calls
Gatehouse), "nginx" and "caddy" (the app calls the ingress, which asks /forward-auth), and must be
the same: status, problem type / title / status, WWW-Authenticate, Allow, Retry-After, and what
the backend received. The recipes are used as they are, only their addresses rewritten
(`render_nginx`, `render_caddy`: each replacement must match exactly once, so a recipe that
changes shape fails here, never silently tests something else).

The identity service is a double answering RFC 7662 introspection for the tokens the test issues
(each with its own subject, so the per-subject rate limit of one test never touches another's),
and can revoke them. The backend double records every request as it came on the wire (target and
raw header list). Requests are written on raw sockets, so no client library normalises a path or
a header name. Nothing sleeps to synchronise: readiness and revocation are polled with deadlines.
"""

import base64
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, unquote

import pytest
import requests
import yaml
from jwcrypto import jwk, jwt

from sandbox.backends import _Handler, _Server
from conftest import LoopbackAcceptor
from sandbox.nativeapp import APP_REDIRECT, free_port
from rawhttp import RawClient, request as raw_request
from processes import run_gatehouse, session_keys
from sandbox.gatehouse import server_and_store

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "deploy/forward-auth"
VENV_BIN = ROOT / ".venv/bin"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
CADDY = shutil.which("caddy") or "/usr/bin/caddy"

#: The identity headers of deploy/gatehouse.example.yaml, which every recipe names.
IDENTITY_HEADERS = {"X-BPId": "bpid", "X-Subject": "subject"}
BPID = "1000123"
MAX_AGE = 1  # forward_auth.max_age (seconds)
SHORT_TTL = 1  # identity cache_ttl of the `idp-short` upstream (the revocation route)
BURST = 20  # rate_limits.relay_per_subject burst (refill 0.01/s: never within a test)
ENGINES = ("relay", "nginx", "caddy")
SECRET_ENV = "FORWARD_AUTH_IDP_SECRET"


# --------------------------------------------------------------------------- doubles

class _IntrospectionHandler(_Handler):
    def respond(self):
        body = bytearray()
        self.read_body(body.extend)
        token = parse_qs(body.decode(errors="replace")).get("token", [""])[0]
        double = self.owner
        with double._lock:
            double.asked[token] = double.asked.get(token, 0) + 1
            claims = double.tokens.get(token)
        self.send_json(200, dict(claims, active=True) if claims else {"active": False})


class IdentityDouble(_Server):
    """RFC 7662 introspection for the tokens `issue()` made; `revoke(token)` makes one inactive."""

    def __init__(self, seen=None):
        self.tokens = {}
        self.asked = {}
        self.seen = seen
        super().__init__(_IntrospectionHandler)

    def issue(self, scope="read", bpid=BPID):
        token = "fa_" + secrets.token_urlsafe(24)
        claims = {"sub": "user-" + uuid.uuid4().hex[:12], "scope": scope, "client_id": "com.example.fa",
                  "exp": int(time.time()) + 3600, "token_type": "Bearer"}
        if bpid is not None:
            claims["bpid"] = bpid
        with self._lock:
            self.tokens[token] = claims
        if self.seen is not None:
            self.seen.add(token, kind="forward-auth test access token")
        return token, claims

    def revoke(self, token):
        with self._lock:
            self.tokens.pop(token, None)


class RecordingBackend(LoopbackAcceptor):
    """A backend on a raw socket: every request is recorded as it came (method, target bytes as a
    str, the raw header list in order) before its 200 answer. `mark()` / `since(mark)`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.records = []
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def accepted(self, connection):
        threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection):
        connection.settimeout(30)
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = connection.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target = lines[0].split(" ")[:2]
                headers = [(name, value.strip()) for name, _, value in (line.partition(":") for line in lines[1:])]
                fields = {name.lower(): value for name, value in headers}
                if "chunked" in fields.get("transfer-encoding", "").lower():
                    while b"\r\n0\r\n\r\n" not in b"\r\n" + buffer:
                        data = connection.recv(65536)
                        if not data:
                            return
                        buffer += data
                    buffer = (b"\r\n" + buffer).split(b"\r\n0\r\n\r\n", 1)[1]
                else:
                    length = int(fields.get("content-length", "0") or 0)
                    while len(buffer) < length:
                        data = connection.recv(65536)
                        if not data:
                            return
                        buffer += data
                    buffer = buffer[length:]
                with self.lock:
                    self.records.append({"method": method, "target": target, "headers": headers})
                    number = len(self.records)
                answer = json.dumps({"n": number, "target": target}).encode()
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Backend: recording\r\n"
                                   b"Content-Length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer)
        except OSError:
            return
        finally:
            connection.close()

    def mark(self):
        with self.lock:
            return len(self.records)

    def since(self, mark):
        with self.lock:
            return list(self.records[mark:])

    def stop(self):
        self.socket.close()


def folded(name):
    """A header name as a backend that reads `_` as `-` in any letter case sees it."""
    return name.lower().replace("_", "-")


def received(record, name):
    """Every value of `name` in a recorded request, names compared case-insensitively with `_` = `-`."""
    return [value for key, value in record["headers"] if folded(key) == folded(name)]


# --------------------------------------------------------------------------- rendering the recipes

def replace_once(text, old, new):
    assert text.count(old) == 1, f"the recipe should contain {old!r} exactly once (found {text.count(old)})"
    return text.replace(old, new)


def render_nginx(directory, listen, gatehouse_port, backend_port, cache=False):
    """deploy/forward-auth/nginx.conf with this run's addresses; `cache`: its "# [cache] " lines on."""
    text = (RECIPES / "nginx.conf").read_text()
    if cache:
        assert text.count("# [cache] ") >= 4, "the nginx recipe's optional cache lines are marked '# [cache] '"
        text = text.replace("# [cache] ", "")
    text = replace_once(text, "listen 80;", f"listen 127.0.0.1:{listen};")
    text = replace_once(text, "server 127.0.0.1:8080;", f"server 127.0.0.1:{gatehouse_port};")
    text = replace_once(text, "server 127.0.0.1:9000;", f"server 127.0.0.1:{backend_port};")
    text = text.replace("/run/nginx/gatehouse-auth", str(directory / "auth-cache"))
    # Plumbing only: files of this run, not the distribution's.
    plumbing = "".join(f"    {name}_temp_path {directory / name};\n" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    plumbing += f"    access_log {directory / 'access.log'};\n"
    text = replace_once(text, "http {\n", "http {\n" + plumbing)
    path = directory / "nginx.conf"
    path.write_text(text)
    return path


def nginx_command(directory, conf, test=False):
    globals_ = f"pid {directory / 'nginx.pid'};" + (" user root;" if os.geteuid() == 0 else "")
    if not test:
        globals_ = "daemon off; " + globals_
    return [NGINX, *(["-t"] if test else []), "-p", str(directory), "-e", str(directory / "error.log"), "-c", str(conf), "-g", globals_]


def render_caddy(directory, listen, gatehouse_port, backend_port):
    """deploy/forward-auth/Caddyfile with this run's addresses, admin endpoint off, plain HTTP."""
    text = (RECIPES / "Caddyfile").read_text()
    text = replace_once(text, "\napi.example.com {", f"\nhttp://:{listen} {{")
    text = replace_once(text, "forward_auth 127.0.0.1:8080 {", f"forward_auth 127.0.0.1:{gatehouse_port} {{")
    text = replace_once(text, "reverse_proxy 127.0.0.1:9000", f"reverse_proxy 127.0.0.1:{backend_port}")
    text = "{\n\tadmin off\n\tauto_https off\n}\n\n" + text
    path = directory / "Caddyfile"
    path.write_text(text)
    return path


def caddy_env(directory):
    return dict(os.environ, HOME=str(directory), XDG_DATA_HOME=str(directory / "data"), XDG_CONFIG_HOME=str(directory / "config"))


def wait_listening(port, process, what, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)  # polling a port with a deadline, not synchronising on time
    raise RuntimeError(f"{what} did not listen on {port} within {timeout}s")


@contextmanager
def started(command, port, what, log, env=None):
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        try:
            wait_listening(port, process, what)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


# --------------------------------------------------------------------------- Gatehouse and the ingresses

def _upstream(name, identity_url, extra=""):
    return f"""
  - name: {name}
    kind: oauth2
    authorization_endpoint: {identity_url}/authorize
    token_endpoint: {identity_url}/token
    client_id: gatehouse
    client_secret_env: {SECRET_ENV}
    scopes: [read]
    identity:
      kind: introspection
      url: {identity_url}/introspect
      bpid: /bpid
      timeout: 2s{extra}"""


def _route(prefix, backend, upstream="idp", methods="[GET, HEAD, POST]", extra=""):
    sign_in = "\n    sign_in_client: com.example.fa" if upstream == "idp" else ""
    headers = "".join(f"\n      {name}: {source}" for name, source in IDENTITY_HEADERS.items())
    return f"""
  - prefix: {prefix}
    backend: {backend}{prefix}
    methods: {methods}
    upstream: {upstream}{sign_in}
    identity_headers:{headers}{extra}"""


def gatehouse_config(port, workdir, seen, identity, backend, closed_port):
    return server_and_store(port, f"{workdir}/forward-auth.sqlite") + f"""
upstreams:{_upstream("idp", identity.url)}{_upstream("idp-short", identity.url, f'''
      cache_ttl: {SHORT_TTL}s
      negative_ttl: 0s''')}{_upstream("down", f"http://127.0.0.1:{closed_port}")}
clients:
  - client_id: com.example.fa
    upstream: idp
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]
routes:{_route("/api", backend.url)}{_route("/admin", backend.url, extra='''
    require:
      scopes: [admin]''')}{_route("/pass", backend.url, extra='''
    authorization: passthrough''')}{_route("/assert", backend.url, extra='''
    authorization: assertion''')}{_route("/down", backend.url, upstream="down")}{_route("/revocable", backend.url, upstream="idp-short")}
forward_auth:
  trusted_proxies: ["127.0.0.1/32", "::1/128"]
  max_age: {MAX_AGE}s
rate_limits:
  relay_per_subject: {{per_second: 0.01, burst: {BURST}}}
sessions:
  encryption_keys_file: {session_keys(workdir, "forward-auth-session-keys", seen)}
"""


@pytest.fixture(scope="module")
def stack(workdir, seen):
    """Gatehouse (forward_auth on) with its doubles, nginx and Caddy from the recipes in front."""
    for tool in (NGINX, CADDY):
        assert Path(tool).exists(), f"{tool} is missing: scripts/system-packages installs nginx and caddy"
    identity, backend, closed_port = IdentityDouble(seen), RecordingBackend(), free_port()
    port = free_port()
    env = dict(os.environ, **{SECRET_ENV: secrets.token_urlsafe(24)})
    config = gatehouse_config(port, workdir, seen, identity, backend, closed_port)
    nginx_dir, caddy_dir = workdir / "fa-nginx", workdir / "fa-caddy"
    nginx_dir.mkdir(exist_ok=True)
    caddy_dir.mkdir(exist_ok=True)
    nginx_port, caddy_port = free_port(), free_port()
    nginx_conf = render_nginx(nginx_dir, nginx_port, port, backend.port)
    caddyfile = render_caddy(caddy_dir, caddy_port, port, backend.port)
    try:
        with run_gatehouse(workdir, "forward-auth", config, env) as gatehouse, \
                started(nginx_command(nginx_dir, nginx_conf), nginx_port, "nginx", nginx_dir / "nginx.out"), \
                started([CADDY, "run", "--config", str(caddyfile), "--adapter", "caddyfile"], caddy_port, "caddy",
                        caddy_dir / "caddy.log", caddy_env(caddy_dir)):
            yield {"gatehouse": gatehouse, "identity": identity, "backend": backend, "env": env, "config": config,
                   "ports": {"relay": port, "nginx": nginx_port, "caddy": caddy_port}, "workdir": workdir}
    finally:
        identity.stop()
        backend.stop()


def call(stack, engine, method, target, headers=(), token=None, host=None, source=None):
    """One request on a raw socket to `engine` (relay, nginx, caddy, or a port), `Connection: close`."""
    port = stack["ports"][engine] if isinstance(engine, str) else engine
    if host is None and stack is not None and port == stack["ports"]["relay"] and target.startswith("/forward-auth"):
        host = "gatehouse.internal"  # an ingress asks on an internal name: the public host is refused
    headers = list(headers)
    if token is not None:
        headers.insert(0, ("Authorization", f"Bearer {token}"))
    headers.append(("Connection", "close"))
    data = raw_request(method, target, headers, host=host or f"127.0.0.1:{port}")
    if source is None:
        with RawClient(port, timeout=15) as client:
            return client.exchange(data, head_request=method == "HEAD")
    client = RawClient(port, timeout=15, connect=False)
    sock = socket.socket()
    sock.settimeout(15)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    client.sock = sock
    with client:
        return client.exchange(data)


def problem(response):
    assert (response.header("Content-Type") or "").startswith("application/problem+json"), (response.status, response.headers, response.body[:300])
    return json.loads(response.body)


# Per-request members of a problem (none of the decision's): left out when two answers are compared.
VOLATILE = {"instance", "request_id", "requestId", "trace_id", "traceId"}


def comparable(body):
    body = {key: value for key, value in body.items() if key not in VOLATILE}
    sign_in = body.get("sign_in")
    if isinstance(sign_in, dict) and "url" in sign_in:
        url = sign_in["url"]
        base, _, query = url.partition("?")
        kept = sorted(pair for pair in query.split("&") if pair.split("=")[0] not in ("state", "nonce", "code_challenge"))
        body["sign_in"] = dict(sign_in, url=base + "?" + "&".join(kept))
    return body


# --------------------------------------------------------------------------- the behaviour table

def case_request(stack, case, engine):
    """(method, target, headers, token or None) of one case for one engine; fresh tokens each time."""
    identity = stack["identity"]
    if case == "no token":
        return "GET", "/api/x", [], None
    if case == "unknown token":
        return "GET", "/api/x", [], "fa_" + secrets.token_urlsafe(24)
    if case == "inactive token":
        token, _ = identity.issue()
        identity.revoke(token)
        return "GET", "/api/x", [], token
    if case == "missing scope":
        return "GET", "/admin/x", [], identity.issue(scope="read")[0]
    if case == "method not listed":
        return "PATCH", "/api/x", [], identity.issue()[0]
    if case == "identity service down":
        return "GET", "/down/x", [], identity.issue()[0]
    if case == "outside every route":
        return "GET", "/nowhere/x", [], identity.issue()[0]
    if case == "good token":
        return "GET", "/api/contracts/42?from=2026-01", [], identity.issue()[0]
    raise ValueError(case)


TABLE = {  # case: expected status
    "no token": 401, "unknown token": 401, "inactive token": 401, "missing scope": 403,
    "method not listed": 405, "identity service down": 503, "outside every route": 404, "good token": 200,
}


@pytest.mark.parametrize("case", list(TABLE))
def test_the_same_answer_through_the_relay_nginx_and_caddy(stack, case):
    backend = stack["backend"]
    answers = {}
    for engine in ENGINES:
        method, target, headers, token = case_request(stack, case, engine)
        mark = backend.mark()
        response = call(stack, engine, method, target, headers, token)
        answers[engine] = (response, backend.since(mark), token)
        assert response.status == TABLE[case], f"{engine}: {response.status} {response.headers} {response.body[:400]!r}"
    if TABLE[case] == 200:
        for engine, (response, seen_by_backend, token) in answers.items():
            assert len(seen_by_backend) == 1, f"{engine}: the backend saw {seen_by_backend}"
            record = seen_by_backend[0]
            assert record["target"] == "/api/contracts/42?from=2026-01", (engine, record)
            subject = stack["identity"].tokens[token]["sub"]
            assert received(record, "X-BPId") == [BPID], (engine, record["headers"])
            assert received(record, "X-Subject") == [subject], (engine, record["headers"])
            assert received(record, "Authorization") == [], (engine, record["headers"])  # /api: authorization remove
            assert received(record, "X-Gatehouse-Refusal") == []
        return
    reference = answers["relay"][0]
    relay_problem = problem(reference)
    assert relay_problem["status"] == TABLE[case]
    for engine, (response, seen_by_backend, _) in answers.items():
        assert seen_by_backend == [], f"{engine}: a refused request reached the backend: {seen_by_backend}"
        body = problem(response)
        for member in ("type", "title", "status"):
            assert body[member] == relay_problem[member], (engine, member, body, relay_problem)
        for header in ("WWW-Authenticate", "Allow"):
            assert response.header_values(header) == reference.header_values(header), (engine, header, response.headers)
        assert bool(response.header("Retry-After")) == bool(reference.header("Retry-After")), (engine, response.headers)
        # nginx and Caddy hand the app the relay's very problem, not only its status.
        assert comparable(body) == comparable(relay_problem), (engine, body, relay_problem)
        assert response.header("X-Gatehouse-Refusal") is None, (engine, "the carried refusal is nginx's, never the app's")
    if case in ("no token", "unknown token", "inactive token"):
        assert 'error="invalid_token"' in reference.header("WWW-Authenticate"), reference.headers
        assert relay_problem["sign_in"]["url"] and relay_problem["sign_in"]["authorization_endpoint"]
        assert "client_id=com.example.fa" in relay_problem["sign_in"]["url"]
    if case == "missing scope":
        assert "admin" in relay_problem["detail"]
    if case == "method not listed":
        assert "GET" in reference.header("Allow")
    if case == "identity service down":
        assert int(reference.header("Retry-After")) > 0


def test_relay_per_subject_is_counted_by_decisions_too(stack):
    """The (burst + 1)th request of a subject is 429 with Retry-After on every path, and nothing of
    it reaches the backend."""
    backend = stack["backend"]
    first_refusal = {}
    for engine in ENGINES:
        token, _ = stack["identity"].issue()
        statuses = []
        for _ in range(BURST + 3):
            mark = backend.mark()
            response = call(stack, engine, "GET", "/api/x", token=token)
            statuses.append(response.status)
            if response.status == 429:
                assert backend.since(mark) == []
                assert int(response.header("Retry-After")) > 0, response.headers
                first_refusal[engine] = (len(statuses), problem(response))
                break
        assert statuses[:-1] == [200] * BURST and statuses[-1] == 429, (engine, statuses)
    bodies = {engine: {key: body[key] for key in ("type", "title", "status")} for engine, (_, body) in first_refusal.items()}
    assert bodies["nginx"] == bodies["relay"] == bodies["caddy"], bodies


# --------------------------------------------------------------------------- Authorization toward the backend

def verify_assertion(stack, value, subject):
    assert value.startswith("Bearer "), value
    keys = jwk.JWKSet.from_json(requests.get(f"http://127.0.0.1:{stack['ports']['relay']}/.well-known/jwks.json", timeout=10).text)
    claims = json.loads(jwt.JWT(jwt=value.removeprefix("Bearer "), key=keys, algs=["ES256"]).claims)
    assert claims["sub"] == subject and claims["bpid"] == BPID, claims


@pytest.mark.parametrize("engine", ENGINES)
def test_what_authorization_the_backend_sees(stack, engine):
    backend, identity = stack["backend"], stack["identity"]
    token, claims = identity.issue()
    seen = {}
    for prefix in ("/api", "/pass", "/assert"):
        mark = backend.mark()
        response = call(stack, engine, "GET", prefix + "/x", token=token)
        assert response.status == 200, (engine, prefix, response)
        [record] = backend.since(mark)
        seen[prefix] = received(record, "Authorization")
    assert seen["/api"] == [], (engine, "authorization: remove", seen)
    assert seen["/pass"] == [f"Bearer {token}"], (engine, "authorization: passthrough", seen)
    assert len(seen["/assert"]) == 1 and token not in seen["/assert"][0], (engine, seen)
    verify_assertion(stack, seen["/assert"][0], claims["sub"])


# --------------------------------------------------------------------------- spoofing

SPOOFS = [("X-BPId", "1"), ("x-bpid", "1"), ("X-BPID", "1"), ("X_BPId", "1"), ("x_bpid", "1"),
          ("X-Subject", "mallory"), ("x-subject", "mallory"), ("X-SUBJECT", "mallory"), ("X_Subject", "mallory"),
          ("x_SUBJECT", "mallory")]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("with_bpid", [True, False], ids=["identity with BPId", "identity without BPId"])
def test_a_client_never_speaks_for_gatehouse(stack, engine, with_bpid):
    backend, identity = stack["backend"], stack["identity"]
    token, claims = identity.issue(bpid=BPID if with_bpid else None)
    expected = {"X-BPId": [BPID] if with_bpid else [], "X-Subject": [claims["sub"]]}
    for spoof in [[pair] for pair in SPOOFS] + [SPOOFS]:
        mark = backend.mark()
        response = call(stack, engine, "GET", "/api/x", spoof, token=token)
        assert response.status == 200, (engine, spoof, response)
        [record] = backend.since(mark)
        for name, values in expected.items():
            assert received(record, name) == values, (engine, spoof, record["headers"])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_client_cannot_name_another_original_request(stack, engine):
    """Gatehouse reads the original request from X-Original-URL / -URI / -Method and X-Forwarded-
    Uri / -Method: a client's own must never reach it (each recipe replaces or strips them)."""
    backend, identity = stack["backend"], stack["identity"]
    token, _ = identity.issue(scope="read")
    lies = [("X-Original-URL", "http://api.example.com/api/x"), ("X-Original-URI", "/api/x"), ("X-Original-Method", "GET"),
            ("X-Forwarded-Uri", "/api/x"), ("X-Forwarded-Method", "GET"), ("X_Original_URI", "/api/x")]
    for lie in [[pair] for pair in lies] + [lies]:
        mark = backend.mark()
        response = call(stack, engine, "GET", "/admin/secret", lie, token=token)
        assert response.status == 403, (engine, lie, response)
        assert backend.since(mark) == [], (engine, lie)
        mark = backend.mark()
        response = call(stack, engine, "DELETE", "/api/x", lie, token=token)
        assert response.status == 405, (engine, lie, response)
        assert backend.since(mark) == [], (engine, lie)


OVERRIDES = [("X-HTTP-Method-Override", "DELETE"), ("x-http-method", "DELETE"), ("X-Method-Override", "DELETE"),
             ("X-Rewrite-URL", "/admin/secret"), ("X-Original-Host", "admin.internal"), ("X-Remote-User", "admin"),
             ("X-WEBAUTH-USER", "admin"), ("X-Forwarded-User", "admin"), ("X-Auth-Request-Email", "admin@example.com")]


@pytest.mark.parametrize("engine", ENGINES)
def test_no_backend_ever_reads_another_method_url_or_user(stack, engine):
    """Headers a backend would read as another method (Symfony, Laravel, Express method override),
    another URL or another user: the relay drops them; an ingress passes what a client sends, so
    a question carrying one is refused (400) and the backend never sees it, through every engine."""
    backend, identity = stack["backend"], stack["identity"]
    token, _ = identity.issue()
    for header in OVERRIDES:
        mark = backend.mark()
        response = call(stack, engine, "GET", "/api/x", [header], token=token)
        seen = backend.since(mark)
        if engine == "relay":
            assert response.status == 200, (header, response)
            assert received(seen[0], header[0]) == [], (header, seen[0]["headers"])
        else:
            assert response.status == 400, (engine, header, response)
            assert header[0].lower() in problem(response)["detail"].lower(), (engine, header, response.body)
            assert seen == [], (engine, header, seen)


def test_a_question_through_the_public_host_is_refused(stack):
    """A trusted proxy that also publishes Gatehouse (an ingress controller in trusted_proxies)
    relays the internet's requests to /forward-auth with Gatehouse's public host: those are not
    questions, and are refused without an answer that could hand a backend's Authorization out."""
    token, _ = stack["identity"].issue()
    public = f"127.0.0.1:{stack['ports']['relay']}"
    for path, headers in [("/forward-auth", forward_auth_request(token=token)),
                          ("/forward-auth/envoy/api/x", [("Authorization", f"Bearer {token}")])]:
        for _ in range(2):  # the second with the identity cached: the fast path declines it too
            response = call(stack, "relay", "GET", path, headers, host=public)
            assert response.status == 403, (path, response)
            assert "public host" in problem(response)["detail"]
            assert response.header("X-BPId") is None and response.header("Authorization") is None
    echoed = call(stack, "relay", "GET", "/forward-auth/refusal", [("X-Gatehouse-Refusal", "e30")], host=public)
    assert echoed.status in (400, 403) and echoed.header("Content-Type") == "application/problem+json"


# --------------------------------------------------------------------------- paths

TRICKS = ["/api/../admin/x", "/api/%2e%2e/admin/x", "/api/%2E%2E/admin/x", "/api%2Fadmin", "/api%2fadmin/x", "/api//x",
          "/api;x/y", "/apix", "/api/x/..", "/api/.%2e/admin/x", "/api/..;/admin/x", "/api/x%2F..%2F..%2Fadmin",
          "/api/%61dmin", "/api\\..\\admin/x", "/ap%69/x", "//api/x", "/api/x?q=/../admin"]


def normalised(target):
    """The path a lenient backend could read: decoded, `\\` as `/`, `;…` parameters dropped, dot segments resolved."""
    path = unquote(target.split("?")[0]).replace("\\", "/")
    segments = []
    for segment in path.split("/"):
        segment = segment.split(";")[0]
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    return "/" + "/".join(segments)


@pytest.mark.parametrize("engine", ENGINES)
def test_no_path_trick_reaches_a_route_the_caller_was_not_admitted_to(stack, engine):
    """The token has `read` only: /api is open to it, /admin is not. Whatever the target, either it
    is refused and nothing reaches the backend, or the backend receives exactly the target the app
    sent, and that target is under /api however a backend reads it."""
    backend, identity = stack["backend"], stack["identity"]
    token, _ = identity.issue(scope="read")
    outcomes = {}
    for target in ["/api/x", "/admin/x"] + TRICKS:
        mark = backend.mark()
        response = call(stack, engine, "GET", target, token=token)
        delivered = backend.since(mark)
        outcomes[target] = (response.status, [record["target"] for record in delivered])
        if response.status == 200:
            assert len(delivered) == 1, (engine, target, delivered)
            assert delivered[0]["target"] == target, (engine, target, delivered[0]["target"])
            assert delivered[0]["target"].startswith("/api/"), (engine, target)
            assert normalised(delivered[0]["target"]).startswith("/api/"), (engine, target, normalised(delivered[0]["target"]))
            assert received(delivered[0], "X-BPId") == [BPID]
        else:
            assert response.status >= 400, (engine, target, response)
            assert delivered == [], (engine, target, delivered)
    assert outcomes["/api/x"] == (200, ["/api/x"]), outcomes
    assert outcomes["/admin/x"] == (403, []), outcomes


# --------------------------------------------------------------------------- the endpoint itself

def forward_auth_request(target="/api/x", method="GET", token=None, extra=()):
    headers = [("X-Original-URI", target), ("X-Original-Method", method), ("X-Forwarded-Proto", "https"),
               ("X-Forwarded-Host", "api.example.com"), ("X-Forwarded-For", "203.0.113.7")]
    if token:
        headers.insert(0, ("Authorization", f"Bearer {token}"))
    return headers + list(extra)


def test_an_allow_is_200_with_what_the_relay_would_set_and_a_bounded_lifetime(stack):
    token, claims = stack["identity"].issue()
    response = call(stack, "relay", "GET", "/forward-auth", forward_auth_request(token=token))
    assert response.status == 200, response
    assert response.body == b""
    assert response.header("X-BPId") == BPID and response.header("X-Subject") == claims["sub"]
    assert response.header("Authorization") is None  # /api: authorization remove
    assert response.header("Cache-Control") == f"private, max-age={MAX_AGE}"
    assert response.header("X-Accel-Expires") == str(MAX_AGE)
    refused = call(stack, "relay", "GET", "/forward-auth", forward_auth_request(target="/admin/x", token=token))
    assert refused.status == 403 and refused.header("Cache-Control") == "no-store"
    assert refused.header("X-Accel-Expires") in (None, "0")
    carried = json.loads(base64.urlsafe_b64decode(refused.header("X-Gatehouse-Refusal") + "=="))
    assert carried["status"] == 403 and json.loads(carried["body"])["status"] == 403
    handed_back = call(stack, "relay", "GET", "/forward-auth/refusal", [("X-Gatehouse-Refusal", refused.header("X-Gatehouse-Refusal"))])
    assert handed_back.status == 403 and json.loads(handed_back.body) == json.loads(refused.body)
    # Without a method or a path: 400 naming the headers.
    missing = call(stack, "relay", "GET", "/forward-auth", [("Authorization", f"Bearer {token}")])
    assert missing.status == 400 and "X-Original" in problem(missing)["detail"], missing


def test_a_decision_on_the_fast_path_is_the_general_paths_answer(stack):
    """The first question about a token goes the general way (its identity is not cached); the
    next ones are answered on the event loop (the log says relay=fast). Both give the same allow,
    header for header, by nginx's convention and Envoy's; a refusal is never the fast path's."""
    lines = stack["gatehouse"]["lines"]
    for path, headers in [("/forward-auth", lambda token: forward_auth_request(target="/api/x?q=1", token=token)),
                          ("/forward-auth/envoy/api/x?q=1", lambda token: [("Authorization", f"Bearer {token}"),
                                                                           ("X-Forwarded-Proto", "https")])]:
        token, _ = stack["identity"].issue()
        answers = []
        # One keep-alive connection, as an ingress keeps to its auth service (`Connection: close`
        # goes the general way, for the relay as for decisions).
        with RawClient(stack["ports"]["relay"], timeout=15) as client:
            responses = [client.exchange(raw_request("GET", path, headers(token), host="gatehouse.internal")) for _ in range(3)]
        for response in responses:
            assert response.status == 200, response
            request_id = response.header("X-Request-Id")
            lines.wait_for(re.escape(request_id))
            meta = lines.requests[request_id]
            answers.append((meta.get("relay"), response))
        assert [relay for relay, _ in answers] == [None, "fast", "fast"], (path, [meta for meta, _ in answers])
        general, fast = answers[0][1], answers[1][1]
        comparable_headers = lambda response: sorted((name.lower(), value) for name, value in response.headers
                                                     if name.lower() not in ("x-request-id", "date", "connection"))
        assert comparable_headers(fast) == comparable_headers(general), (path, fast.headers, general.headers)
        assert fast.body == general.body == b""
    # A refusal (here the route's rule) is answered by the general path only, with its body.
    token, _ = stack["identity"].issue(scope="read")
    for _ in range(2):
        refused = call(stack, "relay", "GET", "/forward-auth", forward_auth_request(target="/admin/x", token=token))
        assert refused.status == 403 and problem(refused)["status"] == 403
        lines.wait_for(re.escape(refused.header("X-Request-Id")))
        assert lines.requests[refused.header("X-Request-Id")].get("relay") is None


def test_only_trusted_proxies_are_answered_and_nothing_they_send_is_read(stack):
    """trusted_proxies is 127.0.0.1/32 and ::1/128: 127.0.0.2 (also this machine's loopback) is not."""
    token, _ = stack["identity"].issue()
    allowed = call(stack, "relay", "GET", "/forward-auth", forward_auth_request(token=token), source="127.0.0.1")
    assert allowed.status == 200
    for path, headers in [("/forward-auth", forward_auth_request(token=token)),
                          ("/forward-auth", [("Authorization", f"Bearer {token}")]),  # trusted: 400; here 403
                          ("/forward-auth", forward_auth_request(target="/nowhere", token=token)),  # trusted: 404
                          ("/forward-auth/envoy/api/x", [("Authorization", f"Bearer {token}")]),
                          ("/forward-auth/refusal", [("X-Gatehouse-Refusal", "e30")])]:
        response = call(stack, "relay", "GET", path, headers, source="127.0.0.2")
        assert response.status == 403, (path, response)
        body = problem(response)
        assert body["status"] == 403
        assert response.header("X-BPId") is None and response.header("X-Gatehouse-Refusal") is None
    # The relay itself still answers 127.0.0.2 (only decisions are for the ingress).
    assert call(stack, "relay", "GET", "/api/x", token=token, source="127.0.0.2").status == 200


# --------------------------------------------------------------------------- Envoy and Traefik, replayed

def load_yaml(name):
    return yaml.safe_load((RECIPES / name).read_text())


def envoy_filters():
    config = load_yaml("envoy.yaml")
    [listener] = config["static_resources"]["listeners"]
    [hcm] = listener["filter_chains"][0]["filters"]
    return config, hcm["typed_config"]


def test_envoy_ext_authz_request_replayed(stack):
    """What Envoy's HTTP ext_authz client sends (source/extensions/filters/common/ext_authz/
    ext_authz_http_impl.cc in github.com/envoyproxy/envoy; docs: ext_authz_filter, "HTTP service"):
    the original method, path_prefix + the original path and query, the original Host, only the
    client headers allowed_headers matches, Content-Length: 0, no body."""
    _, hcm = envoy_filters()
    names = [entry["name"] for entry in hcm["http_filters"]]
    service = hcm["http_filters"][names.index("envoy.filters.http.ext_authz")]["typed_config"]["http_service"]
    prefix = service["path_prefix"]
    allowed = {pattern["exact"] for pattern in service["authorization_request"]["allowed_headers"]["patterns"]}
    upstream = {pattern["exact"] for pattern in service["authorization_response"]["allowed_upstream_headers"]["patterns"]}
    token, claims = stack["identity"].issue(scope="read")

    def envoy(method, target, client_headers):
        sent = [(name, value) for name, value in client_headers if name.lower() in allowed and name.lower() != "host"]
        sent += [("Content-Length", "0")]
        return call(stack, "relay", method, prefix + target, sent, host="api.example.com")

    client = [("authorization", f"Bearer {token}"), ("x-forwarded-proto", "https"), ("x-forwarded-for", "203.0.113.7"),
              ("x-bpid", "1"), ("x-original-uri", "/admin/x"), ("x-original-method", "DELETE")]
    allow = envoy("GET", "/api/contracts/1?x=1", client)
    assert allow.status == 200, allow
    answered = {name.lower(): value for name, value in allow.headers}
    assert answered["x-bpid"] == BPID and answered["x-subject"] == claims["sub"]
    assert {name.lower() for name in IDENTITY_HEADERS} <= upstream and "authorization" in upstream
    assert envoy("GET", "/admin/x", client).status == 403
    refused = envoy("PATCH", "/api/x", client)
    assert refused.status == 405 and "GET" in refused.header("Allow")
    anonymous = envoy("GET", "/api/x", [("x-forwarded-proto", "https")])
    assert anonymous.status == 401 and 'error="invalid_token"' in anonymous.header("WWW-Authenticate")
    assert anonymous.header("X-Gatehouse-Refusal") is None  # Envoy hands the refusal over itself


def test_traefik_forward_auth_request_replayed(stack):
    """What Traefik's ForwardAuth sends (pkg/middlewares/auth/forward.go, writeHeader, in
    github.com/traefik/traefik; docs: middlewares/http/forwardauth): a GET to `address` with the
    client's headers (those of authRequestHeaders), X-Forwarded-For, -Method, -Proto, -Host, -Uri."""
    middlewares = load_yaml("traefik.yaml")["http"]["middlewares"]
    forward = middlewares["gatehouse"]["forwardAuth"]
    address = forward["address"]
    assert address.endswith("/forward-auth")
    path = "/" + address.split("://", 1)[1].split("/", 1)[1]
    request_headers = {name.lower() for name in forward["authRequestHeaders"]}
    token, claims = stack["identity"].issue(scope="read")

    def traefik(method, target, client_headers):
        sent = [(name, value) for name, value in client_headers if name.lower() in request_headers]
        sent += [("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-Method", method), ("X-Forwarded-Proto", "https"),
                 ("X-Forwarded-Host", "api.example.com"), ("X-Forwarded-Uri", target)]
        return call(stack, "relay", "GET", path, sent, host="127.0.0.1")

    client = [("Authorization", f"Bearer {token}"), ("X-BPId", "1"), ("X-Original-URI", "/api/x"), ("X-Original-Method", "GET")]
    allow = traefik("GET", "/api/contracts/1?x=1", client)
    assert allow.status == 200, allow
    assert allow.header("X-BPId") == BPID and allow.header("X-Subject") == claims["sub"]
    assert traefik("GET", "/admin/x", client).status == 403  # the client's X-Original-URI never got there
    refused = traefik("DELETE", "/api/x", client)
    assert refused.status == 405 and "GET" in refused.header("Allow")
    anonymous = traefik("GET", "/api/x", [])
    assert anonymous.status == 401 and 'error="invalid_token"' in anonymous.header("WWW-Authenticate")


# --------------------------------------------------------------------------- the recipes, checked by their tools

def test_the_recipes_pass_their_own_tools(tmp_path):
    for cache in (False, True):
        directory = tmp_path / f"nginx-{cache}"
        directory.mkdir()
        conf = render_nginx(directory, free_port(), 8080, 9000, cache=cache)
        checked = subprocess.run(nginx_command(directory, conf, test=True), capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stderr
    # The recipe as shipped, too (its own paths: nginx -t only reads them).
    shipped = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(RECIPES / "nginx.conf"),
                              "-g", f"pid {tmp_path / 'nginx.pid'};"], capture_output=True, text=True, timeout=60)
    assert shipped.returncode == 0, shipped.stderr
    nginx_text = (RECIPES / "nginx.conf").read_text()
    for line in ["auth_request /_gatehouse_auth;", "proxy_pass_request_body off;", 'proxy_set_header Content-Length "";',
                 "proxy_set_header X-Original-URI $request_uri;", "proxy_set_header X-Original-Method $request_method;",
                 "auth_request_set $gatehouse_refusal $upstream_http_x_gatehouse_refusal;",
                 "error_page 401 = @gatehouse_refusal_401;", "error_page 403 500 = @gatehouse_refusal;",
                 "proxy_set_header X-Gatehouse-Refusal $gatehouse_refusal;",
                 "proxy_pass http://backend;", "proxy_set_header Authorization $gatehouse_authorization;",
                 "# [cache] proxy_ignore_headers Cache-Control;", '# [cache] proxy_cache_key "$http_authorization|$request_method|$request_uri";']:
        assert line in nginx_text, line
    for name in IDENTITY_HEADERS:
        variable = "$gatehouse_" + name.lower().replace("-", "_")
        assert f"auth_request_set {variable} $upstream_http_{name.lower().replace('-', '_')};" in nginx_text
        assert f"proxy_set_header {name} {variable};" in nginx_text
    assert "underscores_in_headers on" not in nginx_text.replace("Never turn on `underscores_in_headers`", "")

    caddyfile = render_caddy(tmp_path, free_port(), 8080, 9000)
    validated = subprocess.run([CADDY, "validate", "--config", str(caddyfile), "--adapter", "caddyfile"], capture_output=True, text=True,
                               timeout=60, env=caddy_env(tmp_path))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    caddy_text = (RECIPES / "Caddyfile").read_text()
    route = caddy_text[caddy_text.index("route {"):]
    for name in IDENTITY_HEADERS:
        for spelling in (name, name.replace("-", "_")):
            assert route.index(f"request_header -{spelling}\n") < route.index("forward_auth"), spelling
    assert re.search(r"copy_headers Authorization " + " ".join(IDENTITY_HEADERS), caddy_text)
    assert route.index("forward_auth") < route.index("reverse_proxy")

    tool = VENV_BIN / "kubernetes-validate"
    assert tool.exists(), f"{tool} is missing: Tests/requirements.txt installs kubernetes-validate (scripts/python-env)"
    result = subprocess.run([str(tool), "--strict", str(RECIPES / "ingress-nginx.yaml")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    documents = [document for document in yaml.safe_load_all((RECIPES / "ingress-nginx.yaml").read_text()) if document]
    assert result.stdout.count(" passed for resource ") == len(documents) == 2, result.stdout
    [ingress] = [document for document in documents if document["kind"] == "Ingress"]
    [service] = [document for document in documents if document["kind"] == "Service"]
    annotations = ingress["metadata"]["annotations"]
    namespace = ingress["metadata"]["namespace"]
    assert annotations["nginx.ingress.kubernetes.io/auth-url"] == \
        f"http://{service['metadata']['name']}.{namespace}.svc.cluster.local:{service['spec']['ports'][0]['port']}/forward-auth"
    response_headers = [name.strip() for name in annotations["nginx.ingress.kubernetes.io/auth-response-headers"].split(",")]
    assert response_headers == ["Authorization", *IDENTITY_HEADERS]

    _, hcm = envoy_filters()
    assert hcm["common_http_protocol_options"]["headers_with_underscores_action"] == "DROP_HEADER"
    names = [entry["name"] for entry in hcm["http_filters"]]
    assert names == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_authz", "envoy.filters.http.router"], names
    removed = {entry["remove"] for entry in hcm["http_filters"][0]["typed_config"]["mutations"]["request_mutations"]}
    # The identity headers, and what a backend reads as another method, URL or user (Envoy's
    # allowed_headers keeps those from Gatehouse, which would refuse them).
    assert removed == {name.lower() for name in IDENTITY_HEADERS} | {name.lower() for name, _ in OVERRIDES} | {
        "x-http-method", "x-host", "x-original-url", "x-original-uri", "remote-user", "x-authenticated-user",
        "x-forwarded-email", "x-forwarded-preferred-username", "x-forwarded-groups", "x-forwarded-access-token",
        "x-auth-request-user", "x-auth-request-preferred-username", "x-auth-request-groups", "x-auth-request-access-token"}, removed
    assert hcm["use_remote_address"] is True  # the client's address is the peer's, never its own X-Forwarded-For
    authz = hcm["http_filters"][1]["typed_config"]
    assert authz["failure_mode_allow"] is False and authz["http_service"]["path_prefix"] == "/forward-auth/envoy"
    allowed = {pattern["exact"] for pattern in authz["http_service"]["authorization_request"]["allowed_headers"]["patterns"]}
    assert allowed == {"authorization", "dpop", "cookie", "origin", "referer", "x-forwarded-proto", "x-forwarded-for", "host"}
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
    assert "dpop" in route["request_headers_to_remove"]
    assert not {name.lower() for name in IDENTITY_HEADERS} & set(route["request_headers_to_remove"])  # would remove Gatehouse's

    traefik = load_yaml("traefik.yaml")["http"]
    forward = traefik["middlewares"]["gatehouse"]["forwardAuth"]
    # false: with true, Traefik would send a client's own X-Forwarded-Uri/-Method (forward.go).
    assert forward["trustForwardHeader"] is False and forward["address"].endswith("/forward-auth")
    assert forward["authResponseHeaders"] == ["Authorization", *IDENTITY_HEADERS]
    assert not {"x-original-url", "x-original-uri", "x-original-method"} & {name.lower() for name in forward["authRequestHeaders"]}
    stripped = traefik["middlewares"]["gatehouse-strip"]["headers"]["customRequestHeaders"]
    assert {name.replace("-", "_"): "" for name in IDENTITY_HEADERS}.items() <= stripped.items()
    assert {name.lower() for name, _ in OVERRIDES} <= {name.lower() for name in stripped}, stripped
    assert set(stripped.values()) == {""}
    assert traefik["routers"]["api"]["middlewares"] == ["gatehouse-strip", "gatehouse", "gatehouse-after"]


# --------------------------------------------------------------------------- caching, bounded

def forward_auth_decisions(stack):
    return sum(1 for meta in list(stack["gatehouse"]["lines"].requests.values()) if meta.get("path", "").startswith("/forward-auth"))


def test_a_revoked_token_is_refused_within_the_bound_when_nginx_caches(stack):
    """The recipe's optional cache on: allows are served from it (fewer decisions than requests),
    and a token revoked at the identity service is refused within max_age (the cache) plus the
    route's identity cache_ttl (Gatehouse's own cache, which the allow's lifetime never outlives)."""
    directory = stack["workdir"] / "fa-nginx-cache"
    directory.mkdir(exist_ok=True)
    port = free_port()
    conf = render_nginx(directory, port, stack["ports"]["relay"], stack["backend"].port, cache=True)
    token, _ = stack["identity"].issue()
    with started(nginx_command(directory, conf), port, "nginx (cache)", directory / "nginx.out"):
        before = forward_auth_decisions(stack)
        for _ in range(8):
            assert call(stack, port, "GET", "/revocable/x", token=token).status == 200
        decisions = forward_auth_decisions(stack) - before
        assert 1 <= decisions < 8, f"{decisions} decisions for 8 requests: the cache did not serve"
        stack["identity"].revoke(token)
        revoked_at = time.monotonic()
        deadline = revoked_at + 10
        while True:
            response = call(stack, port, "GET", "/revocable/x", token=token)
            if response.status != 200:
                break
            assert time.monotonic() < deadline, "a revoked token still passed after 10 s"
            time.sleep(0.05)  # polling for the refusal, with a deadline
        took = time.monotonic() - revoked_at
        assert response.status == 401, response
        # Slack for a loaded machine (each poll is a request through nginx); an unbounded cache would hold it for 10 s.
        assert took <= MAX_AGE + SHORT_TTL + 1.5, f"refused {took:.2f}s after the revocation"


# --------------------------------------------------------------------------- DPoP through the ingress

DPOP_CLIENT = """
  - client_id: com.example.fa.dpop
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{redirect}"]
    dpop: optional""".format(redirect=APP_REDIRECT)

DPOP_ROUTES = """
  - prefix: /api/dpop
    backend: {backend}/dpop
    methods: [GET, POST]
    upstream: legacy
    authorization: passthrough"""


@pytest.mark.parametrize("engine", ["nginx", "caddy"])
def test_a_dpop_bound_sealed_token_through_the_ingress(workdir, seen, engine):
    """A sealed `ghd_` token with a proof whose htu is the ingress's public URL (what the app
    called) passes, once: the same proof again is 401, a proof for another URL is 401. The allow is
    never cacheable, and the proof never reaches the backend."""
    from sandbox.dpop import Key
    from sandbox.nativeapp import App
    from trusted import trusted_gatehouse

    extra = "forward_auth:\n  trusted_proxies: [\"127.0.0.1/32\"]\n  max_age: 5s"
    with trusted_gatehouse(workdir, seen, f"fa-dpop-{engine}", DPOP_CLIENT, DPOP_ROUTES, extra) as gatehouse:
        directory = workdir / f"fa-dpop-{engine}-ingress"
        directory.mkdir(exist_ok=True)
        port, backend = free_port(), gatehouse["backend"]
        if engine == "nginx":
            conf = render_nginx(directory, port, gatehouse["port"], backend.port)
            command, env = nginx_command(directory, conf), None
        else:
            conf = render_caddy(directory, port, gatehouse["port"], backend.port)
            command, env = [CADDY, "run", "--config", str(conf), "--adapter", "caddyfile"], caddy_env(directory)
        key = Key()
        app = App(gatehouse, seen, client_id="com.example.fa.dpop")
        answer = app.redeem(app.sign_in()["code"], headers={"DPoP": key.proof("POST", gatehouse["url"] + "/oauth/token")})
        assert answer.status_code == 200, answer.text
        token = answer.json()["access_token"]
        assert token.startswith("ghd_")
        public = f"http://127.0.0.1:{port}/api/dpop/x"
        with started(command, port, engine, directory / f"{engine}.out", env):
            def bound(proof):
                return call(None, port, "GET", "/api/dpop/x", [("Authorization", f"DPoP {token}"), ("DPoP", proof)])

            proof = key.proof("GET", public, access_token=token)
            before = backend.calls
            first = bound(proof)
            assert first.status == 200, first
            echoed = json.loads(first.body)["headers"]
            assert "dpop" not in echoed, echoed
            assert echoed["authorization"].startswith("Bearer ") and not echoed["authorization"].startswith("Bearer ghd_")
            seen.add(echoed["authorization"].removeprefix("Bearer "), kind="upstream access token")
            replayed = bound(proof)
            assert replayed.status == 401, replayed
            assert replayed.header("WWW-Authenticate", "").startswith("DPoP "), replayed.headers
            wrong = bound(key.proof("GET", gatehouse["url"] + "/api/dpop/x", access_token=token))
            assert wrong.status == 401, wrong
            assert backend.calls == before + 1  # only the first reached the backend
            # A decision for a bound token is never cacheable (a proof is spent once).
            decision = call(None, gatehouse["port"], "GET", "/forward-auth",
                            [("Authorization", f"DPoP {token}"), ("DPoP", key.proof("GET", public, access_token=token)),
                             ("X-Original-URI", "/api/dpop/x"), ("X-Original-Method", "GET"),
                             ("X-Forwarded-Proto", "http"), ("X-Forwarded-Host", f"127.0.0.1:{port}")], host="gatehouse.internal")
            assert decision.status == 200, decision
            assert decision.header("Cache-Control") == "no-store" and decision.header("X-Accel-Expires") == "0"
