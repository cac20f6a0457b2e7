"""Several Gatehouse instances on one PostgreSQL: one session whose upstream access token has
expired, a storm of relayed requests split across two instances, and exactly one refresh
reaching the real upstream (counted by a pass-through proxy in front of its token endpoint)."""

import os
import secrets
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import requests

from nativeapp import App, free_port, pump, wait_for_line

pytestmark = pytest.mark.skipif("GATEHOUSE_TEST_POSTGRES" not in os.environ,
                                reason="needs GATEHOUSE_TEST_POSTGRES (scripts/test starts PostgreSQL)")


class CountingTokenProxy:
    """Forwards token requests to the real authorization server, counting refresh grants."""

    def __init__(self, target):
        self.target = target
        self.refreshes = 0
        self.fault = None  # None: forward; or (status, JSON body) to answer refresh grants with
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if parse_qs(body.decode()).get("grant_type") == ["refresh_token"]:
                    with proxy.lock:
                        proxy.refreshes += 1
                    if proxy.fault:
                        status, payload = proxy.fault
                        self.send_response(status)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(payload)))
                        self.end_headers()
                        self.wfile.write(payload)
                        return
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
                answer = requests.post(proxy.target, data=body, headers=headers, timeout=10)
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def psql(sql):
    host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    return subprocess.run(["psql", "-h", host, "-p", port, "-U", "gatehouse", "-d", "gatehouse", "-tAc", sql],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()


@pytest.fixture(scope="module")
def cluster(workdir, upstream, relay_doubles, gatehouse, seen):
    """Two Gatehouse instances sharing one PostgreSQL database and one key file."""
    database = "e2e_" + secrets.token_hex(4)
    psql(f"CREATE DATABASE {database}")
    host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    proxy = CountingTokenProxy(upstream["url"] + "/o/token/")
    ports = [free_port(), free_port()]
    keys = workdir / "session-keys"  # written by the gatehouse fixture
    processes = []
    for index, gh_port in enumerate(ports):
        config = f"""
server:
  public_base_url: http://127.0.0.1:{gh_port}
  host: 127.0.0.1
  port: {gh_port}
store:
  postgres:
    host: {host}
    port: {port}
    database: {database}
    username: gatehouse
    pool_size: 8
upstreams:
  - name: legacy
    authorization_endpoint: {upstream["url"]}/o/authorize/
    token_endpoint: {proxy.url}
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]
    identity:
      kind: introspection
      url: {upstream["url"]}/o/introspect/
sessions:
  encryption_keys_file: {keys}
clients:
  - client_id: com.example.app
    upstream: legacy
    redirect_uris: ["com.example.app:/oauth2redirect"]
routes:
  - prefix: /api/storm
    backend: {relay_doubles["backend"].url}/storm
    upstream: legacy
    identity_headers:
      X-Subject: subject
    authorization: passthrough
"""
        path = workdir / f"cluster-{index}.yaml"
        path.write_text(config)
        log = open(workdir / f"cluster-{index}.log", "w")
        process = subprocess.Popen([str(gatehouse["binary"]), "serve", "--config", str(path), "--log-level", "info"],
                                   stdout=log, stderr=subprocess.PIPE, text=True, env=upstream["env"])
        log.write(wait_for_line(process.stderr, "gatehouse is ready", 30, f"Gatehouse instance {index}"))
        log.flush()
        pump(process.stderr, log)
        processes.append(process)
    yield {"urls": [f"http://127.0.0.1:{p}" for p in ports], "proxy": proxy, "database": database, "processes": processes}
    for process in processes:
        process.terminate()
        process.wait(10)


def query_database(cluster, sql):
    host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    return subprocess.run(["psql", "-h", host, "-p", port, "-U", "gatehouse", "-d", cluster["database"], "-tAc", sql],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def test_refresh_storm_across_two_instances_makes_one_upstream_refresh(cluster, seen):
    # Sign in through instance A; a sealed session lands in PostgreSQL.
    app = App({"url": cluster["urls"][0]}, seen)
    tokens = app.redeem(app.sign_in()["code"])
    assert tokens.status_code == 200, tokens.text
    access = tokens.json()["access_token"]
    assert access.startswith("gha_")
    # The session's upstream access token has expired (as if an hour had passed).
    query_database(cluster, "UPDATE sessions SET upstream_expires_at = 0")
    before = cluster["proxy"].refreshes
    barrier = threading.Barrier(250)

    def storm(index):
        barrier.wait()
        statuses = []
        for request in range(4):
            url = cluster["urls"][(index + request) % 2] + "/api/storm/x"
            statuses.append(requests.get(url, headers={"Authorization": f"Bearer {access}"}, timeout=60).status_code)
        return statuses

    with ThreadPoolExecutor(max_workers=250) as pool:
        statuses = [status for batch in pool.map(storm, range(250)) for status in batch]
    assert len(statuses) == 1000
    assert statuses.count(200) == 1000, {s: statuses.count(s) for s in set(statuses)}
    assert cluster["proxy"].refreshes - before == 1
    version, expires = query_database(cluster, "SELECT version, upstream_expires_at FROM sessions").split("|")
    assert int(version) == 2 and int(expires) > 0  # the stored tokens are the refreshed ones


def test_an_instance_killed_mid_storm_loses_no_session(cluster, seen):
    app = App({"url": cluster["urls"][0]}, seen)
    access = app.redeem(app.sign_in()["code"]).json()["access_token"]
    survivor = cluster["urls"][0]
    victim = cluster["processes"][1]

    def call(index):
        url = cluster["urls"][index % 2] + "/api/storm/x"
        try:
            return requests.get(url, headers={"Authorization": f"Bearer {access}"}, timeout=30).status_code
        except requests.RequestException:
            return "connection lost"  # the killed instance's own connections

    with ThreadPoolExecutor(max_workers=50) as pool:
        futures = [pool.submit(call, index) for index in range(200)]
        victim.kill()  # kill -9 while requests are in flight
        results = [future.result() for future in futures]
    assert set(results) <= {200, "connection lost"}
    after = requests.get(survivor + "/api/storm/x", headers={"Authorization": f"Bearer {access}"}, timeout=30)
    assert after.status_code == 200
    assert int(query_database(cluster, "SELECT count(*) FROM sessions WHERE revoked_at IS NULL")) >= 2


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_postgres():
    """A PostgreSQL of this test's own, which it may stop and start (in a folder the
    postgres user can reach: pytest's own temporary folders are private to root)."""
    import shutil
    import tempfile
    parent = Path(tempfile.mkdtemp(prefix="gatehouse-pg-"))
    parent.chmod(0o755)
    folder = parent / "pg"
    address = subprocess.run([str(ROOT / "scripts/postgres"), "start", str(folder)], capture_output=True, text=True,
                             check=True, timeout=120).stdout.strip()
    yield {"address": address, "folder": folder}
    subprocess.run([str(ROOT / "scripts/postgres"), "stop", str(folder)], timeout=60)
    shutil.rmtree(parent, ignore_errors=True)


def test_postgres_outage_answers_503_quickly_and_loses_no_session(own_postgres, workdir, upstream, relay_doubles, gatehouse, seen, tmp_path):
    host, port = own_postgres["address"].split(":")
    gh_port = free_port()
    config = tmp_path / "outage.yaml"
    config.write_text(f"""
server:
  public_base_url: http://127.0.0.1:{gh_port}
  port: {gh_port}
store:
  postgres: {{host: {host}, port: {port}, database: gatehouse, username: gatehouse}}
upstreams:
  - name: legacy
    authorization_endpoint: {upstream["url"]}/o/authorize/
    token_endpoint: {upstream["url"]}/o/token/
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]
sessions:
  encryption_keys_file: {workdir / "session-keys"}
clients:
  - client_id: com.example.app
    upstream: legacy
    redirect_uris: ["com.example.app:/oauth2redirect"]
""")
    log = open(tmp_path / "outage.log", "w")
    process = subprocess.Popen([str(gatehouse["binary"]), "serve", "--config", str(config)], stdout=log,
                               stderr=subprocess.PIPE, text=True, env=upstream["env"])
    try:
        wait_for_line(process.stderr, "gatehouse is ready", 30, "Gatehouse on its own PostgreSQL")
        pump(process.stderr, log)
        app = App({"url": f"http://127.0.0.1:{gh_port}"}, seen)
        pair = app.redeem(app.sign_in()["code"]).json()
        subprocess.run([str(ROOT / "scripts/postgres"), "stop", str(own_postgres["folder"])], check=True, timeout=60)
        with ThreadPoolExecutor(max_workers=20) as pool:  # under load: every request answered, quickly
            during = list(pool.map(lambda _: app.refresh(pair["refresh_token"]), range(20)))
        assert [answer.status_code for answer in during] == [503] * 20, during[0].text
        assert max(answer.elapsed.total_seconds() for answer in during) < 5
        assert all(int(answer.headers["Retry-After"]) > 0 for answer in during)
        # The same PostgreSQL comes back on the same port with the same data.
        bin_dir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
        owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(owner + [str(bin_dir / "pg_ctl"), "-D", str(own_postgres["folder"] / "data"), "-w", "-l",
                                str(own_postgres["folder"] / "server.log"), "start", "-o",
                                f"-p {port} -k {own_postgres['folder']} -c listen_addresses=127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        after = None
        for _ in range(50):  # the pool reconnects on demand; a bounded number of attempts, not a sleep
            after = app.refresh(pair["refresh_token"])
            if after.status_code != 503:
                break
        assert after.status_code == 200, after.text
        assert after.json()["refresh_token"] != pair["refresh_token"]
    finally:
        process.terminate()
        process.wait(10)


def test_postgres_holds_no_token_or_secret_in_plain_text(cluster, seen):
    app = App({"url": cluster["urls"][0]}, seen)  # instance 1 was killed by the test before
    app.redeem(app.sign_in()["code"])
    dump = "\n".join(query_database(cluster, f"SELECT t::text FROM {table} t")
                     for table in ["sessions", "access_tokens", "refresh_tokens", "issued_codes", "authorization_transactions"])
    assert "gha_" not in dump and "ghr_" not in dump
    assert len(seen.values) > 10
    leaked = [value[:6] + "…" for value in seen.values if value in dump or value.encode().hex() in dump]
    assert leaked == []


def test_upstream_500_on_refresh_is_503_and_invalid_grant_ends_the_session(cluster, seen):
    app = App({"url": cluster["urls"][0]}, seen)
    access = app.redeem(app.sign_in()["code"]).json()["access_token"]
    url = cluster["urls"][0] + "/api/storm/x"
    headers = {"Authorization": f"Bearer {access}"}
    # No relayed call before: an instance keeps a session's view for up to 10 s.
    query_database(cluster, "UPDATE sessions SET upstream_expires_at = 0")
    proxy = cluster["proxy"]
    try:
        proxy.fault = (500, b'{"error": "server_error"}')
        failing = requests.get(url, headers=headers, timeout=30)
        assert failing.status_code == 503 and int(failing.headers["Retry-After"]) > 0
        assert query_database(cluster, "SELECT count(*) FROM sessions WHERE revoked_at IS NULL AND upstream_expires_at = 0") != "0"
        proxy.fault = (400, b'{"error": "invalid_grant"}')
        ended = requests.get(url, headers=headers, timeout=30)
        assert ended.status_code == 401
        assert "sign_in" in ended.json()
    finally:
        proxy.fault = None
