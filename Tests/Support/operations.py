"""What the production-surface tests (issue 11: metrics, traces, logs, audit, rate limits,
shutdown and reload) share: Gatehouse processes of their own, their configuration, and two
small doubles no package offers.

    gateway(workdir, name, config, env, …)   a Gatehouse process (context manager):
                                              processes.run_gatehouse, which every suite uses;
                                              its stderr followed (`lines`) and copied to
                                              WORKDIR/NAME.log, so the suite's log scan reads it
    gateway_config(…)                         the YAML of such a Gatehouse: the suite's real
                                              upstream (django-oauth-toolkit) for sign-ins, an
                                              IdentityDouble for relayed tokens, the echo backend
    IdentityDouble                            a personal-information service (JSON) whose tokens
                                              the test registers; holds calls behind a gate and
                                              records the traceparent of each call
    TokenEndpointDouble                       an upstream token endpoint answering 429 (or any
                                              status), counting calls with their times
    UpstreamDouble                            both at one address, on a port that survives
                                              stop() and restart() (an outage)
    relay_sign_in(base, seen, client_id)      a sign-in through a `wiring: relay` client (works on
                                              any port: the upstream sends the browser to the app)
    poll(predicate, timeout, what)            the polling loop every test uses instead of sleeping
    parse_exposition(text)                    Prometheus text → {(name, frozenset(labels)): value}
"""

import json
import re
import secrets
import threading
import time

import pytest
import requests

from sandbox.backends import _Handler, _Server
from sandbox.nativeapp import APP_REDIRECT, App
from processes import run_gatehouse, session_keys

IDENTITY_PATH = "/json/UserManagement/GetPersonalInformation"


# --------------------------------------------------------------------------- polling

def poll(predicate, timeout, what, interval=0.05):
    """Calls `predicate()` until it returns something truthy (returned); AssertionError naming
    `what` (and the last value) after `timeout` seconds. `interval` paces the calls."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")
        time.sleep(interval)  # pacing between polls, not synchronisation


# --------------------------------------------------------------------------- identity double

class _IdentityHandler(_Handler):
    def respond(self):
        service = self.owner
        self.read_body()
        path = self.path.split("?")[0]
        if path != IDENTITY_PATH:
            return self.send_json(404, {"error": "not found"})
        match = re.fullmatch(r"Bearer +(\S+) *", self.headers.get("Authorization", ""), re.IGNORECASE)
        token = match.group(1) if match else None
        with service._lock:
            fields = self.headers.get_all("traceparent") or []
            service.traceparents.append(", ".join(fields) if fields else None)
            known = token in service.tokens
            if known:
                service.known_calls += 1
            else:
                service.unknown_calls += 1
            service._changed.notify_all()
        if not service.gate.is_set():
            with service._lock:
                service.waiting += 1
                service._changed.notify_all()
            while not service.gate.wait(0.1):
                if service.stopping.is_set():
                    break
            with service._lock:
                service.waiting -= 1
        if not known:
            return self.send_json(401, {"fault": {"code": "TOKEN_EXPIRED", "message": "access_token expired"}})
        login = service.tokens[token]
        self.send_json(200, {"personalInformation": {"login": login, "bpId": service.bpids.get(login, "1000777"),
                                                     "bpIdStatus": "active"}})


class IdentityDouble(_Server):
    """A personal-information identity service (JSON, the conftest's PERSONAL_JSON shape) that
    knows the tokens registered with `register(token, login)`; any other token is 401.

    `gate` (an Event, set by default): clear it and every call waits at the double until it is
    set again (or stop()): an identity service as slow as the test needs. Counters besides the
    `_Server` ones (calls, in_flight, max_in_flight): `known_calls`, `unknown_calls`, `waiting`
    (calls held at the gate now); `traceparents`: the traceparent field of each call (several
    fields joined with ", ", None for none). `port`: where it listens (0: a free port)."""

    def __init__(self, handler=_IdentityHandler, port=0):
        self.tokens = {}
        self.bpids = {}
        self.gate = threading.Event()
        self.gate.set()
        self._changed = threading.Condition(threading.Lock())
        super().__init__(handler, port)
        self._lock = self._changed  # one lock: _Server's counters and ours, with a condition
        self.url_for_config = self.url + IDENTITY_PATH

    def reset(self):
        super().reset()
        self.known_calls = self.unknown_calls = self.waiting = 0
        self.traceparents = []

    def register(self, token, login, bpid=None):
        with self._lock:
            self.tokens[token] = login
            if bpid:
                self.bpids[login] = bpid

    def snapshot(self):
        with self._lock:
            return {"calls": self.calls, "known": self.known_calls, "unknown": self.unknown_calls,
                    "in_flight": self.in_flight, "max_in_flight": self.max_in_flight, "waiting": self.waiting}

    def wait_until(self, predicate, timeout, what):
        """Waits until `predicate(snapshot)` holds; AssertionError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                state = {"calls": self.calls, "known": self.known_calls, "unknown": self.unknown_calls,
                         "in_flight": self.in_flight, "max_in_flight": self.max_in_flight, "waiting": self.waiting}
                if predicate(state):
                    return state
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"identity double: {what} not within {timeout}s ({state})")
                self._lock.wait(min(remaining, 0.1))

    def _begin(self):
        super()._begin()
        with self._lock:
            self._lock.notify_all()

    def _end(self):
        super()._end()
        with self._lock:
            self._lock.notify_all()


# --------------------------------------------------------------------------- token endpoint double

class _TokenEndpointHandler(_Handler):
    def respond(self):
        endpoint = self.owner
        body = b""

        def keep(data):
            nonlocal body
            body += data

        self.read_body(keep)
        with endpoint._lock:
            endpoint.call_times.append(time.monotonic())
            endpoint.bodies.append(body.decode(errors="replace"))
            status, retry_after = endpoint.status, endpoint.retry_after
        headers = [("Retry-After", str(retry_after))] if retry_after is not None else []
        if status == 200:
            return self.send_json(200, {"access_token": "a" + secrets.token_urlsafe(24), "token_type": "Bearer",
                                        "expires_in": 300, "refresh_token": "r" + secrets.token_urlsafe(24)})
        self.send_json(status, {"error": "slow_down" if status == 429 else "server_error"}, headers)


class TokenEndpointDouble(_Server):
    """An upstream token endpoint (`.token_url`) answering `status` (429 by default) with
    `Retry-After: retry_after` (None: no header). `call_times`: the monotonic time of every
    request; `bodies`: their forms as text."""

    def __init__(self, status=429, retry_after=2):
        self.status = status
        self.retry_after = retry_after
        super().__init__(_TokenEndpointHandler)
        self.token_url = self.url + "/token"

    def reset(self):
        super().reset()
        self.call_times = []
        self.bodies = []

    @property
    def count(self):
        with self._lock:
            return len(self.call_times)


class _UpstreamHandler(_IdentityHandler):
    def respond(self):
        if self.command == "POST" and self.path.split("?")[0] != IDENTITY_PATH:
            return _TokenEndpointHandler.respond(self)
        return super().respond()


class UpstreamDouble(IdentityDouble):
    """An upstream that is its own identity service, at one address (so one connection pool
    in Gatehouse): IdentityDouble on its identity path, and every other POST answered as by
    TokenEndpointDouble (`status`, 200 by default: a new token pair; `call_times`, `bodies`,
    `token_calls`). `port`: where it listens (0: a free port); `stop()` then `restart()` is
    an outage: connections refused in between, the same port after."""

    def __init__(self, port=0, status=200, retry_after=None):
        self.status, self.retry_after = status, retry_after
        super().__init__(_UpstreamHandler, port)

    def reset(self):
        super().reset()
        self.call_times = []
        self.bodies = []

    @property
    def token_calls(self):
        with self._lock:
            return len(self.call_times)


# --------------------------------------------------------------------------- configuration

@pytest.fixture(scope="module")
def identity():
    """The module's identity double (a test module imports this fixture by name)."""
    double = IdentityDouble()
    yield double
    double.stop()


def identity_yaml(identity_url, timeout="10s", cache_ttl="5m", negative_ttl="30s"):
    return f"""
    identity:
      kind: personal_information
      url: {identity_url}
      format: json
      subject: /personalInformation/login
      bpid: /personalInformation/bpId
      cache_ttl: {cache_ttl}
      negative_ttl: {negative_ttl}
      timeout: {timeout}"""


def upstream_yaml(name, upstream_url, token_endpoint=None, identity_url=None, timeout="5s"):
    """An oauth2 upstream `name`: the suite's django-oauth-toolkit (its `gatehouse-legacy`
    registration), with another token endpoint when given, and an identity service when given."""
    return f"""
  - name: {name}
    kind: oauth2
    authorization_endpoint: {upstream_url}/o/authorize/
    token_endpoint: {token_endpoint or upstream_url + "/o/token/"}
    revocation_endpoint: {upstream_url}/o/revoke_token/
    client_id: gatehouse-legacy
    client_secret_env: UPSTREAM_SECRET_LEGACY
    client_auth: client_secret_basic
    scopes: [read, write]
    pkce: false
    timeout: {timeout}{identity_yaml(identity_url) if identity_url else ""}"""


def client_yaml(client_id, upstream_name, exposure="passthrough", wiring="relay"):
    return f"""
  - client_id: {client_id}
    upstream: {upstream_name}
    wiring: {wiring}
    token_exposure: {exposure}
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]"""


def route_yaml(prefix, backend, upstream_name, methods="[GET, HEAD, POST]", extra=""):
    return f"""
  - prefix: {prefix}
    backend: {backend}
    methods: {methods}
    upstream: {upstream_name}
    identity_headers:
      X-Subject: subject
      X-BPId: bpid{extra}"""


def gateway_config(port, workdir, name, upstream_url, identity_url, backend_url, seen, *, server_extra=None,
                   sections="", routes=None, upstreams="", clients="", sealed=False, refresh_grace="30s"):
    """The YAML of a Gatehouse on 127.0.0.1:PORT (SQLite WORKDIR/NAME.sqlite):

    - upstream `legacy`: the suite's django-oauth-toolkit, identity by `identity_url` (an
      IdentityDouble), plus `upstreams` (YAML list items) when given;
    - clients `com.example.relay` (passthrough) and, when `sealed`, `com.example.sealed-relay`
      (sealed, with a `sessions` section on the suite's key ring), both `wiring: relay`, plus `clients`;
    - `routes` (YAML list items; default: /api/ops → BACKEND/ops, GET, HEAD, POST);
    - `server_extra`: more `server:` keys (dict; `shutdown_drain` is 0s unless given there);
      `sections`: more top-level YAML."""
    # No drain by default: stopping a process at teardown would otherwise wait the default 5 s.
    server = "".join(f"  {key}: {value}\n" for key, value in {"shutdown_drain": "0s", **(server_extra or {})}.items())
    routes = routes if routes is not None else route_yaml("/api/ops", backend_url + "/ops", "legacy")
    sealed_client = client_yaml("com.example.sealed-relay", "legacy", exposure="sealed") if sealed else ""
    sessions = ""
    if sealed:
        keys = session_keys(workdir, "session-keys", seen)
        sessions = f"""
sessions:
  encryption_keys_file: {keys}
  refresh_grace: {refresh_grace}
"""
    return f"""server:
  public_base_url: http://127.0.0.1:{port}
  host: 127.0.0.1
  port: {port}
{server}store:
  sqlite_path: {workdir}/{name}.sqlite
upstreams:{upstream_yaml("legacy", upstream_url, identity_url=identity_url)}{upstreams}
clients:{client_yaml("com.example.relay", "legacy")}{sealed_client}{clients}
routes:{routes}
{sessions}{sections}"""


# --------------------------------------------------------------------------- the process

#: A Gatehouse process serving a YAML text, followed and logged: the launcher every suite uses.
gateway = run_gatehouse


def json_lines(lines):
    """The JSON objects of a LogFollower's lines (AssertionError naming the first that is not one)."""
    objects = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            raise AssertionError(f"a log line is not JSON: {line[:300]!r}") from None
        assert isinstance(value, dict), f"a log line is not a JSON object: {line[:300]!r}"
        objects.append(value)
    return objects


# --------------------------------------------------------------------------- sign-in

def relay_sign_in(base, seen, client_id="com.example.relay", username=None, password=None):
    """Signs in through a `wiring: relay` client of the Gatehouse at `base`: the upstream sends
    the browser straight to the app, which posts the upstream's code with Gatehouse's state.
    Returns (app, token response JSON)."""
    from sandbox.nativeapp import InAppBrowser
    app = App({"url": base}, seen, client_id=client_id)
    browser = InAppBrowser(username=username, password=password) if username else InAppBrowser()
    received = app.sign_in(browser)
    assert received.get("state") != app.state, "expected relay wiring (the upstream's code, Gatehouse's state)"
    answer = app.redeem(received["code"], state=received["state"])
    assert answer.status_code == 200, answer.text
    return app, answer.json()


# --------------------------------------------------------------------------- Prometheus text

_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """{(metric name, frozenset of (label, value)): float} of a Prometheus text exposition."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = frozenset(_LABEL.findall(match.group("labels") or ""))
        samples[(match.group("name"), labels)] = float(match.group("value"))
    return samples


def metric_sum(samples, name, **labels):
    """The sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (metric, have), value in samples.items() if metric == name and wanted <= have)


def scrape(url):
    response = requests.get(url, timeout=10)
    assert response.status_code == 200, f"GET {url}: {response.status_code} {response.text[:300]}"
    return response.text
