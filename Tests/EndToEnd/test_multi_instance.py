"""Several Gatehouse instances on one PostgreSQL.

- A refresh storm: one session whose upstream access token has expired, 1,000 relayed requests
  split across two instances, exactly one refresh reaching the real upstream (counted by a
  pass-through proxy in front of its token endpoint, sandbox/tokenproxy.py).
- Passthrough refreshes of one upstream refresh token on both instances: one upstream refresh,
  one pair.
- Revocation on one instance (or by `gatehouse sessions revoke`) reaches the other within a
  second (LISTEN/NOTIFY), session view and identity cache alike, also when the session's
  upstream token is in use while the upstream revokes it.
- The admin commands against the PostgreSQL store, revoking upstream too.
- Waiting for another instance's refresh gives up after 10 s (503). An instance killed (-9)
  while it holds a session's refresh lease: the other takes over once the lease has expired,
  with one refresh and no lost session.
- Upstream errors on a sealed refresh: retried per `refresh_token_policy`, 503, or the end.
- A PostgreSQL outage, and no token or secret in plain text in any table.
"""

import json
import os
import secrets
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from sandbox.nativeapp import App, InAppBrowser, free_port, pump, wait_for_line
from relaytokens import PASSWORDS
from sandbox.tokenproxy import CountingTokenProxy

pytestmark = pytest.mark.skipif("GATEHOUSE_TEST_POSTGRES" not in os.environ,
                                reason="needs GATEHOUSE_TEST_POSTGRES (scripts/test starts PostgreSQL)")


def psql(sql):
    host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    return subprocess.run(["psql", "-h", host, "-p", port, "-U", "gatehouse", "-d", "gatehouse", "-tAc", sql],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()


@pytest.fixture(scope="module")
def cluster(workdir, upstream, relay_doubles, gatehouse, seen):
    """Two Gatehouse instances sharing one PostgreSQL database and one key file. Upstream
    `legacy` (its token endpoint behind `proxy`) serves the sealed com.example.app and the
    passthrough com.example.passthrough; upstream `short` (timeout 1 s, behind `short_proxy`)
    serves the sealed com.example.short, for the lease test. Both revoke upstream tokens
    through `revocation_proxy`."""
    database = "e2e_" + secrets.token_hex(4)
    psql(f"CREATE DATABASE {database}")
    host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    proxy = CountingTokenProxy(upstream["url"] + "/o/token/", seen)
    short_proxy = CountingTokenProxy(upstream["url"] + "/o/token/", seen)
    revocation_proxy = CountingTokenProxy(upstream["url"] + "/o/revoke_token/", seen)
    ports = [free_port(), free_port()]
    keys = workdir / "session-keys"  # written by the gatehouse fixture
    processes, configs = [], []

    def oauth2(name, token_endpoint, extra=""):
        return f"""
  - name: {name}
    authorization_endpoint: {upstream["url"]}/o/authorize/
    token_endpoint: {token_endpoint}
    revocation_endpoint: {revocation_proxy.url}
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]{extra}
    identity:
      kind: introspection
      url: {upstream["url"]}/o/introspect/
      subject: /username"""

    def route(prefix, upstream_name):
        return f"""
  - prefix: {prefix}
    backend: {relay_doubles["backend"].url}{prefix.removeprefix("/api")}
    upstream: {upstream_name}
    identity_headers:
      X-Subject: subject
    authorization: passthrough"""

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
upstreams:{oauth2("legacy", proxy.url)}{oauth2("short", short_proxy.url, chr(10) + "    timeout: 1s")}
sessions:
  encryption_keys_file: {keys}
clients:
  - client_id: com.example.app
    upstream: legacy
    redirect_uris: ["com.example.app:/oauth2redirect"]
  - client_id: com.example.passthrough
    upstream: legacy
    token_exposure: passthrough
    redirect_uris: ["com.example.app:/oauth2redirect"]
  - client_id: com.example.short
    upstream: short
    redirect_uris: ["com.example.app:/oauth2redirect"]
routes:{route("/api/storm", "legacy")}{route("/api/short", "short")}
"""
        path = workdir / f"cluster-{index}.yaml"
        path.write_text(config)
        configs.append(path)
        log = open(workdir / f"cluster-{index}.log", "w")
        process = subprocess.Popen([str(gatehouse["binary"]), "serve", "--config", str(path), "--log-level", "info"],
                                   stdout=log, stderr=subprocess.PIPE, text=True, env=upstream["env"])
        log.write(wait_for_line(process.stderr, "gatehouse is ready", 30, f"Gatehouse instance {index}"))
        log.flush()
        pump(process.stderr, log)
        processes.append(process)
    yield {"urls": [f"http://127.0.0.1:{p}" for p in ports], "proxy": proxy, "short_proxy": short_proxy,
           "revocation_proxy": revocation_proxy,
           "database": database, "processes": processes, "configs": configs, "binary": gatehouse["binary"],
           "env": upstream["env"], "admin_log": workdir / "cluster-admin.log"}
    for process in processes:
        process.terminate()
        process.wait(10)
    for each in (proxy, short_proxy, revocation_proxy):
        each.stop()


def query_database(cluster, sql):
    host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    return subprocess.run(["psql", "-h", host, "-p", port, "-U", "gatehouse", "-d", cluster["database"], "-tAc", sql],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def session_ids(cluster):
    return set(query_database(cluster, "SELECT id FROM sessions").split())


def sealed_sign_in(cluster, seen, instance=0, client_id="com.example.app", username=None):
    """Signs in through one instance; returns (app, Gatehouse pair, the new session's id)."""
    before = session_ids(cluster)
    app = App({"url": cluster["urls"][instance]}, seen, client_id=client_id)
    browser = InAppBrowser(username=username, password=PASSWORDS[username]) if username else None
    answer = app.redeem(app.sign_in(browser)["code"])
    assert answer.status_code == 200, answer.text
    pair = answer.json()
    assert pair["access_token"].startswith("gha_")
    (session,) = session_ids(cluster) - before
    return app, pair, session


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def relayed(base, token, path="/api/storm/x", session=requests):
    return session.get(base + path, headers=bearer(token), timeout=30)


def refused_after(base, token, since, deadline=12.0, path="/api/storm/x", what="the Gatehouse token"):
    """Seconds from `since` (a monotonic time) until `base` first answers 401 to `token`,
    polled every 10 ms; the statuses seen before. AssertionError after `deadline` seconds."""
    statuses = Counter()
    with requests.Session() as session:
        while time.monotonic() - since < deadline:
            status = relayed(base, token, path, session).status_code
            if status == 401:
                return time.monotonic() - since, statuses
            statuses[status] += 1
            time.sleep(0.01)
    raise AssertionError(f"{base} still accepted {what} {deadline} s after the revocation: {dict(statuses)}")


class Poller:
    """Relays `token` through `base` from a thread of its own, every 10 ms, from before a
    revocation until after the first 401, recording when each answer arrived."""

    def __init__(self, base, token, path="/api/storm/x"):
        self.base, self.token, self.path = base, token, path
        self.answers = []  # (monotonic time the answer arrived, status or exception name)
        self.condition = threading.Condition()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        with requests.Session() as session:
            while not self.stopped.is_set():
                try:
                    status = relayed(self.base, self.token, self.path, session).status_code
                except requests.RequestException as error:
                    status = type(error).__name__
                with self.condition:
                    self.answers.append((time.monotonic(), status))
                    self.condition.notify_all()
                self.stopped.wait(0.01)

    def wait(self, predicate, timeout, what):
        with self.condition:
            if not self.condition.wait_for(lambda: predicate(self.answers), timeout):
                raise AssertionError(f"{self.base}: {what} within {timeout} s; answers: "
                                     f"{dict(Counter(status for _, status in self.answers))}")

    def measure(self, revoke, deadline=12.0):
        """Runs `revoke` (which returns once the revocation is done) while polling; returns
        (seconds from the revocation's start, seconds from its end, to the first 401; the
        monotonic time of its end)."""
        try:
            self.wait(lambda answers: any(status == 200 for _, status in answers), 10, "no 200 before the revocation")
            started = time.monotonic()
            revoke()
            done = time.monotonic()
        except BaseException:
            self.stop()
            raise
        refused_at = self.refused(deadline)
        return refused_at - started, refused_at - done, done

    def refused(self, deadline=12.0):
        """The monotonic time of the first 401, once five more answers said the same; every
        answer before it was 200. Stops polling."""
        try:
            self.wait(lambda answers: any(status == 401 for _, status in answers), deadline, "no 401 after the revocation")
            first = next(index for index, (_, status) in enumerate(self.answers) if status == 401)
            self.wait(lambda answers: len(answers) >= first + 6, 10, "no five answers after the first 401")
        finally:
            self.stop()
        statuses = [status for _, status in self.answers]
        assert set(statuses[:first]) == {200}, Counter(statuses[:first])  # served, never an error, until
        assert set(statuses[first:]) == {401}, Counter(statuses[first:])  # refused, and stays refused
        return self.answers[first][0]

    def stop(self):
        self.stopped.set()
        self.thread.join(30)


def warm_on(base, token):
    """Two relayed calls through `base`: its session view and identity cache now hold the
    session. Returns the upstream access token the backend saw."""
    for _ in range(2):
        answer = relayed(base, token)
        assert answer.status_code == 200, answer.text
    upstream_token = answer.json()["headers"]["authorization"].removeprefix("Bearer ")
    assert not upstream_token.startswith("gha_")
    return upstream_token


def introspect(upstream, token):
    return requests.post(upstream["url"] + "/o/introspect/", data={"token": token}, timeout=10,
                         auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"])).json()


def refresh_at_upstream(upstream, refresh_token):
    return requests.post(upstream["url"] + "/o/token/", data={"grant_type": "refresh_token", "refresh_token": refresh_token},
                         auth=("gatehouse-legacy", upstream["env"]["UPSTREAM_SECRET_LEGACY"]), timeout=10)


def admin(cluster, *arguments):
    """`gatehouse sessions …` with cluster-0.yaml; its output is kept in cluster-admin.log."""
    done = subprocess.run([str(cluster["binary"]), "sessions", *arguments, "--config", str(cluster["configs"][0])],
                          capture_output=True, text=True, timeout=60, env=cluster["env"])
    with open(cluster["admin_log"], "a") as log:
        log.write(f"$ gatehouse sessions {' '.join(arguments)}\n{done.stdout}{done.stderr}")
    return done


def test_refresh_storm_across_two_instances_makes_one_upstream_refresh(cluster, seen):
    # Sign in through instance A; a sealed session lands in PostgreSQL.
    _, pair, session = sealed_sign_in(cluster, seen)
    access = pair["access_token"]
    # The session's upstream access token has expired (as if an hour had passed).
    query_database(cluster, f"UPDATE sessions SET upstream_expires_at = 0 WHERE id = '{session}'")
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
    version, expires = query_database(cluster, f"SELECT version, upstream_expires_at FROM sessions WHERE id = '{session}'").split("|")
    assert int(version) == 2 and int(expires) > 0  # the stored tokens are the refreshed ones


def test_passthrough_refreshes_on_both_instances_make_one_upstream_refresh(cluster, seen):
    app = App({"url": cluster["urls"][0]}, seen, client_id="com.example.passthrough")
    answer = app.redeem(app.sign_in()["code"])
    assert answer.status_code == 200, answer.text
    pair = answer.json()
    assert not pair["refresh_token"].startswith("ghr_")
    proxy = cluster["proxy"]
    before = proxy.counts()
    barrier = threading.Barrier(50)

    def refresh(index):  # 25 to each instance
        barrier.wait(timeout=30)
        return requests.post(cluster["urls"][index % 2] + "/oauth/token", timeout=60, data={
            "grant_type": "refresh_token", "refresh_token": pair["refresh_token"], "client_id": "com.example.passthrough"})

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(refresh, range(50)))
    for answer in answers:
        if answer.status_code == 200:
            seen.add(answer.json()["access_token"], answer.json()["refresh_token"], kind="upstream token (passthrough)")
    statuses = Counter(answer.status_code for answer in answers)
    assert statuses == {200: 50}, (statuses, next((a.text for a in answers if a.status_code != 200), ""))
    pairs = {(answer.json()["access_token"], answer.json()["refresh_token"]) for answer in answers}
    assert len(pairs) == 1, f"{len(pairs)} different pairs"
    counted = {key: value - before[key] for key, value in proxy.counts().items()}
    assert counted["refreshes"] == 1 and counted["succeeded"] == 1, counted
    ((access, refresh_token),) = pairs
    assert proxy.pair_for_access_token(access)["refresh_token"] == refresh_token  # the upstream's own pair
    # The new refresh token works once more, on the other instance.
    again = requests.post(cluster["urls"][1] + "/oauth/token", timeout=30, data={
        "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": "com.example.passthrough"})
    assert again.status_code == 200, again.text
    seen.add(again.json()["access_token"], again.json()["refresh_token"], kind="upstream token (passthrough)")
    assert proxy.counts()["refreshes"] - before["refreshes"] == 2


@pytest.mark.parametrize("presented", ["access_token", "refresh_token"])
def test_a_revocation_on_one_instance_stops_the_session_on_the_other_within_a_second(cluster, upstream, seen, presented):
    """B holds the session's view and its upstream token's identity (two relayed calls). While
    B is polled every 10 ms, the app revokes its access or refresh token on A: B refuses the
    session within a second of A's answer (LISTEN/NOTIFY, not the 10-second view), and the
    upstream token B had cached as live too."""
    a, b = cluster["urls"]
    _, pair, _ = sealed_sign_in(cluster, seen)
    upstream_token = warm_on(b, pair["access_token"])
    seen.add(upstream_token, kind="upstream access token of a sealed session")
    assert relayed(b, upstream_token).status_code == 200  # the upstream token itself: B has its identity cached

    def revoke():
        revoked = requests.post(a + "/oauth/revoke", data={"token": pair[presented], "client_id": "com.example.app"}, timeout=30)
        assert revoked.status_code == 200

    from_start, from_answer, answered = Poller(b, pair["access_token"]).measure(revoke)
    print(f"\nPOST /oauth/revoke ({presented}) on A: instance B refused the session {from_start * 1000:.0f} ms after the "
          f"revocation was sent, {from_answer * 1000:.0f} ms after A answered")
    assert from_answer < 1.0
    # B had the session's upstream token cached as live (above): that entry is gone too.
    upstream_latency, _ = refused_after(b, upstream_token, since=answered, what="the session's upstream token")
    print(f"instance B refused the session's upstream token {upstream_latency * 1000:.0f} ms after A answered "
          f"(polled once B refused the session)")
    assert upstream_latency < 1.0  # B's identity cache entry was dropped too
    assert introspect(upstream, upstream_token)["active"] is False


@pytest.mark.parametrize("polled", ["A", "B"])
def test_a_revoked_sessions_upstream_token_in_use_during_the_revocation_is_not_cached_as_live(cluster, upstream, seen, polled):
    """The session's upstream token is in use on an instance (A itself, or B) while A revokes
    the session, and the upstream takes its time to revoke the token (the revocation proxy holds
    it until that instance has answered a few more requests). Once A has answered, the token
    must stop working there within a second: an identity cache entry dropped before the upstream
    revoked the token, then filled again by a request in between, must not outlive the revocation."""
    a, b = cluster["urls"]
    base = a if polled == "A" else b
    _, pair, _ = sealed_sign_in(cluster, seen)
    upstream_token = warm_on(base, pair["access_token"])
    seen.add(upstream_token, kind="upstream access token of a sealed session")
    revocations = cluster["revocation_proxy"]
    poller = Poller(base, upstream_token)

    def revoke():
        before = revocations.counts()["calls"]
        revocations.pause()
        outcome = {}
        caller = threading.Thread(target=lambda: outcome.update(answer=requests.post(
            a + "/oauth/revoke", data={"token": pair["refresh_token"], "client_id": "com.example.app"}, timeout=60)))
        try:
            caller.start()
            revocations.wait_until(lambda: revocations.calls > before, 30, "the upstream revocation")
            # The store has revoked the session; the upstream has not yet revoked the token.
            seen_so_far = len(poller.answers)
            poller.wait(lambda answers: len(answers) >= seen_so_far + 3, 10, "three answers while the upstream revokes")
        finally:
            revocations.resume()
            caller.join(60)
        assert outcome["answer"].status_code == 200
        assert introspect(upstream, upstream_token)["active"] is False  # the upstream has revoked it

    _, from_answer, _ = poller.measure(revoke)
    print(f"\ninstance {polled}, using the session's upstream token while A revoked the session, refused it "
          f"{from_answer * 1000:.0f} ms after A answered")
    assert from_answer < 1.0


def test_admin_commands_list_and_revoke_a_session_in_postgres_and_upstream(cluster, upstream, seen):
    a, b = cluster["urls"]
    app, pair, session = sealed_sign_in(cluster, seen)
    upstream_token = warm_on(b, pair["access_token"])
    seen.add(upstream_token, kind="upstream access token of a sealed session")
    upstream_pair = cluster["proxy"].pair_for_access_token(upstream_token)
    assert upstream_pair is not None, "the proxy saw the upstream pair of the session"
    listed = admin(cluster, "list", "--subject", "alice")
    assert listed.returncode == 0, listed.stderr
    (line,) = [line for line in listed.stdout.splitlines() if line.startswith(session[:12])]
    assert "com.example.app" in line and "alice" in line and line.endswith("live"), line

    def revoke():
        revoked = admin(cluster, "revoke", "--session", session[:12])
        assert revoked.returncode == 0, revoked.stderr
        assert "revoked 1 session(s)" in revoked.stdout, revoked.stdout

    from_start, from_exit, _ = Poller(b, pair["access_token"]).measure(revoke)
    print(f"\n`gatehouse sessions revoke --session`: instance B refused the session {from_start * 1000:.0f} ms after the "
          f"command started, {from_exit * 1000:.0f} ms after it exited")
    assert from_exit < 1.0
    assert query_database(cluster, f"SELECT revoked_at IS NOT NULL FROM sessions WHERE id = '{session}'") == "t"
    assert relayed(a, pair["access_token"]).status_code == 401
    assert app.refresh(pair["refresh_token"]).json()["error"] == "invalid_grant"
    listed = admin(cluster, "list", "--subject", "alice")
    assert [line for line in listed.stdout.splitlines() if line.startswith(session[:12])][0].endswith("revoked")
    # The upstream refresh token was revoked at the upstream (RFC 7009), its access token with it.
    assert introspect(upstream, upstream_token)["active"] is False
    spent = refresh_at_upstream(upstream, upstream_pair["refresh_token"])
    assert spent.status_code == 400 and spent.json()["error"] == "invalid_grant", spent.text


def test_admin_command_revokes_every_session_of_a_subject_in_postgres(cluster, seen):
    b = cluster["urls"][1]
    eve = [sealed_sign_in(cluster, seen, username="eve") for _ in range(2)]
    _, alice_pair, alice_session = sealed_sign_in(cluster, seen)
    for _, pair, _ in eve:
        warm_on(b, pair["access_token"])
    listed = admin(cluster, "list", "--subject", "eve")
    assert listed.returncode == 0, listed.stderr
    assert {session[:12] for _, _, session in eve} <= {line[:12] for line in listed.stdout.splitlines()}
    assert alice_session[:12] not in listed.stdout
    revoked = admin(cluster, "revoke", "--subject", "eve")
    revoked_at = time.monotonic()
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked 2 session(s)" in revoked.stdout, revoked.stdout
    for _, pair, _ in eve:
        latency, _ = refused_after(b, pair["access_token"], since=revoked_at)
        assert latency < 1.0
    for app, pair, _ in eve:
        assert app.refresh(pair["refresh_token"]).json()["error"] == "invalid_grant"
    # Alice's session is untouched.
    assert relayed(b, alice_pair["access_token"]).status_code == 200
    assert query_database(cluster, f"SELECT revoked_at IS NULL FROM sessions WHERE id = '{alice_session}'") == "t"


def test_upstream_errors_on_refresh_are_503_and_invalid_grant_ends_the_session(cluster, seen):
    url = cluster["urls"][0] + "/api/storm/x"
    proxy = cluster["proxy"]
    try:
        # A 500 may have spent the single-use refresh token: not retried. A 503 provably did not: retried twice.
        for status, calls in ((500, 1), (503, 3)):
            _, pair, session = sealed_sign_in(cluster, seen)
            # No relayed call before: an instance keeps a session's view for a while.
            query_database(cluster, f"UPDATE sessions SET upstream_expires_at = 0 WHERE id = '{session}'")
            proxy.fault = (status, b'{"error": "server_error"}')
            before = proxy.counts()
            failing = requests.get(url, headers=bearer(pair["access_token"]), timeout=30)
            assert failing.status_code == 503 and int(failing.headers["Retry-After"]) > 0, failing.text
            assert proxy.counts()["refreshes"] - before["refreshes"] == calls, status
            assert query_database(cluster, f"SELECT revoked_at IS NULL AND upstream_expires_at = 0 FROM sessions "
                                           f"WHERE id = '{session}'") == "t"
        proxy.fault = (400, b'{"error": "invalid_grant"}')
        ended = requests.get(url, headers=bearer(pair["access_token"]), timeout=30)
        assert ended.status_code == 401
        assert "sign_in" in ended.json()
        assert query_database(cluster, f"SELECT revoked_at IS NOT NULL FROM sessions WHERE id = '{session}'") == "t"
    finally:
        proxy.fault = None


def test_waiting_for_another_instances_refresh_gives_up_after_ten_seconds(cluster, seen):
    """Another instance holds the session's refresh lease (written here as it would write it)
    for a minute: a request that needs the refresh waits 10 s for its result, then answers a
    clean 503 without refreshing itself; once the lease is free, the session works."""
    _, pair, session = sealed_sign_in(cluster, seen, client_id="com.example.short")
    lease_until = int((time.time() + 60) * 1000)
    query_database(cluster, f"UPDATE sessions SET upstream_expires_at = 0, lease_owner = 'another-instance', "
                            f"lease_until = {lease_until} WHERE id = '{session}'")
    proxy = cluster["short_proxy"]
    before = proxy.counts()
    waited = relayed(cluster["urls"][0], pair["access_token"], "/api/short/x")
    assert waited.status_code == 503, waited.text
    assert int(waited.headers["Retry-After"]) > 0
    assert waited.headers["Content-Type"].startswith("application/problem+json")
    assert 9.0 <= waited.elapsed.total_seconds() < 13, waited.elapsed
    assert proxy.counts()["refreshes"] == before["refreshes"]
    query_database(cluster, f"UPDATE sessions SET lease_owner = NULL, lease_until = NULL WHERE id = '{session}'")
    after = relayed(cluster["urls"][0], pair["access_token"], "/api/short/x")
    assert after.status_code == 200, after.text
    assert proxy.counts()["succeeded"] - before["succeeded"] == 1


def test_an_instance_killed_while_holding_the_refresh_lease_loses_no_session(cluster, seen):
    """Instance A takes the lease of a session whose upstream token has expired and is killed
    (-9) while its refresh is held at the upstream (never forwarded). Instance B waits for the
    lease to expire (3 × the upstream's 1 s timeout + 2 s), then refreshes once."""
    survivor, victim_url = cluster["urls"]
    victim = cluster["processes"][1]
    proxy = cluster["short_proxy"]
    path = "/api/short/x"
    _, pair, session = sealed_sign_in(cluster, seen, instance=1, client_id="com.example.short")
    query_database(cluster, f"UPDATE sessions SET upstream_expires_at = 0 WHERE id = '{session}'")
    before = proxy.counts()
    proxy.hold(1)
    doomed = {}

    def call_the_victim():
        try:
            doomed["answer"] = relayed(victim_url, pair["access_token"], path)
        except requests.RequestException as error:  # its connection dies with it: expected, counted nowhere
            doomed["error"] = error

    caller = threading.Thread(target=call_the_victim)
    caller.start()
    proxy.wait_held(before["held"] + 1, timeout=30)
    held_wall = time.time()
    owner, lease_until = query_database(cluster, f"SELECT lease_owner, lease_until FROM sessions WHERE id = '{session}'").split("|")
    assert owner and lease_until, "instance A holds the lease"
    victim.kill()
    victim.wait(10)
    killed = time.monotonic()
    caller.join(30)
    lease_seconds = int(lease_until) / 1000 - held_wall
    assert 3.5 <= lease_seconds <= 6.5, f"the lease runs {lease_seconds:.1f} s (3 × 1 s + 2 s expected)"

    threads = 8
    barrier = threading.Barrier(threads)
    results = [[] for _ in range(threads)]

    def client(index):
        successes = 0
        with requests.Session() as session_:
            barrier.wait(timeout=30)
            end = time.monotonic() + 40
            while successes < 3 and time.monotonic() < end:
                started = time.monotonic()
                try:
                    answer = relayed(survivor, pair["access_token"], path, session_)
                except requests.RequestException as error:
                    results[index].append({"status": type(error).__name__, "started": started, "seconds": time.monotonic() - started})
                    continue
                results[index].append({"status": answer.status_code, "retry_after": answer.headers.get("Retry-After"),
                                       "type": answer.headers.get("Content-Type", ""), "started": started,
                                       "ended": time.monotonic(), "seconds": time.monotonic() - started})
                if answer.status_code == 200:
                    successes += 1
                    seen.add(answer.json()["headers"]["authorization"].removeprefix("Bearer "),
                             kind="upstream access token of a sealed session")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(client, range(threads)))
    every = [result for thread in results for result in thread]
    statuses = Counter(result["status"] for result in every)
    unclean = [r for r in every if r["status"] != 200 and not (
        r["status"] == 503 and (r.get("retry_after") or "").isdigit() and int(r["retry_after"]) > 0
        and r["type"].startswith("application/problem+json"))]
    first_success = min(r["ended"] for r in every if r["status"] == 200) - killed if statuses[200] else float("nan")
    forwarded = [event for event in proxy.refresh_events if event["outcome"].startswith("forwarded")]
    print(f"\nlease {lease_seconds:.1f} s; instance B answered {dict(statuses)}; first 200 {first_success:.1f} s after "
          f"the kill; longest request {max(r['seconds'] for r in every):.1f} s; refresh grants {proxy.counts()}")
    assert unclean == [], unclean[:5]
    assert all(any(r["status"] == 200 for r in thread) for thread in results), statuses
    assert max(r["seconds"] for r in every) < 12  # a wait for another instance's refresh gives up after 10 s
    counted = {key: value - before[key] for key, value in proxy.counts().items()}
    assert counted["held"] == 1 and counted["forwarded"] == 1 and counted["succeeded"] == 1, counted
    # B refreshed only once A's lease had run out.
    assert forwarded[-1]["wall"] >= int(lease_until) / 1000 - 0.05
    after = relayed(survivor, pair["access_token"], path)
    assert after.status_code == 200, after.text
    assert query_database(cluster, f"SELECT version, revoked_at IS NULL FROM sessions WHERE id = '{session}'") == "2|t"


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


def test_postgres_outage_answers_503_quickly_and_loses_no_session(own_postgres, workdir, upstream, relay_doubles, gatehouse, seen):
    host, port = own_postgres["address"].split(":")
    gh_port = free_port()
    config = workdir / "outage.yaml"
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
    log = open(workdir / "outage.log", "w")
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
        # A sign-out the store cannot record is not answered 200 (the app would believe it signed out).
        signed_out = requests.post(f"http://127.0.0.1:{gh_port}/oauth/revoke", data={"token": pair["refresh_token"], "client_id": "com.example.app"}, timeout=10)
        assert signed_out.status_code == 503, signed_out.text
        assert signed_out.json()["error"] == "server_error" and int(signed_out.headers["Retry-After"]) > 0
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
        log.close()


def test_postgres_holds_no_token_or_secret_in_plain_text(cluster, seen):
    """Every column of every row of every table, bytea decoded, holds none of the run's secrets
    (what the tests saw and what the upstream recorded: the upstream tokens of sealed sessions,
    passthrough tokens, codes, verifiers, client secrets, session keys), in any of the forms
    `seen.find` searches (as is, hex, base64, decoded), nor a Gatehouse token prefix."""
    app = App({"url": cluster["urls"][0]}, seen)  # instance 1 was killed by the test before
    assert app.redeem(app.sign_in()["code"]).status_code == 200
    tables = query_database(cluster, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1").split()
    assert {"sessions", "access_tokens", "refresh_tokens", "issued_codes", "authorization_transactions"} <= set(tables)
    leaks, blobs = [], 0
    for table in tables:
        for line in query_database(cluster, f'SELECT row_to_json(t)::text FROM "{table}" t').splitlines():
            for column, value in json.loads(line).items():
                if not isinstance(value, str):
                    continue
                # row_to_json writes bytea as "\\x<hex>": search the bytes the column holds, and the text.
                cells = [value.encode()]
                if value.startswith("\\x"):
                    cells.append(bytes.fromhex(value[2:]))
                    blobs += 1
                for cell in cells:
                    assert b"gha_" not in cell and b"ghr_" not in cell, f"{table}.{column} holds a Gatehouse token"
                    leaks += [f"{table}.{column}: {kind} ({form})" for kind, form in seen.find(cell)]
    assert blobs >= int(query_database(cluster, "SELECT count(*) FROM sessions"))  # the bytea columns were read, decoded
    assert seen.harvest() > 50
    assert sorted(set(leaks)) == []
