"""Two Gatehouse instances through a real PostgreSQL failover (Tests/Support/pgha.py: Patroni
with etcd and HAProxy over two PostgreSQL servers), under load (Tests/Support/failover.py):
40 sealed sessions refreshing on both instances, relayed calls, sign-outs just before and
during the failover. One instance reaches the database through HAProxy (`host`), the other
through `store.postgres.hosts` naming both servers (no proxy).

Per replication mode, a planned switchover and then an unplanned failover (the primary's Patroni
and PostgreSQL killed with SIGKILL), each with its own 40 sessions:
- synchronous (Patroni's `synchronous_mode`): no session lost, no sign-out undone, no spent
  refresh token accepted again; every answer in between a 503 with Retry-After, never a 500;
- asynchronous: the same figures measured and printed (a promoted standby may miss the last
  commits; on loopback it rarely does), never a 500.

The figures are written to WORKDIR/failover-MODE.json and printed; Benchmarks/run --only failover
measures the same with a release build.
"""

import json
import os
from pathlib import Path

import pytest

from sandbox.nativeapp import App, free_port, pump, wait_for_line

from pgha import PatroniStack
from failover import FailoverPhase


@pytest.fixture(params=["synchronous", "asynchronous"])
def stack(request, workdir):
    with PatroniStack(workdir / f"pgha-{request.param}", synchronous=request.param == "synchronous") as running:
        yield request.param, running


def start_gatehouses(stack, workdir, upstream, relay_doubles, gatehouse, mode):
    import subprocess
    proxy_host, proxy_port = stack.proxy.split(":")
    stores = [f"host: {proxy_host}\n    port: {proxy_port}",
              "hosts: [" + ", ".join(f'"{h}"' for h in stack.hosts) + "]"]
    processes, urls = [], []
    for index, store in enumerate(stores):
        port = free_port()
        config = workdir / f"failover-{mode}-{index}.yaml"
        config.write_text(f"""
server:
  public_base_url: http://127.0.0.1:{port}
  host: 127.0.0.1
  port: {port}
store:
  postgres:
    {store}
    database: gatehouse
    username: gatehouse
    pool_size: 8
upstreams:
  - name: legacy
    authorization_endpoint: {upstream["url"]}/o/authorize/
    token_endpoint: {upstream["url"]}/o/token/
    revocation_endpoint: {upstream["url"]}/o/revoke_token/
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]
    identity:
      kind: introspection
      url: {upstream["url"]}/o/introspect/
      subject: /username
sessions:
  encryption_keys_file: {workdir / "session-keys"}
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
""")
        log = open(workdir / f"failover-{mode}-{index}.log", "w")
        process = subprocess.Popen([str(gatehouse["binary"]), "serve", "--config", str(config), "--log-level", "info"],
                                   stdout=log, stderr=subprocess.PIPE, text=True, env=upstream["env"])
        log.write(wait_for_line(process.stderr, "gatehouse is ready", 60, f"Gatehouse instance {index} on the Patroni stack"))
        log.flush()
        pump(process.stderr, log)
        processes.append(process)
        urls.append(f"http://127.0.0.1:{port}")
    return processes, urls


def stop_gatehouses(processes):
    """SIGTERM to every instance, then each one's exit status (None: still running after 40 s,
    then killed)."""
    import subprocess
    for process in processes:
        process.terminate()
    statuses = []
    for process in processes:
        try:
            statuses.append(process.wait(40))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            statuses.append(None)
    return statuses


def test_two_instances_through_a_switchover_and_a_failover(stack, workdir, upstream, relay_doubles, gatehouse, seen):
    mode, patroni = stack
    processes, urls = start_gatehouses(patroni, workdir, upstream, relay_doubles, gatehouse, mode)

    def sign_in(instance):
        app = App({"url": urls[instance]}, seen)
        answer = app.redeem(app.sign_in()["code"])
        assert answer.status_code == 200, answer.text
        return app, answer.json()

    results = {}
    try:
        patroni.wait_replica_streaming(60)
        switchover = FailoverPhase(urls, sign_in)
        switchover.prepare(40)
        results["switchover"] = switchover.run(event=lambda: patroni.switchover())

        patroni.wait_replica_streaming(90)
        failover = FailoverPhase(urls, sign_in)
        failover.prepare(40)

        def kill():
            killed = patroni.kill_primary()
            patroni.wait_primary(90, not_=killed)

        results["failover"] = failover.run(event=kill)
    finally:
        stopped = stop_gatehouses(processes)
    results["exit_statuses"] = stopped
    (workdir / f"failover-{mode}.json").write_text(json.dumps(results, indent=2))
    if os.environ.get("FAILOVER_FIGURES"):  # Benchmarks/run --only failover reads them from there
        Path(os.environ["FAILOVER_FIGURES"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["FAILOVER_FIGURES"]) / f"failover-{mode}.json").write_text(json.dumps(results, indent=2))
    print(f"\n{mode}: {json.dumps(results, indent=1)}")
    # After a failover, SIGTERM still stops every instance: within its shutdown_timeout (25 s) and
    # the 5 s its services have to end once cancelled.
    assert None not in stopped, f"an instance still ran 40 s after SIGTERM: {stopped} (logs: {workdir}/failover-{mode}-*.log)"

    for phase, figures in ((phase, results[phase]) for phase in ("switchover", "failover")):
        assert figures["unexpected"] == {}, (phase, figures)
        if mode == "synchronous":
            assert (phase, figures["sessions_lost"], figures["revocations_undone"], figures["replays_accepted"]) == (phase, 0, 0, 0), figures
        assert figures["revocations"] == 4
        assert figures["replays_checked"] >= 30, figures
        # Every instance answered again: each kind's first success after the event is recorded.
        assert all(entry["first_success_s"] is not None for entry in figures["recovery"].values()), figures
