"""Fixtures for Gatehouse's end-to-end tests.

Everything here is real: the Gatehouse binary built by `swift build`, started as a
process with a YAML configuration, in front of django-oauth-toolkit (Tests/Upstream)
started as another process. The only doubles are the three broken upstreams that no
package offers: one whose port is closed, one that accepts and never answers, and
one that answers 200 with a body that is not JSON.

Readiness is read from each process's own output (its "ready" line), never slept for.
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

from nativeapp import APP_REDIRECT, PASSWORD, USERNAME, App, InAppBrowser, free_port, pump, query, wait_for_line  # noqa: E402,F401


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
    env = dict(os.environ, UPSTREAM_SECRET_LEGACY=secrets.token_urlsafe(24), UPSTREAM_SECRET_MODERN=secrets.token_urlsafe(24))
    seen.add(env["UPSTREAM_SECRET_LEGACY"], env["UPSTREAM_SECRET_MODERN"])
    config = {
        "users": [{"username": USERNAME, "password": PASSWORD, "email": "alice@example.test"}],
        "applications": [
            {"client_id": "gatehouse-legacy", "client_secret_env": "UPSTREAM_SECRET_LEGACY",
             "redirect_uris": [callback, APP_REDIRECT], "pkce_required": False},
            {"client_id": "gatehouse-modern", "client_secret_env": "UPSTREAM_SECRET_MODERN",
             "redirect_uris": [callback], "pkce_required": True},
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
def gatehouse(workdir, gatehouse_port, upstream, seen):
    """The Gatehouse binary on SQLite, configured for every scenario of the suite."""
    binary = Path(os.environ.get("GATEHOUSE_BIN", ROOT / ".build/debug/gatehouse"))
    if not binary.exists():
        raise RuntimeError(f"{binary} does not exist: build it first (swift build)")
    silent, garbage, closed_port = SilentServer(), GarbageServer(), free_port()
    base = f"http://127.0.0.1:{gatehouse_port}"
    up = upstream["url"]

    def oauth2(name, token_endpoint, client_id="gatehouse-legacy", secret_env="UPSTREAM_SECRET_LEGACY",
               auth="client_secret_basic", pkce=False, timeout="3s"):
        return f"""
  - name: {name}
    kind: oauth2
    authorization_endpoint: {up}/o/authorize/
    token_endpoint: {token_endpoint}
    client_id: {client_id}
    client_secret_env: {secret_env}
    client_auth: {auth}
    scopes: [read, write]
    pkce: {str(pkce).lower()}
    timeout: {timeout}"""

    def client(client_id, upstream_name, wiring="callback", redirects=(APP_REDIRECT, "http://127.0.0.1/callback")):
        uris = ", ".join(f'"{r}"' for r in redirects)
        return f"""
  - client_id: {client_id}
    upstream: {upstream_name}
    wiring: {wiring}
    token_exposure: passthrough
    redirect_uris: [{uris}]"""

    config = f"""
server:
  public_base_url: {base}
  host: 127.0.0.1
  port: {gatehouse_port}
store:
  sqlite_path: {workdir}/gatehouse.sqlite
upstreams:{oauth2("legacy", up + "/o/token/")}{oauth2("modern", up + "/o/token/", "gatehouse-modern", "UPSTREAM_SECRET_MODERN", "client_secret_post", True)}{oauth2("down", f"http://127.0.0.1:{closed_port}/token")}{oauth2("slow", f"http://127.0.0.1:{silent.port}/token", timeout="1s")}{oauth2("garbage", f"http://127.0.0.1:{garbage.port}/token")}
clients:{client("com.example.app", "legacy")}{client("com.example.relay", "legacy", "relay", (APP_REDIRECT,))}{client("com.example.modern", "modern")}{client("com.example.down", "down")}{client("com.example.slow", "slow")}{client("com.example.garbage", "garbage")}
"""
    config_path = workdir / "gatehouse.yaml"
    config_path.write_text(config)
    log_path = workdir / "gatehouse.log"
    log = open(log_path, "w")
    process = subprocess.Popen([str(binary), "serve", "--config", str(config_path), "--log-level", "debug"],
                               stdout=log, stderr=subprocess.PIPE, text=True, env=upstream["env"])
    try:
        ready = wait_for_line(process.stderr, r"gatehouse is ready", 30, "Gatehouse")
        log.write(ready)
        pump(process.stderr, log)
        yield {"url": base, "log": log_path, "process": process}
    finally:
        process.terminate()
        process.wait(10)
        log.close()
