"""A pass-through proxy in front of an authorization server's endpoint, which counts what
Gatehouse sends it and can misbehave on command; and the processes the refresh tests start
around it (a django-oauth-toolkit of their own, a Gatehouse of their own).

The proxy forwards every POST to one target URL (a token, revocation or introspection
endpoint) and answers with what the target answered. It can instead:

- answer refresh grants with a fixed fault (`fault = (status, JSON bytes)`);
- *hold* the next N refresh grants (`hold(N)`): such a request is read, counted, never
  forwarded and never answered, until `release_held()` (or `stop()`) closes its connection
  without an answer. That is an upstream that stalls longer than any timeout, and, for the
  request that was held, an upstream that never saw it. `wait_held(n)` waits until n are held;
- *pause* forwarding (`pause()`, `resume()`): every request that would be forwarded waits
  until the test resumes, then goes on (an upstream that answers as late as a test needs).

Everything is counted under one lock (`calls`, `refreshes`, `forwarded_refreshes`,
`successful_refreshes`, `held_count`) and every refresh grant is kept in `refresh_events`
(monotonic and wall-clock time, outcome), so a test can ask how many refreshes reached the real upstream and
when. Every token the target answered goes into the suite's `seen` secrets.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the sandbox package

from gatelog import LogFollower  # noqa: E402
from nativeapp import wait_for_line  # noqa: E402
from stubserver import StubHandler, StubServer  # noqa: E402
from sandbox.secretsrecord import stop  # noqa: E402


class CountingTokenProxy(StubServer):
    """Forwards POSTs to `target`, counting refresh grants; can fault or hold them."""

    def __init__(self, target, seen=None):
        self.target = target
        self.seen = seen
        self.fault = None  # None: forward; or (status, JSON body) to answer refresh grants with
        self.calls = 0  # every POST received
        self.refreshes = 0  # refresh grants received (held, faulted or forwarded)
        self.forwarded_refreshes = 0  # refresh grants forwarded to the target
        self.successful_refreshes = 0  # forwarded refresh grants the target answered 200
        self.held_count = 0  # refresh grants held so far
        self.refresh_events = []  # {"at": monotonic, "wall": epoch seconds, "outcome": "held" | "fault 500" | "forwarded 200" …}
        self.responses = []  # token responses (JSON objects) the target answered 200
        self._to_hold = 0
        self._release = threading.Event()
        self._gate = threading.Event()  # cleared by pause(): requests to forward wait for resume()
        self._gate.set()
        self._session = threading.local()
        proxy = self

        class Handler(StubHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.read_body()
                form = parse_qs(body.decode(errors="replace"))
                refresh = form.get("grant_type") == ["refresh_token"]
                if proxy.seen is not None:
                    proxy.seen.add(*(form.get("refresh_token", []) + form.get("token", []) + form.get("code", [])),
                                   kind="token presented to the upstream (counting proxy)")
                with proxy.condition:
                    proxy.calls += 1
                    action = "forward"
                    if refresh:
                        proxy.refreshes += 1
                        if proxy._to_hold > 0:
                            proxy._to_hold -= 1
                            proxy.held_count += 1
                            action = "hold"
                        elif proxy.fault:
                            action = "fault"
                        else:
                            proxy.forwarded_refreshes += 1
                        event = {"at": time.monotonic(), "wall": time.time(), "outcome": {"hold": "held", "forward": "forwarded"}.get(action, "fault")}
                        proxy.refresh_events.append(event)
                    proxy.condition.notify_all()
                if action == "hold":
                    proxy._release.wait()  # never forwarded, never answered
                    self.close_connection = True
                    return
                if action == "forward" and not proxy._gate.is_set():
                    proxy._gate.wait(30)  # paused: forwarded once resumed
                if action == "fault":
                    status, payload = proxy.fault
                    event["outcome"] = f"fault {status}"
                    return self.reply(status, payload, "application/json")
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
                try:
                    answer = proxy.http().post(proxy.target, data=body, headers=headers, timeout=30)
                except requests.RequestException:
                    self.close_connection = True
                    return
                if answer.status_code == 200 and answer.headers.get("Content-Type", "").startswith("application/json"):
                    try:
                        tokens = answer.json()
                    except ValueError:
                        tokens = None
                    if isinstance(tokens, dict):
                        if proxy.seen is not None:
                            proxy.seen.add(tokens.get("access_token"), tokens.get("refresh_token"), tokens.get("id_token"),
                                           kind="token issued by the upstream (counting proxy)")
                        with proxy.condition:
                            if "access_token" in tokens:
                                proxy.responses.append(tokens)
                            if refresh:
                                proxy.successful_refreshes += 1
                if refresh:
                    with proxy.condition:
                        event["outcome"] = f"forwarded {answer.status_code}"
                        proxy.condition.notify_all()
                self.reply(answer.status_code, answer.content, answer.headers.get("Content-Type", "application/json"))

        super().__init__(Handler, path="/token")  # counted under self.condition, StubServer's

    def http(self):
        """A keep-alive session per proxy thread toward the target."""
        if not hasattr(self._session, "value"):
            self._session.value = requests.Session()
        return self._session.value

    def hold(self, count=1):
        """Hold the next `count` refresh grants (never forwarded, never answered)."""
        with self.condition:
            self._release.clear()
            self._to_hold = count

    def wait_held(self, count, timeout=30.0):
        """Waits until `count` refresh grants have been held in all; AssertionError after `timeout`."""
        self.wait_until(lambda: self.held_count >= count, timeout, f"{count} held refresh grant(s)")

    def wait_until(self, predicate, timeout, what):
        self.wait_received(lambda _: predicate(), timeout, f"the proxy did not see {what} within {timeout}s")

    def pause(self):
        """Requests that would be forwarded wait (at most 30 s) until `resume()`, then go on:
        an upstream that takes as long as the test needs to act meanwhile."""
        self._gate.clear()

    def resume(self):
        self._gate.set()

    def release_held(self):
        """Closes every held request's connection, still without an answer; stops holding."""
        with self.condition:
            self._to_hold = 0
        self._release.set()

    def counts(self):
        with self.condition:
            return {"calls": self.calls, "refreshes": self.refreshes, "forwarded": self.forwarded_refreshes,
                    "succeeded": self.successful_refreshes, "held": self.held_count}

    def while_holding(self, count, action):
        """Runs `action()` while the next `count` refreshes are held (read, never forwarded, never
        answered); returns its result and what this proxy counted meanwhile."""
        before = self.counts()
        self.hold(count)
        try:
            result = action()
            after = self.counts()
        finally:
            self.release_held()
        return result, {key: after[key] - before[key] for key in after}

    def pair_for_access_token(self, access_token):
        """The token response (as the target answered it) that carried `access_token`."""
        with self.condition:
            return next((tokens for tokens in self.responses if tokens.get("access_token") == access_token), None)

    def stop(self):
        self.resume()
        self.release_held()
        super().stop()


@contextmanager
def run_upstream(workdir, name, seen, callbacks, access_token_expire_seconds=3600, users=None, **options):
    """A django-oauth-toolkit of its own (Tests/Upstream/serve.py), with the `gatehouse-legacy`
    application (no PKCE, refresh rotation, grace 0) whose secret is in `env`."""
    from nativeapp import APP_REDIRECT, PASSWORD, USERNAME
    import secrets as random
    env = dict(os.environ, UPSTREAM_SECRET_LEGACY=random.token_urlsafe(24))
    seen.add(env["UPSTREAM_SECRET_LEGACY"], kind="upstream client secret")
    config = {
        "users": users or [{"username": USERNAME, "password": PASSWORD, "email": "alice@example.test"}],
        "applications": [{"client_id": "gatehouse-legacy", "client_secret_env": "UPSTREAM_SECRET_LEGACY",
                          "redirect_uris": [*callbacks, APP_REDIRECT], "pkce_required": False}],
        "access_token_expire_seconds": access_token_expire_seconds,
        "rotate_refresh_token": True,
        "refresh_token_grace_period_seconds": 0,
        "allowed_redirect_uri_schemes": ["http", "https", "com.example.app"],
        **options,
    }
    config_path = workdir / f"{name}.json"
    config_path.write_text(json.dumps(config))
    log = open(workdir / f"{name}.log", "w")
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "Tests/Upstream/serve.py"), "--config", str(config_path), "--port", "0", "--quiet"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        line = wait_for_line(process.stdout, r'"ready"', 60, f"the upstream authorization server {name}")
        yield {"url": json.loads(line)["url"], "env": env}
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def gatehouse_binary():
    binary = Path(os.environ.get("GATEHOUSE_BIN", ROOT / ".build/debug/gatehouse"))
    if not binary.exists():
        raise RuntimeError(f"{binary} does not exist: build it first (swift build)")
    return binary


def session_keys(workdir, name, seen):
    """A session key ring file WORKDIR/NAME (`gatehouse keys generate`, made once), its keys registered
    with `seen` so the secret scans look for them."""
    keys = Path(workdir) / name
    if not keys.exists():
        subprocess.run([str(gatehouse_binary()), "keys", "generate", "--file", str(keys)], check=True, capture_output=True, timeout=30)
    seen.add_key_ring(keys)
    return keys


def server_and_store(port, store):
    """The `server:` and `store:` sections of a Gatehouse on 127.0.0.1:PORT; `store` is a SQLite
    path or the YAML lines of a `postgres:` mapping."""
    store_section = f"  sqlite_path: {store}" if not str(store).lstrip().startswith("postgres:") else str(store)
    return f"""
server:
  public_base_url: http://127.0.0.1:{port}
  host: 127.0.0.1
  port: {port}
store:
{store_section}"""


# Every request of the suite comes from 127.0.0.1, where a deployment's come from many addresses:
# the per-address limits that are on by default (registrations, unknown refresh tokens) would
# count the whole suite as one client. They are turned off unless a test keeps the defaults
# (`default_limits=True`) or sets them itself; test_rate_limits checks the defaults.
SUITE_LIMITS = {"registration_per_address": "off", "registration_per_app": "off", "unknown_refresh_per_address": "off"}


def with_suite_limits(config):
    """`config` with the per-address limits of SUITE_LIMITS off, unless it sets them itself."""
    missing = {key: value for key, value in SUITE_LIMITS.items() if not re.search(rf"^\s+{key}:", config, re.MULTILINE)}
    if not missing:
        return config
    lines = "".join(f"  {key}: {value}\n" for key, value in missing.items())
    if re.search(r"^rate_limits:[ \t]*$", config, re.MULTILINE):
        return re.sub(r"^rate_limits:[ \t]*\n", lambda match: "rate_limits:\n" + lines, config, count=1, flags=re.MULTILINE)
    return config.rstrip("\n") + "\nrate_limits:\n" + lines


@contextmanager
def run_gatehouse(workdir, name, config, env, log_level="debug", args=(), json_logs=False, extra_env=None, ready_timeout=30,
                  default_limits=False):
    """A Gatehouse of its own from the YAML text `config`, written to WORKDIR/NAME.yaml, its
    stderr followed in `lines` and copied to WORKDIR/NAME.log (the suite's log scan reads every
    *.log there; NAME.json.log when `json_logs`, which also passes `--log-format json`).
    Yields {"url", "port", "process", "lines", "config", "log", "name", "binary"} once its ready
    line is out; the process is stopped afterwards unless it has exited already."""
    binary = gatehouse_binary()
    workdir = Path(workdir)
    config_path = workdir / f"{name}.yaml"
    config_path.write_text(config if default_limits else with_suite_limits(config))
    log_path = workdir / (f"{name}.json.log" if json_logs else f"{name}.log")
    command = [str(binary), "serve", "--config", str(config_path), "--log-level", log_level, *args]
    if json_logs:
        command += ["--log-format", "json"]
    port = int(re.search(r"^  port: (\d+)$", config, re.MULTILINE).group(1))
    log = open(log_path, "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.PIPE, text=True, errors="replace",
                               env=dict(env, **(extra_env or {})))
    lines = LogFollower()

    def copy():
        for line in iter(process.stderr.readline, ""):
            log.write(line)
            log.flush()
            lines.feed(line)

    reader = threading.Thread(target=copy, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            try:
                lines.wait_for(r"gatehouse is ready", timeout=0.2)
                break
            except AssertionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    reader.join(2)
                    raise RuntimeError(f"Gatehouse {name} did not become ready (exit status {process.poll()}):\n"
                                       + "\n".join(lines.lines_since(0)[-25:])) from None
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "process": process, "lines": lines,
               "config": config_path, "log": log_path, "name": name, "binary": binary}
    finally:
        if process.poll() is None:
            stop(process)
        reader.join(5)
        log.close()
