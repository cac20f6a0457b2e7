"""A Gatehouse of its own in front of a django-oauth-toolkit of its own, for the suites of
trusted app instances (issue 13): test_instances, test_dpop, test_session_codes. The upstream is
`legacy` (oauth2, introspection identity); the caller gives the `clients:` entries, the routes and
any other top-level sections. Routes relay to one EchoBackend (what a backend received)."""

import os
import secrets
import subprocess
from contextlib import ExitStack, contextmanager

import pytest

from sandbox.backends import EchoBackend
from sandbox.nativeapp import free_port
from processes import run_gatehouse, run_upstream, session_keys
from sandbox.gatehouse import server_and_store


@contextmanager
def trusted_gatehouse(workdir, seen, name, clients, routes="", extra="", store=None, replicas=1, default_limits=False):
    """Yields run_gatehouse's dict plus "url", "env", "database" and "backend". `routes` may use
    {backend} for the EchoBackend's URL. `store`: the YAML of a `postgres:` mapping instead of a
    SQLite file; `replicas` > 1 starts more instances on that store, all with the first one's
    `public_base_url` (as behind a load balancer), listed in "replicas" (each with its "url").
    `default_limits`: keep the per-address limits that are on by default (run_gatehouse).
    Also yields "text" (the configuration as written) and "relaunch" (a function that starts
    another Gatehouse on the same configuration and store, as a context manager)."""
    port = free_port()
    backend = EchoBackend()
    with run_upstream(workdir, f"upstream-{name}", seen, [f"http://127.0.0.1:{port}/oauth/callback"]) as up:
        config = server_and_store(port, store or f"{workdir}/{name}.sqlite") + f"""
upstreams:
  - name: legacy
    kind: oauth2
    authorization_endpoint: {up["url"]}/o/authorize/
    token_endpoint: {up["url"]}/o/token/
    revocation_endpoint: {up["url"]}/o/revoke_token/
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    scopes: [read, write]
    identity:
      kind: introspection
      url: {up["url"]}/o/introspect/
clients:{clients}
{("routes:" + routes.replace("{backend}", backend.url)) if routes else ""}
sessions:
  encryption_keys_file: {session_keys(workdir, f"{name}-session-keys", seen)}
{extra}
"""
        with ExitStack() as stack:
            process = stack.enter_context(run_gatehouse(workdir, name, config, up["env"], default_limits=default_limits))

            def relaunch(suffix, text=None):
                return run_gatehouse(workdir, f"{name}-{suffix}", text or config, up["env"], default_limits=default_limits)

            replicas_running = []
            for index in range(1, replicas):
                replica_port = free_port()
                replica = config.replace(f"  host: 127.0.0.1\n  port: {port}\n", f"  host: 127.0.0.1\n  port: {replica_port}\n")
                running = stack.enter_context(run_gatehouse(workdir, f"{name}-{index}", replica, up["env"]))
                replicas_running.append({**running, "url": f"http://127.0.0.1:{replica_port}"})
            yield {**process, "url": f"http://127.0.0.1:{port}", "env": up["env"], "database": workdir / f"{name}.sqlite",
                   "backend": backend, "replicas": replicas_running, "text": config, "relaunch": relaunch,
                   "upstream_url": up["url"]}


def postgres_store(prefix):
    """The `store:` YAML of a database of its own (named `prefix` and a random part) on the
    suite's PostgreSQL, for `trusted_gatehouse(store=…)`; skips the test without one."""
    if "GATEHOUSE_TEST_POSTGRES" not in os.environ:
        pytest.skip("needs GATEHOUSE_TEST_POSTGRES (scripts/test starts PostgreSQL)")
    host, port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    database = f"{prefix}_{secrets.token_hex(4)}"
    subprocess.run(["psql", "-h", host, "-p", port, "-U", "gatehouse", "-d", "gatehouse", "-tAc", f"CREATE DATABASE {database}"],
                   capture_output=True, check=True, timeout=30)
    return f"  postgres: {{host: {host}, port: {port}, database: {database}, username: gatehouse}}"
