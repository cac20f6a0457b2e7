"""In-app sign-in (docs/in-app-sign-in.md): the authorization challenge endpoint
(`POST /oauth/authorize-challenge`, draft-ietf-oauth-first-party-apps) end to end, driven two ways:

- through the Swift client, GatehouseSignIn, run by its driver `gatehouse-signin` (JSON lines on
  stdin and stdout): every transition of the seed's state machine (seed 004) that applies;
- with raw HTTP, as an attacker or a careless app would: each answer of the contract, its error
  catalog provoked for real, and the attacks the endpoint must hold against (spraying, replay,
  theft to another DPoP key, step skipping, enumeration).

This module's own Gatehouse (SQLite) fronts six upstreams:

- `dot`: a real django-oauth-toolkit whose application has the password grant (RFC 6749 §4.3),
  `password_grant: true`. Every request Gatehouse sends it passes through a recording forwarder
  (WireRecorder), so a test asserts what reached it: the password only at its token endpoint, once
  per attempt, with the client secret;
- `auth0`: an Auth0 double built from Auth0's documentation (sandbox/auth0mfa.py:
  `mfa_required`, `/mfa/challenge`, the mfa-otp grant, real RFC 6238 codes),
  `password_grant: auth0`;
- `auth0-faulty`: another Auth0 double, told to stall past the upstream timeout (1 s), to answer
  garbage, or stopped (the catalog's upstream failures); `auth0-throttled`, a third, answers 429
  with Retry-After (on an upstream of its own, so a Gatehouse that keeps off a throttled upstream
  until the wait is over does not spill into other tests);
- `central`: the central-provider double (sandbox/central/), whose magic link (`platform:
  mobile`) hands the app a code;
- `browser`: django-oauth-toolkit's authorization-code application (no password grant): the
  dialogue falls back to the browser (`redirect_to_web`).

Unblock codes go through `mail:` to a real SMTP server (SMTPSink, STARTTLS). More Gatehouses
are started for what needs a configuration of its own: small limits (`limited`), a mail relay
that is down (`mailless`), no in-app app at all (`off`), Auth0's optional challenge request
(`mfa_challenge_endpoint`).

Every password, code, auth_session and token this module uses is registered with `seen`, so
test_zz (and the last test here, for this module's logs) finds any that reaches a log or a
database. No test sleeps: each waits on a condition (an e-mail, a held request, a process line).
"""

import json
import os
import queue
import re
import secrets
import subprocess
import sys
import threading
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the sandbox package

from sandbox import central as centrald  # noqa: E402
from sandbox.auth0mfa import GRANT_MFA_OTP, GRANT_PASSWORD, Auth0MFA, read_arrival  # noqa: E402
from sandbox.backends import EchoBackend, self_signed_certificate  # noqa: E402
from browser import browser  # noqa: E402,F401 (the fixture)
from sandbox.dpop import Key  # noqa: E402
from sandbox.nativeapp import APP_REDIRECT, InAppBrowser, free_port, pkce_pair, query  # noqa: E402
from sandbox.smtpsink import SMTPSink  # noqa: E402
from sandbox.stubserver import StubHandler, StubServer  # noqa: E402
from processes import run_gatehouse, run_upstream, session_keys  # noqa: E402
from sandbox.gatehouse import gatehouse_binary, server_and_store  # noqa: E402

CHALLENGE = "/oauth/authorize-challenge"
FIXTURES = ROOT / "Tests/Fixtures/central"

APP_DOT = "com.example.inapp.dot"
APP_AUTH0 = "com.example.inapp.auth0"
APP_FAULTY = "com.example.inapp.faulty"
APP_THROTTLED = "com.example.inapp.throttled"
APP_CENTRAL = "com.example.inapp.central"
APP_BROWSER = "com.example.inapp.browser"
APP_WEB = "com.example.inapp.web"          # the `dot` upstream, in_app_sign_in off
APP_INSTANCES = "com.example.inapp.instances"  # registered instances, never certified (attestation off)
APP_ATTESTED = "com.example.inapp.attested"    # attestation: required
CENTRAL_APP_ID = "inapp-central"
CENTRAL_SCHEME = "com.example.inapp.central"
DOT_SCOPE, AUTH0_SCOPE = "read write", "openid profile email offline_access"
MAIL_FROM = "gatehouse@example.test"

UNBLOCK_AFTER = 3       # in_app_sign_in.unblock_after of every Gatehouse here
ATTEMPTS = 5            # in_app_sign_in.attempts
RESENDS = 3             # in_app_sign_in.resends
LIMITED_ADDRESS_BURST = 6
LIMITED_ACCOUNT_BURST = 6

AUTH_SESSION = re.compile(r"[A-Za-z0-9_-]{43,}")   # 256 bits: 43 base64url characters at least (64 in hex)

#: DOT accounts, made at the upstream's start: each test takes its own (take_account), so no
#: failure counted against one account leaks into another test.
DOT_ACCOUNTS = [(f"reader{index:02d}@example.test", secrets.token_urlsafe(18)) for index in range(48)]
#: A DOT account whose username is no e-mail address: no unblock code can reach it.
PLAIN_ACCOUNT = ("plainreader", secrets.token_urlsafe(18))


# --------------------------------------------------------------------------- the recording forwarder

class WireRecorder(StubServer):
    """Forwards every request to `target` (same method, path and query; Authorization,
    Content-Type and Accept kept) and answers what the target answered; records each request as it
    arrived (auth0mfa.Arrival: target, raw body, fields, headers) in `arrivals`. Gatehouse's `dot`
    upstream has every endpoint behind it, so nothing Gatehouse sends django-oauth-toolkit escapes it."""

    def __init__(self, target):
        self.target = target
        self.arrivals = []
        self.local = threading.local()
        recorder = self

        class Handler(StubHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.forward(b"")

            def do_POST(self):
                self.forward(self.read_body())

            def forward(self, body):
                arrival = read_arrival(self, body)
                with recorder.condition:
                    recorder.arrivals.append(arrival)
                    recorder.condition.notify_all()
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
                try:
                    answer = recorder.session().request(self.command, recorder.target + self.path, data=body or None,
                                                        headers=headers, timeout=30, allow_redirects=False)
                except requests.RequestException:
                    self.close_connection = True
                    return
                arrival.status = answer.status_code
                self.reply(answer.status_code, answer.content, answer.headers.get("Content-Type", "application/json"))

        super().__init__(Handler)

    def session(self):
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session

    def mark(self):
        with self.condition:
            return len(self.arrivals)

    def since(self, mark=0):
        with self.condition:
            return list(self.arrivals[mark:])


# --------------------------------------------------------------------------- configuration

def oauth2_upstream(name, authorize, token, client_id, secret_env, extra="", auth="client_secret_basic", timeout="5s"):
    return f"""
  - name: {name}
    kind: oauth2
    authorization_endpoint: {authorize}
    token_endpoint: {token}
    client_id: {client_id}
    client_secret_env: {secret_env}
    client_auth: {auth}
    timeout: {timeout}{extra}"""


def in_app_client(client_id, upstream, scopes=None, in_app="on", exposure="sealed"):
    scope_line = f"""
    scopes: [{", ".join(scopes.split())}]""" if scopes else ""
    return f"""
  - client_id: {client_id}
    upstream: {upstream}
    token_exposure: {exposure}
    in_app_sign_in: {in_app}{scope_line}
    redirect_uris: ["{APP_REDIRECT}"]"""


def dot_upstream(world):
    wire = world.wire.url
    return oauth2_upstream("dot", world.dot_url + "/o/authorize/", wire + "/o/token/", "gatehouse-password",
                           "UPSTREAM_SECRET_LEGACY", extra=f"""
    revocation_endpoint: {wire}/o/revoke_token/
    scopes: [read, write]
    password_grant: true
    identity:
      kind: introspection
      url: {wire}/o/introspect/
      subject: /username""")


def auth0_upstream(name, double, secret_env, timeout, extra=""):
    return oauth2_upstream(name, double.url + "/authorize", double.token_endpoint, double.client_id, secret_env,
                           auth="client_secret_post", timeout=timeout, extra=f"""
    scopes: [openid, profile, email, offline_access]
    password_grant: auth0{extra}
    identity:
      kind: userinfo
      url: {double.userinfo_endpoint}
      attributes:
        email: /email""")


def main_config(world, port):
    """The module's Gatehouse: every upstream, every app, mail to the sink, roomy limits (the
    tests say which client address a request is from with X-Forwarded-For)."""
    return server_and_store(port, world.workdir / "in-app.sqlite") + f"""
upstreams:{dot_upstream(world)}{auth0_upstream("auth0", world.auth0, "AUTH0_CLIENT_SECRET", "5s")}\
{auth0_upstream("auth0-faulty", world.faulty, "AUTH0_FAULTY_SECRET", "1s")}\
{auth0_upstream("auth0-throttled", world.throttled, "AUTH0_THROTTLED_SECRET", "5s")}
  - name: central
    kind: central
    client_id: {CENTRAL_APP_ID}
    s2s_private_key_file: {FIXTURES / "app-private.pem"}
    api_base: {world.central.api_base}
    web_base: {world.central.web_base}
    environment: development
    signing_key_files: [{FIXTURES / "jwt-a.pem"}]
    magic_link_address_limit: 1000
    timeout: 5s{oauth2_upstream("browser", world.dot_url + "/o/authorize/", world.dot_url + "/o/token/", "gatehouse-browser",
                                 "UPSTREAM_SECRET_LEGACY", extra='''
    scopes: [read, write]''')}
clients:{in_app_client(APP_DOT, "dot", DOT_SCOPE)}{in_app_client(APP_AUTH0, "auth0", AUTH0_SCOPE)}\
{in_app_client(APP_FAULTY, "auth0-faulty", AUTH0_SCOPE)}{in_app_client(APP_THROTTLED, "auth0-throttled", AUTH0_SCOPE)}\
{in_app_client(APP_CENTRAL, "central")}\
{in_app_client(APP_BROWSER, "browser", DOT_SCOPE)}{in_app_client(APP_WEB, "dot", DOT_SCOPE, in_app="off")}\
{in_app_client(APP_INSTANCES, "dot", DOT_SCOPE)}
    instances: {{}}{in_app_client(APP_ATTESTED, "dot", DOT_SCOPE)}
    instances:
      attestation: required
      apple:
        app_id: ABCDE12345.{APP_ATTESTED}
        root_ca_file: {world.apple_root}
routes:
  - prefix: /api/inapp-dot
    backend: {world.backend.url}/dot
    upstream: dot
    identity_headers:
      X-Subject: subject
  - prefix: /api/inapp-auth0
    backend: {world.backend.url}/auth0
    upstream: auth0
    identity_headers:
      X-Subject: subject
      X-Email: email
{mail_section(world.sink.port, world.sink.certificate)}
in_app_sign_in:
  unblock_after: {UNBLOCK_AFTER}
  attempts: {ATTEMPTS}
  resends: {RESENDS}
  breaker_failures: 1000  # this module's many wrong passwords never trip it; test_spraying_… trips its own
rate_limits:
  trusted_proxies: [127.0.0.1/32]
  in_app_per_address: {{per_second: 50, burst: 1000}}
  in_app_per_account: {{per_second: 1, burst: 30}}
sessions:
  encryption_keys_file: {session_keys(world.workdir, "in-app-session-keys", world.seen)}
"""


def mail_section(port, certificate, timeout="10s"):
    return f"""mail:
  smtp_host: 127.0.0.1
  smtp_port: {port}
  ca_file: {certificate}
  from: {MAIL_FROM}
  timeout: {timeout}"""


def dot_only_config(world, port, name, in_app="", rate_limits="", mail="", clients=None):
    """A Gatehouse of its own with the `dot` upstream only (its own store, its own key ring)."""
    return server_and_store(port, world.workdir / f"{name}.sqlite") + f"""
upstreams:{dot_upstream(world)}
clients:{clients if clients is not None else in_app_client(APP_DOT, "dot", DOT_SCOPE)}
{mail}
{in_app}
{rate_limits}
sessions:
  encryption_keys_file: {session_keys(world.workdir, f"{name}-session-keys", world.seen)}
"""


# --------------------------------------------------------------------------- the processes

@pytest.fixture(scope="module")
def world(workdir, seen):
    """Everything but Gatehouse: the SMTP sink, django-oauth-toolkit behind its recorder, the
    Auth0 doubles, the central double, an echo backend; the ports of this module's Gatehouses."""
    ports = {name: free_port() for name in ("main", "limited", "mailless", "off")}
    callbacks = [f"http://127.0.0.1:{port}/oauth/callback" for port in ports.values()]
    for _, password in DOT_ACCOUNTS + [PLAIN_ACCOUNT]:
        seen.add(password, kind="password typed in the app")
    for name in ("app-private.pem", "jwt-a.pem"):
        seen.add(*[line for line in (FIXTURES / name).read_text().splitlines() if line and not line.startswith("-----")],
                 kind="central fixture private key (PEM line)")
    users = [{"username": address, "password": password, "email": address} for address, password in DOT_ACCOUNTS]
    users.append({"username": PLAIN_ACCOUNT[0], "password": PLAIN_ACCOUNT[1], "email": ""})
    applications = [
        {"client_id": "gatehouse-password", "client_secret_env": "UPSTREAM_SECRET_LEGACY", "grant_type": "password",
         "pkce_required": False},
        {"client_id": "gatehouse-browser", "client_secret_env": "UPSTREAM_SECRET_LEGACY", "redirect_uris": callbacks,
         "pkce_required": False},
    ]
    with ExitStack() as stack:
        sink = SMTPSink(workdir, name="in-app-smtp-sink")
        stack.callback(sink.stop)
        dot = stack.enter_context(run_upstream(workdir, "in-app-upstream", seen, callbacks, users=users, applications=applications))
        wire = WireRecorder(dot["url"])
        stack.callback(wire.stop)
        auth0 = Auth0MFA("gatehouse-auth0", secrets.token_urlsafe(32), seen=seen)
        stack.callback(auth0.stop)
        faulty = Auth0MFA("gatehouse-auth0-faulty", secrets.token_urlsafe(32), seen=seen)
        stack.callback(faulty.stop)
        throttled = Auth0MFA("gatehouse-auth0-throttled", secrets.token_urlsafe(32), seen=seen)
        stack.callback(throttled.stop)
        backend = EchoBackend()
        stack.callback(backend.stop)
        apple_root, _ = self_signed_certificate(workdir, "in-app-apple-root")
        central = stack.enter_context(centrald.start(workdir, "in-app-central-double", {"apps": {CENTRAL_APP_ID: centrald.app_config(
            f"http://127.0.0.1:{ports['main']}", FIXTURES / "app-public.pem", mobile_scheme=CENTRAL_SCHEME)}}))
        env = dict(dot["env"], AUTH0_CLIENT_SECRET=auth0.client_secret, AUTH0_FAULTY_SECRET=faulty.client_secret,
                   AUTH0_THROTTLED_SECRET=throttled.client_secret)
        yield SimpleNamespace(workdir=workdir, seen=seen, ports=ports, sink=sink, dot_url=dot["url"], wire=wire, auth0=auth0,
                              faulty=faulty, throttled=throttled, backend=backend, central=central, env=env,
                              apple_root=apple_root, accounts=iter(DOT_ACCOUNTS))


@pytest.fixture(scope="module")
def main(world):
    with run_gatehouse(world.workdir, "in-app-gatehouse", main_config(world, world.ports["main"]), world.env) as gatehouse:
        yield gatehouse


@pytest.fixture(scope="module")
def limited(world):
    """Small limits: per client address and per account (in_app_per_address, in_app_per_account)."""
    config = dot_only_config(world, world.ports["limited"], "in-app-limited", mail=mail_section(world.sink.port, world.sink.certificate),
                             in_app=f"in_app_sign_in:\n  unblock_after: {UNBLOCK_AFTER}\n  attempts: {ATTEMPTS}",
                             rate_limits=f"""rate_limits:
  trusted_proxies: [127.0.0.1/32]
  in_app_per_address: {{per_second: 0.001, burst: {LIMITED_ADDRESS_BURST}}}
  in_app_per_account: {{per_second: 0.001, burst: {LIMITED_ACCOUNT_BURST}}}""")
    with run_gatehouse(world.workdir, "in-app-limited", config, world.env) as gatehouse:
        yield gatehouse


@pytest.fixture(scope="module")
def mailless(world):
    """A mail relay whose port is closed; after one failed password the next needs an unblock code."""
    closed = free_port()
    config = dot_only_config(world, world.ports["mailless"], "in-app-mailless",
                             mail=mail_section(closed, world.sink.certificate, timeout="2s"),
                             in_app="in_app_sign_in:\n  unblock_after: 1",
                             rate_limits="rate_limits:\n  trusted_proxies: [127.0.0.1/32]")
    with run_gatehouse(world.workdir, "in-app-mailless", config, world.env) as gatehouse:
        yield gatehouse


@pytest.fixture(scope="module")
def off(world):
    """No app has in_app_sign_in: on."""
    config = dot_only_config(world, world.ports["off"], "in-app-off", clients=in_app_client(APP_WEB, "dot", DOT_SCOPE, in_app="off"))
    with run_gatehouse(world.workdir, "in-app-off", config, world.env) as gatehouse:
        yield gatehouse


def take_account(world):
    """A DOT account (e-mail address, password) no other test uses."""
    return next(world.accounts)


_ADDRESSES = iter(range(1, 1_000_000))


def fresh_address():
    """A client address no other request of the run came from (named in X-Forwarded-For)."""
    n = next(_ADDRESSES)
    return f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"


# --------------------------------------------------------------------------- the dialogue over raw HTTP

def json_answer(answer):
    """Every answer of the endpoint is JSON with Cache-Control: no-store; its body."""
    assert answer.headers.get("Content-Type", "").startswith("application/json"), \
        f"{answer.status_code} {answer.headers.get('Content-Type')}: {answer.text[:200]}"
    assert "no-store" in answer.headers.get("Cache-Control", ""), answer.headers
    body = answer.json()
    assert isinstance(body, dict), body
    return body


class Dialogue:
    """One authorization challenge dialogue, run with raw HTTP as an app would: the first request
    (`begin`) carries the authorization request, every later one (`send`) the client_id and the
    auth_session last answered. `address` goes in X-Forwarded-For; `key` (a dpop.Key) signs a
    DPoP proof for every request. Every auth_session, code and verifier goes to `seen`."""

    def __init__(self, gatehouse, seen, client_id, address=None, key=None):
        self.base = gatehouse["url"]
        self.url = self.base + CHALLENGE
        self.seen, self.client_id, self.key = seen, client_id, key
        self.address = address or fresh_address()
        self.verifier, self.challenge = pkce_pair()
        seen.add(self.verifier, kind="app PKCE verifier")
        self.auth_session = None

    def post(self, form, key="own", proof=None):
        """POSTs `form`; the DPoP header is `proof` when given (any text), else a proof by `key`."""
        key = self.key if key == "own" else key
        headers = {"X-Forwarded-For": self.address}
        if proof is not None:
            headers["DPoP"] = proof
        elif key is not None:
            headers["DPoP"] = key.proof("POST", self.url)
        answer = requests.post(self.url, data={k: v for k, v in form.items() if v is not None}, headers=headers, timeout=60)
        assert answer.status_code != 500, answer.text
        body = json_answer(answer)
        self.seen.add(body.get("auth_session"), kind="auth_session")
        self.seen.add(body.get("authorization_code"), kind="Gatehouse code (in-app)")
        self.seen.add(body.get("request_uri"), kind="pushed request_uri")
        if isinstance(body.get("auth_session"), str):
            self.auth_session = body["auth_session"]
        return answer

    def begin(self, login_hint=None, **extra):
        form = {"client_id": self.client_id, "response_type": "code", "code_challenge": self.challenge,
                "code_challenge_method": "S256", "login_hint": login_hint}
        form.update(extra)
        return self.post(form)

    def send(self, auth_session=None, key="own", proof=None, **fields):
        return self.post({"client_id": self.client_id, "auth_session": auth_session or self.auth_session, **fields}, key, proof)

    def redeem(self, code, key="own", verifier=None):
        """The code at /oauth/token with the PKCE verifier and no redirect_uri (DPoP proof by `key`)."""
        key = self.key if key == "own" else key
        headers = {"DPoP": key.proof("POST", self.base + "/oauth/token")} if key is not None else {}
        answer = requests.post(self.base + "/oauth/token", headers=headers, timeout=30, data={
            "grant_type": "authorization_code", "client_id": self.client_id, "code": code,
            "code_verifier": verifier or self.verifier})
        remember_tokens(self.seen, answer)
        return answer


def remember_tokens(seen, answer):
    if answer.headers.get("Content-Type", "").startswith("application/json"):
        body = answer.json()
        if isinstance(body, dict):
            seen.add(body.get("access_token"), kind="Gatehouse access token")
            seen.add(body.get("refresh_token"), kind="Gatehouse refresh token")
            seen.add(body.get("id_token"), kind="Gatehouse ID token")


def expect_step(answer, step, failure=None):
    """403 insufficient_authorization asking for `step`, with a fresh auth_session (and `failure`)."""
    assert answer.status_code == 403, f"expected the step {step}: {answer.status_code} {answer.text}"
    body = json_answer(answer)
    assert body.get("error") == "insufficient_authorization", body
    assert body.get("step") == step, body
    assert AUTH_SESSION.fullmatch(body.get("auth_session") or ""), "the auth_session is not 256 bits of base64url or hex"
    assert body.get("failure") == failure, body
    return body


def expect_code(answer):
    assert answer.status_code == 200, f"expected the authorization code: {answer.status_code} {answer.text}"
    body = json_answer(answer)
    assert set(body) == {"authorization_code"}, sorted(body)
    return body["authorization_code"]


def expect_error(answer, status, error, failure=None):
    assert answer.status_code == status, f"expected {status} {error}/{failure}: {answer.status_code} {answer.text}"
    body = json_answer(answer)
    assert body.get("error") == error, body
    if failure is not None:
        assert body.get("failure") == failure, body
    return body


def expect_too_many(answer):
    """429 temporarily_unavailable, failure too_many_requests, retry_after = Retry-After > 0."""
    body = expect_error(answer, 429, "temporarily_unavailable", "too_many_requests")
    assert isinstance(body.get("retry_after"), int) and body["retry_after"] > 0, body
    assert answer.headers.get("Retry-After") == str(body["retry_after"]), answer.headers.get("Retry-After")
    return body


def signed_in(dialogue, account):
    """A whole password dialogue: the first request, the password, the code redeemed. Tokens."""
    expect_step(dialogue.begin(account[0], scope=DOT_SCOPE), "password")
    code = expect_code(dialogue.send(password=account[1]))
    tokens = dialogue.redeem(code)
    assert tokens.status_code == 200, tokens.text
    return tokens.json()


def relay(gatehouse, path, token, scheme="Bearer"):
    return requests.get(gatehouse["url"] + path, headers={"Authorization": f"{scheme} {token}"}, timeout=30)


def password_grants(arrivals, username=None):
    """The password grants among `arrivals` (to the username, when given)."""
    return [a for a in arrivals if a.fields.get("grant_type") == GRANT_PASSWORD
            and (username is None or a.fields.get("username") == username)]


def carrying(arrivals, value):
    return [a for a in arrivals if a.carries(value)]


def assert_password_only_at_the_token_endpoint(arrivals, password, attempts, token_path, client_secret, client_auth):
    """`password` reached the upstream exactly `attempts` times, each a POST of the password grant to
    its token endpoint authenticated with the client secret (`client_auth`), and nowhere else."""
    carried = carrying(arrivals, password)
    assert len(carried) == attempts, f"the password reached the upstream {len(carried)} times, not {attempts}"
    for arrival in carried:
        assert (arrival.method, arrival.path) == ("POST", token_path), (arrival.method, arrival.path)
        assert arrival.fields.get("grant_type") == GRANT_PASSWORD and arrival.fields.get("password") == password, arrival.fields
        assert password not in arrival.target and password not in json.dumps(
            {k: v for k, v in arrival.headers.items() if k != "content-length"}), "the password travelled outside the form body"
        assert arrival.carries(client_secret), "the password grant went without Gatehouse's client secret"
        if client_auth == "client_secret_basic":
            assert arrival.headers.get("authorization", "").lower().startswith("basic "), arrival.headers
        else:
            assert arrival.fields.get("client_secret") == client_secret, "client_secret_post without the secret"


# --------------------------------------------------------------------------- mail

def code_in(message, seen):
    """The 6-digit code of an e-mail (its only six-digit group), registered with `seen`."""
    texts = [part.get_payload(decode=True).decode("utf-8", "replace") for part in message.walk()
             if part.get_content_maintype() == "text" and part.get_payload(decode=True)]
    codes = {match for text in texts for match in re.findall(r"(?<!\d)(\d{6})(?!\d)", text)}
    assert len(codes) == 1, f"the e-mail holds {len(codes)} six-digit groups, not one code"
    code = codes.pop()
    seen.add(code, kind="e-mailed unblock code")
    return code


def unblock_mail(world, address, after):
    message, under_tls = world.sink.wait_for(address, after=after)
    assert under_tls, "the unblock code crossed the SMTP connection in clear"
    assert MAIL_FROM in message["From"], message["From"]
    return code_in(message, world.seen)


def mails_to(world, address, after=0):
    with world.sink.condition:
        return [m for rcpts, m, _ in world.sink.messages[after:] if address in rcpts]


# --------------------------------------------------------------------------- the Swift driver

class SignInDriver:
    """GatehouseSignIn through its driver (GATEHOUSE_SIGNIN_BIN, by default the client package's own
    build, Clients/GatehouseSignIn/.build/debug/gatehouse-signin):
    `call("checkAccount", email=…)` writes {"call": "checkAccount", "email": …} on its stdin and
    returns the JSON line it prints: {"state", "states", "error", "retry_after", "url", "tokens",
    "dpop_jkt"}. Tokens it prints go to `seen`; its standard error to WORKDIR/NAME.stderr."""

    def __init__(self, gatehouse, seen, client_id, scope=None, redirect_uri=None, dpop=False, name="signin-driver"):
        binary = Path(os.environ.get("GATEHOUSE_SIGNIN_BIN", ROOT / "Clients/GatehouseSignIn/.build/debug/gatehouse-signin"))
        if not binary.exists():
            raise RuntimeError(f"{binary} does not exist: build it first (swift build --package-path Clients/GatehouseSignIn)")
        command = [str(binary), "--issuer", gatehouse["url"], "--client-id", client_id]
        if scope:
            command += ["--scope", scope]
        if redirect_uri:
            command += ["--redirect-uri", redirect_uri]
        if dpop:
            command.append("--dpop")
        self.seen = seen
        self.stderr = open(Path(gatehouse["log"]).parent / f"{name}-{secrets.token_hex(4)}.stderr", "w")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in iter(self.process.stdout.readline, ""):
            self.lines.put(line)
        self.lines.put(None)

    def call(self, call, timeout=60, **arguments):
        self.process.stdin.write(json.dumps({"call": call, **arguments}) + "\n")
        self.process.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the driver printed nothing within {timeout} s after {call}") from None
        assert line is not None, f"the driver exited (status {self.process.poll()}) after {call}"
        out = json.loads(line)
        assert isinstance(out, dict) and "state" in out, out
        tokens = out.get("tokens") or {}
        self.seen.add(tokens.get("access_token"), kind="Gatehouse access token")
        self.seen.add(tokens.get("refresh_token"), kind="Gatehouse refresh token")
        self.seen.add(tokens.get("id_token"), kind="Gatehouse ID token")
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.stderr.close()


def driver(gatehouse, seen, client_id, **options):
    return SignInDriver(gatehouse, seen, client_id, **options)


def path_of(out, *states, error=None):
    """The call went through `states` in this order (other states may come between) and ended in
    the last one, with `error` (a catalog code, or None)."""
    passed = list(out.get("states") or [])
    remaining = iter(passed)
    assert all(state in remaining for state in states), f"states {passed} do not pass through {list(states)}"
    assert out["state"] == states[-1] and passed[-1:] == [states[-1]], out
    assert out.get("error") == error, out
    return out


def started(gatehouse, seen, client_id, email, expected, **options):
    """A driver past start() and checkAccount(email), which led to the state `expected` (that
    call's output is its `checked`)."""
    running = SignInDriver(gatehouse, seen, client_id, **options)
    try:
        path_of(running.call("start"), "start")
        running.checked = path_of(running.call("checkAccount", email=email), "checkingAccount", expected)
    except BaseException:
        running.close()
        raise
    return running


def finalized_tokens(out):
    tokens = out.get("tokens") or {}
    assert tokens.get("access_token") and tokens.get("refresh_token"), out
    return tokens


def refreshes(gatehouse, client_id, refresh_token, seen):
    answer = requests.post(gatehouse["url"] + "/oauth/token", timeout=30, data={
        "grant_type": "refresh_token", "client_id": client_id, "refresh_token": refresh_token})
    remember_tokens(seen, answer)
    return answer


# =========================================================================== discovery and configuration

def test_metadata_advertises_the_authorization_challenge_endpoint(main):
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
        metadata = requests.get(main["url"] + path, timeout=10).json()
        assert metadata.get("authorization_challenge_endpoint") == main["url"] + CHALLENGE, (path, metadata)


def test_without_an_in_app_app_the_endpoint_is_not_found_and_not_advertised(off, seen):
    metadata = requests.get(off["url"] + "/.well-known/oauth-authorization-server", timeout=10).json()
    assert "authorization_challenge_endpoint" not in metadata
    verifier, challenge = pkce_pair()
    answer = requests.post(off["url"] + CHALLENGE, timeout=10, data={
        "client_id": APP_WEB, "response_type": "code", "code_challenge": challenge, "code_challenge_method": "S256",
        "login_hint": "someone@example.test"})
    assert answer.status_code == 404, answer.text
    body = answer.json()
    assert "not_found" in (body.get("error"), body.get("code")), body


def test_check_config_refuses_in_app_sign_in_for_a_passthrough_app(world, main):
    text = Path(main["config"]).read_text().replace(f"""  - client_id: {APP_DOT}
    upstream: dot
    token_exposure: sealed""", f"""  - client_id: {APP_DOT}
    upstream: dot
    token_exposure: passthrough""")
    assert "token_exposure: passthrough" in text
    path = world.workdir / "in-app-passthrough.yaml"
    path.write_text(text)
    checked = subprocess.run([str(gatehouse_binary()), "check-config", str(path)], capture_output=True, text=True, timeout=60,
                             env=world.env)
    assert checked.returncode == 78, (checked.returncode, checked.stdout, checked.stderr)
    said = checked.stdout + checked.stderr
    assert "in_app_sign_in" in said and "passthrough" in said, said
    assert subprocess.run([str(gatehouse_binary()), "check-config", str(main["config"])], capture_output=True, timeout=60,
                          env=world.env).returncode == 0


@pytest.mark.parametrize("change, status, error", [
    ({"client_id": "com.example.unknown"}, 401, "invalid_client"),
    ({"client_id": APP_WEB}, 400, "unauthorized_client"),
    ({"response_type": "token"}, 400, "unsupported_response_type"),
    ({"code_challenge": None}, 400, "invalid_request"),
    ({"code_challenge_method": "plain"}, 400, "invalid_request"),
    ({"login_hint": None}, 400, "invalid_request"),  # the password upstream needs the account
])
def test_a_bad_first_request_gets_its_error_and_reaches_no_upstream(main, world, seen, change, status, error):
    dialogue = Dialogue(main, seen, APP_DOT)
    form = {"client_id": APP_DOT, "response_type": "code", "code_challenge": dialogue.challenge, "code_challenge_method": "S256",
            "login_hint": take_account(world)[0], **change}
    mark = world.wire.mark()
    body = expect_error(dialogue.post(form), status, error)
    assert "auth_session" not in body
    assert world.wire.since(mark) == []


# =========================================================================== the seed's states, through the Swift client

def test_the_client_signs_in_with_a_password_through_every_state(main, world, seen):
    account = take_account(world)
    mark = world.wire.mark()
    with driver(main, seen, APP_DOT, scope=DOT_SCOPE) as app:
        path_of(app.call("start"), "start")
        path_of(app.call("checkAccount", email=account[0]), "checkingAccount", "signIn")
        assert app.call("setPassword", password=account[1])["state"] == "signIn"
        out = path_of(app.call("signIn"), "signingIn", "finalize")
    tokens = finalized_tokens(out)
    assert tokens.get("token_type") == "Bearer", tokens
    # The upstream saw the password once, at its token endpoint, with Gatehouse's secret (HTTP Basic).
    arrivals = world.wire.since(mark)
    assert_password_only_at_the_token_endpoint(arrivals, account[1], 1, "/o/token/", world.env["UPSTREAM_SECRET_LEGACY"],
                                               "client_secret_basic")
    assert password_grants(arrivals)[0].fields["username"] == account[0]
    # The tokens are Gatehouse's (sealed) and work: the relay knows who they are, a refresh works.
    assert tokens["access_token"].startswith("gha_") and tokens["refresh_token"].startswith("ghr_"), "not Gatehouse's own tokens"
    called = relay(main, "/api/inapp-dot/profile", tokens["access_token"])
    assert called.status_code == 200, called.text
    assert called.json()["headers"]["x-subject"] == account[0]
    renewed = refreshes(main, APP_DOT, tokens["refresh_token"], seen)
    assert renewed.status_code == 200, renewed.text
    assert relay(main, "/api/inapp-dot/profile", renewed.json()["access_token"]).status_code == 200


def test_a_wrong_password_returns_to_sign_in_with_incorrect_password(main, world, seen):
    account = take_account(world)
    wrong = secrets.token_urlsafe(18)
    seen.add(wrong, kind="password typed in the app")
    mark = world.wire.mark()
    with started(main, seen, APP_DOT, account[0], "signIn", scope=DOT_SCOPE) as app:
        app.call("setPassword", password=wrong)
        path_of(app.call("signIn"), "signingIn", "signIn", error="incorrect_password")
        app.call("setPassword", password=account[1])
        finalized_tokens(path_of(app.call("signIn"), "signingIn", "finalize"))
    grants = password_grants(world.wire.since(mark), account[0])
    assert [g.fields["password"] == account[1] for g in grants] == [False, True]


def test_failed_passwords_ask_for_an_emailed_unblock_code_then_the_sign_in_finishes(main, world, seen):
    account = take_account(world)
    wrongs = [secrets.token_urlsafe(18) for _ in range(UNBLOCK_AFTER)]
    seen.add(*wrongs, kind="password typed in the app")
    mark, mail_mark = world.wire.mark(), world.sink.count()
    with started(main, seen, APP_DOT, account[0], "signIn", scope=DOT_SCOPE) as app:
        for wrong in wrongs:
            app.call("setPassword", password=wrong)
            path_of(app.call("signIn"), "signingIn", "signIn", error="incorrect_password")
        assert mails_to(world, account[0], mail_mark) == [], "an unblock code was sent before the failures reached the threshold"
        # The next password (the right one) is not relayed: an unblock code is e-mailed first.
        app.call("setPassword", password=account[1])
        path_of(app.call("signIn"), "signingIn", "unblockCodeNeeded")
        first = unblock_mail(world, account[0], mail_mark)
        assert len(password_grants(world.wire.since(mark), account[0])) == UNBLOCK_AFTER
        wrong_code = f"{(int(first) + 1) % 1_000_000:06d}"
        path_of(app.call("verifyUnblockCode", code=wrong_code), "verifyingUnblockCode", "unblockCodeNeeded",
                error="invalid_unblock_code")
        assert len(password_grants(world.wire.since(mark), account[0])) == UNBLOCK_AFTER, "a wrong code let the password through"
        resent_mark = world.sink.count()
        out = app.call("resendUnblockCodeEmail")
        assert out["state"] == "unblockCodeNeeded" and out.get("error") is None, out
        second = unblock_mail(world, account[0], resent_mark)
        finalized_tokens(path_of(app.call("verifyUnblockCode", code=second), "verifyingUnblockCode", "finalize"))
    grants = password_grants(world.wire.since(mark), account[0])
    assert len(grants) == UNBLOCK_AFTER + 1 and grants[-1].fields["password"] == account[1]
    assert all(g.fields["password"] != account[1] for g in grants[:-1])
    assert not any("unblock_code" in a.fields for a in world.wire.since(mark)), "the unblock code went upstream"


def test_a_totp_account_needs_its_code_and_a_wrong_code_is_invalid(main, world, seen):
    auth0 = world.auth0
    user = auth0.add_user(f"totp-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18), mfa=True)
    mark = auth0.mark()
    with started(main, seen, APP_AUTH0, user.username, "signIn", scope=AUTH0_SCOPE) as app:
        app.call("setPassword", password=user.password)
        path_of(app.call("signIn"), "signingIn", "totpVerificationNeeded")
        path_of(app.call("verifySessionTotpCode", code=auth0.wrong_code(user)), "verifyingSessionTotpCode",
                "totpVerificationNeeded", error="invalid_totp_code")
        tokens = finalized_tokens(path_of(app.call("verifySessionTotpCode", code=auth0.code(user)), "verifyingSessionTotpCode",
                                          "finalize"))
    arrivals = auth0.since(mark)
    # Auth0's documented dialogue: one password grant (answered mfa_required), then mfa-otp grants
    # carrying that mfa_token and the codes typed, never the password.
    assert_password_only_at_the_token_endpoint(arrivals, user.password, 1, "/oauth/token", auth0.client_secret, "client_secret_post")
    password_grant = password_grants(arrivals)[0]
    assert password_grant.fields["username"] == user.username and password_grant.answer["error"] == "mfa_required"
    otp_grants = [a for a in arrivals if a.grant_type == GRANT_MFA_OTP]
    assert len(otp_grants) == 2, [a.fields.get("grant_type") for a in arrivals]
    assert {g.fields["mfa_token"] for g in otp_grants} == {password_grant.answer["mfa_token"]}
    assert [g.status for g in otp_grants] == [403, 200]
    assert all(g.client_authenticated and g.client_auth == "client_secret_post" for g in otp_grants)
    assert [a.path for a in arrivals if a.path not in ("/oauth/token", "/mfa/challenge", "/userinfo")] == []
    # The tokens are sealed Gatehouse tokens over Auth0's: the relay learns the user at Auth0's /userinfo.
    called = relay(main, "/api/inapp-auth0/me", tokens["access_token"])
    assert called.status_code == 200, called.text
    assert called.json()["headers"]["x-subject"] == user.user_id
    assert refreshes(main, APP_AUTH0, tokens["refresh_token"], seen).status_code == 200


def test_an_auth0_account_without_mfa_gets_its_tokens_from_the_password_grant(main, world, seen):
    auth0 = world.auth0
    user = auth0.add_user(f"plain-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    mark = auth0.mark()
    with started(main, seen, APP_AUTH0, user.username, "signIn", scope=AUTH0_SCOPE) as app:
        app.call("setPassword", password=user.password)
        finalized_tokens(path_of(app.call("signIn"), "signingIn", "finalize"))
    arrivals = auth0.since(mark, path="/oauth/token")
    assert [(a.grant_type, a.status) for a in arrivals] == [(GRANT_PASSWORD, 200)]


def test_the_central_upstream_signs_in_with_the_code_its_emailed_link_hands_the_app(main, world, seen):
    address = f"linked-{secrets.token_hex(4)}@example.test"
    before = world.central.stats()
    with started(main, seen, APP_CENTRAL, address, "emailVerification") as app:
        sent = [e for e in centrald_log(world, before) if e["endpoint"] == "email"]
        assert len(sent) == 1 and sent[0]["outcome"] == "accepted", sent
        assert json.loads(sent[0]["body"]) == {"app": CENTRAL_APP_ID, "email": address, "platform": "mobile"}
        path_of(app.call("verifySessionEmailCode", code=secrets.token_hex(16)), "verifyingSessionEmailCode",
                "emailVerification", error="invalid_email_code")
        out = app.call("resendVerificationSessionCodeEmail")
        assert out["state"] == "emailVerification" and out.get("error") is None, out
        assert len([e for e in centrald_log(world, before) if e["endpoint"] == "email"]) == 2
        code = code_from_link(world, address)
        finalized_tokens(path_of(app.call("verifySessionEmailCode", code=code), "verifyingSessionEmailCode", "finalize"))
    verified = [e for e in centrald_log(world, before) if e["endpoint"] == "verify"]
    assert [json.loads(e["body"])["code"] == code for e in verified][-1:] == [True]
    assert verified[-1]["status"] == 200


def test_the_email_link_dialogue_on_the_wire(main, world, seen):
    address = f"wire-link-{secrets.token_hex(4)}@example.test"
    before = world.central.stats()
    dialogue = Dialogue(main, seen, APP_CENTRAL)
    expect_step(dialogue.begin(address), "email_link")
    expect_step(dialogue.send(email_code=secrets.token_hex(16)), "email_link", failure="invalid_email_code")
    expect_step(dialogue.send(resend="email_link"), "email_link")
    sends = [e for e in centrald_log(world, before) if e["endpoint"] == "email"]
    assert [json.loads(e["body"]) for e in sends] == [{"app": CENTRAL_APP_ID, "email": address, "platform": "mobile"}] * 2
    assert all(e["outcome"] == "accepted" for e in sends), "the double's verifier refused Gatehouse's S2S signature"
    code = code_from_link(world, address)
    tokens = dialogue.redeem(expect_code(dialogue.send(email_code=code)))
    assert tokens.status_code == 200, tokens.text
    verified = [e for e in centrald_log(world, before) if e["endpoint"] == "verify"]
    assert [(json.loads(e["body"])["code"], e["status"]) for e in verified][-1] == (code, 200)
    assert refreshes(main, APP_CENTRAL, tokens.json()["refresh_token"], seen).status_code == 200
    # The code is single use at the provider: the same code again is a wrong code.
    again = Dialogue(main, seen, APP_CENTRAL)
    expect_step(again.begin(address), "email_link")
    expect_step(again.send(email_code=code), "email_link", failure="invalid_email_code")


def test_an_email_links_code_finishes_only_the_dialogue_of_its_own_address(main, world, seen):
    mine, theirs = (f"link-{who}-{secrets.token_hex(4)}@example.test" for who in ("mine", "theirs"))
    dialogue = Dialogue(main, seen, APP_CENTRAL)
    expect_step(dialogue.begin(mine), "email_link")
    other = Dialogue(main, seen, APP_CENTRAL)
    expect_step(other.begin(theirs), "email_link")
    # A code handed out for another address is a wrong code here (and spent at the provider).
    expect_step(dialogue.send(email_code=code_from_link(world, theirs)), "email_link", failure="invalid_email_code")
    expect_code(dialogue.send(email_code=code_from_link(world, mine)))


def test_auth0_is_told_the_users_address_and_a_plain_upstream_is_not(main, world, seen):
    """Auth0's attack protection counts failed logins per user and address: Gatehouse names the
    user's address in `auth0-forwarded-for` (Auth0's documented header for a trusted server), so
    that one user's mistakes never block Gatehouse's address for everyone; DOT is told nothing."""
    auth0 = world.auth0
    user = auth0.add_user(f"address-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18), mfa=True)
    dialogue = Dialogue(main, seen, APP_AUTH0)
    mark = auth0.mark()
    expect_step(dialogue.begin(user.username), "password")
    expect_step(dialogue.send(password=user.password), "otp")
    expect_code(dialogue.send(otp=auth0.code(user)))
    arrivals = auth0.since(mark)
    assert len(arrivals) == 3, [a.path for a in arrivals]  # the password grant, /mfa/challenge, the mfa-otp grant
    assert {a.headers.get("auth0-forwarded-for") for a in arrivals} == {dialogue.address}
    account = take_account(world)
    plain = Dialogue(main, seen, APP_DOT)
    wire_mark = world.wire.mark()
    expect_step(plain.begin(account[0]), "password")
    expect_code(plain.send(password=account[1]))
    grants = password_grants(world.wire.since(wire_mark), account[0])
    assert len(grants) == 1 and "auth0-forwarded-for" not in grants[0].headers, grants[0].headers


def centrald_log(world, before):
    """The S2S requests the central double received since the stats `before`."""
    log = world.central.stats()["s2s"]["log"]
    return log[len(before["s2s"]["log"]):]


def code_from_link(world, address):
    """Opens the newest magic link sent to `address` (no browser: one GET); the code it hands the app."""
    link = world.central.last_magic_link(address)
    assert link["platform"] == "mobile", link
    opened = requests.get(link["url"], allow_redirects=False, timeout=10)
    assert opened.status_code == 302 and opened.headers["Location"].startswith(f"{CENTRAL_SCHEME}://auth/callback?"), \
        opened.headers.get("Location")
    code = query(opened.headers["Location"])["code"]
    world.seen.add(code, kind="central auth code")
    return code


def test_an_upstream_without_the_password_grant_falls_back_to_the_browser(main, world, seen):
    account = take_account(world)
    mark = world.wire.mark()
    with started(main, seen, APP_BROWSER, account[0], "fallbackInBrowser", redirect_uri=APP_REDIRECT) as app:
        url = app.checked.get("url") or ""
    assert url.startswith(main["url"] + "/oauth/authorize?"), url
    parameters = query(url)
    assert parameters.get("client_id") == APP_BROWSER and parameters.get("request_uri"), parameters
    seen.add(parameters["request_uri"], kind="pushed request_uri")
    # The request_uri works at /oauth/authorize: it sends the browser on to the upstream.
    opened = requests.get(url, allow_redirects=False, timeout=10)
    assert opened.status_code == 302, opened.text
    location = opened.headers["Location"]
    assert location.startswith(world.dot_url + "/o/authorize/") and query(location)["client_id"] == "gatehouse-browser", location
    seen.add(query(location).get("state"), kind="Gatehouse state toward the upstream")
    assert world.wire.since(mark) == [], "a browser-only upstream was called during the dialogue"
    # The request_uri is single use: shown again, it is refused.
    assert requests.get(url, allow_redirects=False, timeout=10).status_code == 400
    # The driver prints the verifier of the pushed request: the browser sign-in (on from the
    # upstream's page the request_uri led to) completes with it, and the app redeems its code.
    verifier = app.checked.get("code_verifier")
    assert verifier, app.checked
    seen.add(verifier, kind="app PKCE verifier")
    landed = InAppBrowser(username=account[0], password=account[1], seen=seen).follow(location, APP_REDIRECT)
    assert isinstance(landed, str), f"the browser sign-in stopped at {landed.status_code}"
    seen.add(query(landed).get("code"), kind="Gatehouse code")
    tokens = requests.post(main["url"] + "/oauth/token", timeout=30, data={
        "grant_type": "authorization_code", "client_id": APP_BROWSER, "code": query(landed)["code"],
        "redirect_uri": APP_REDIRECT, "code_verifier": verifier})
    remember_tokens(seen, tokens)
    assert tokens.status_code == 200, tokens.text


def test_a_dpop_client_gets_tokens_bound_to_its_key(main, world, seen):
    account = take_account(world)
    with started(main, seen, APP_DOT, account[0], "signIn", scope=DOT_SCOPE, dpop=True) as app:
        app.call("setPassword", password=account[1])
        out = path_of(app.call("signIn"), "signingIn", "finalize")
    tokens = finalized_tokens(out)
    assert tokens.get("token_type") == "DPoP", tokens
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", out.get("dpop_jkt") or ""), out.get("dpop_jkt")
    # Bound: as a bearer token it is refused, and so is its refresh without a proof of the key.
    assert relay(main, "/api/inapp-dot/profile", tokens["access_token"]).status_code == 401
    assert relay(main, "/api/inapp-dot/profile", tokens["access_token"], scheme="DPoP").status_code == 401
    assert refreshes(main, APP_DOT, tokens["refresh_token"], seen).status_code in (400, 401)


# =========================================================================== the catalog, provoked for real

def test_the_client_reports_the_catalogs_upstream_failures_and_retries(main, world, seen):
    faulty = world.faulty
    user = faulty.add_user(f"faults-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    with started(main, seen, APP_FAULTY, user.username, "signIn", scope=AUTH0_SCOPE) as app:
        app.call("setPassword", password=user.password)
        try:
            faulty.stop()
            path_of(app.call("signIn"), "signingIn", "signIn", error="server_unavailable")
        finally:
            faulty.start()
        faulty.fault("stall")
        try:
            path_of(app.call("signIn"), "signingIn", "signIn", error="request_timeout")
        finally:
            faulty.release()
        finalized_tokens(path_of(app.call("signIn"), "signingIn", "finalize"))


def test_the_client_reports_too_many_requests_with_the_wait(main, world, seen):
    """On an upstream of its own: Gatehouse may keep off an upstream that answered 429 until its
    Retry-After passes, which must not spill over into other tests."""
    throttled = world.throttled
    user = throttled.add_user(f"throttled-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    throttled.fault("429", retry_after=11)
    try:
        with started(main, seen, APP_THROTTLED, user.username, "signIn", scope=AUTH0_SCOPE) as app:
            app.call("setPassword", password=user.password)
            out = path_of(app.call("signIn"), "signingIn", "signIn", error="too_many_requests")
            assert isinstance(out.get("retry_after"), int) and out["retry_after"] > 0, out
    finally:
        throttled.clear_faults()


def test_server_unavailable_when_the_upstream_is_down_and_the_step_may_be_retried(main, world, seen):
    faulty = world.faulty
    user = faulty.add_user(f"down-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    dialogue = Dialogue(main, seen, APP_FAULTY)
    first = expect_step(dialogue.begin(user.username), "password")
    try:
        faulty.stop()
        body = expect_error(dialogue.send(password=user.password), 503, "temporarily_unavailable", "server_unavailable")
    finally:
        faulty.start()
    assert AUTH_SESSION.fullmatch(body.get("auth_session") or "") and body["auth_session"] != first["auth_session"], body
    expect_code(dialogue.send(password=user.password))


def test_request_timeout_when_the_upstream_stalls(main, world, seen):
    faulty = world.faulty
    user = faulty.add_user(f"stall-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    dialogue = Dialogue(main, seen, APP_FAULTY)
    expect_step(dialogue.begin(user.username), "password")
    mark = faulty.mark()
    faulty.fault("stall")
    try:
        body = expect_error(dialogue.send(password=user.password), 504, "temporarily_unavailable", "request_timeout")
        assert faulty.held >= 1 and len(faulty.since(mark, grant_type=GRANT_PASSWORD)) == 1
    finally:
        faulty.release()
    assert AUTH_SESSION.fullmatch(body.get("auth_session") or ""), body
    expect_code(dialogue.send(password=user.password))


def test_an_upstream_rate_limit_is_too_many_requests_with_retry_after(main, world, seen):
    throttled = world.throttled
    user = throttled.add_user(f"limited-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    dialogue = Dialogue(main, seen, APP_THROTTLED)
    current = expect_step(dialogue.begin(user.username), "password")["auth_session"]
    mark = throttled.mark()
    throttled.fault("429", retry_after=13)
    try:
        body = expect_too_many(dialogue.send(password=user.password))
    finally:
        throttled.clear_faults()
    assert len(throttled.since(mark, grant_type=GRANT_PASSWORD)) <= 1
    # With a new auth_session the dialogue goes on with it; without one, the current stays valid.
    assert dialogue.auth_session == body.get("auth_session", current)


def test_an_unusable_upstream_answer_is_authentication_failure(main, world, seen):
    faulty = world.faulty
    user = faulty.add_user(f"garbage-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    dialogue = Dialogue(main, seen, APP_FAULTY)
    expect_step(dialogue.begin(user.username), "password")
    faulty.fault("garbage")
    try:
        body = expect_error(dialogue.send(password=user.password), 502, "server_error", "authentication_failure")
    finally:
        faulty.clear_faults()
    # It ends the dialogue: no next auth_session, and the one used is spent.
    assert "auth_session" not in body, body
    expect_error(dialogue.send(password=user.password), 400, "invalid_session")


def test_failed_to_send_email_when_the_mail_relay_is_down(mailless, world, seen):
    account = take_account(world)
    wrong = secrets.token_urlsafe(18)
    seen.add(wrong, kind="password typed in the app")
    dialogue = Dialogue(mailless, seen, APP_DOT)
    expect_step(dialogue.begin(account[0]), "password")
    expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    mark = world.wire.mark()
    body = expect_error(dialogue.send(password=account[1]), 503, "temporarily_unavailable", "failed_to_send_email")
    assert AUTH_SESSION.fullmatch(body.get("auth_session") or ""), body
    assert password_grants(world.wire.since(mark)) == [], "the password went upstream without an unblock code"
    # The same step may be retried: the relay is still down, so the same answer.
    expect_error(dialogue.send(password=account[1]), 503, "temporarily_unavailable", "failed_to_send_email")


def test_an_invalid_email_address_for_the_email_link_upstream(main, world, seen):
    before = world.central.stats()
    for address in ("not-an-address", "two@@example.test", "@example.test"):
        body = expect_error(Dialogue(main, seen, APP_CENTRAL).begin(address), 400, "invalid_request", "invalid_email_address")
        assert "auth_session" not in body
    assert [e for e in centrald_log(world, before) if e["endpoint"] == "email"] == []


def test_the_address_limit_stops_spraying_many_accounts_from_one_address(limited, world, seen):
    address, mark = fresh_address(), world.wire.mark()
    accounts = [take_account(world) for _ in range(LIMITED_ADDRESS_BURST)]
    guesses = {account[0]: secrets.token_urlsafe(18) for account in accounts}
    seen.add(*guesses.values(), kind="password typed in the app")
    answers = []
    for account in accounts:
        dialogue = Dialogue(limited, seen, APP_DOT, address=address)
        first = dialogue.begin(account[0])
        answers.append(first.status_code)
        if first.status_code == 429:
            expect_too_many(first)
            assert "auth_session" not in first.json()
            continue
        answer = dialogue.send(password=guesses[account[0]])
        answers.append(answer.status_code)
    # Every request of the address counts: 6 requests are 3 dialogues, then 429 from the 7th on.
    assert answers == [403] * LIMITED_ADDRESS_BURST + [429] * (len(accounts) - LIMITED_ADDRESS_BURST // 2), answers
    assert len(password_grants(world.wire.since(mark))) == LIMITED_ADDRESS_BURST // 2
    # Another address is not affected.
    expect_step(Dialogue(limited, seen, APP_DOT).begin(take_account(world)[0]), "password")


def test_spraying_one_account_from_many_addresses_meets_the_unblock_code_and_the_account_limit(limited, world, seen):
    account, mark, mail_mark = take_account(world), world.wire.mark(), world.sink.count()
    guesses = [secrets.token_urlsafe(18) for _ in range(10)]
    seen.add(*guesses, kind="password typed in the app")
    outcomes = []
    for guess in guesses:
        dialogue = Dialogue(limited, seen, APP_DOT)  # a new address each time
        first = dialogue.begin(account[0])
        if first.status_code == 429:
            expect_too_many(first)
            outcomes.append("limited")
            continue
        expect_step(first, "password")
        answer = dialogue.send(password=guess)
        if answer.status_code == 429:
            expect_too_many(answer)
            outcomes.append("limited")
        elif json_answer(answer).get("step") == "unblock_code":
            expect_step(answer, "unblock_code")
            outcomes.append("unblock")
        else:
            expect_step(answer, "password", failure="incorrect_password")
            outcomes.append("incorrect")
    # Counted per account, whatever the address: 3 failures, then only the unblock code or the limit.
    assert outcomes[:UNBLOCK_AFTER] == ["incorrect"] * UNBLOCK_AFTER, outcomes
    assert outcomes[UNBLOCK_AFTER] == "unblock", outcomes
    assert set(outcomes[UNBLOCK_AFTER:]) <= {"unblock", "limited"} and "limited" in outcomes, outcomes
    assert len(password_grants(world.wire.since(mark), account[0])) == UNBLOCK_AFTER
    assert 1 <= len(mails_to(world, account[0], mail_mark)) <= LIMITED_ACCOUNT_BURST


# =========================================================================== the dialogue on the wire, and attacks

def test_each_answer_is_the_contracts_and_the_code_is_redeemed_with_pkce_only(main, world, seen):
    account = take_account(world)
    wrong = secrets.token_urlsafe(18)
    seen.add(wrong, kind="password typed in the app")
    dialogue = Dialogue(main, seen, APP_DOT)
    first = expect_step(dialogue.begin(account[0], scope=DOT_SCOPE), "password")
    assert set(first) - {"error_description"} == {"error", "auth_session", "step"}, sorted(first)
    second = expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    assert second["auth_session"] != first["auth_session"], "the auth_session did not change"
    code = expect_code(dialogue.send(password=account[1]))
    # A verifier that is not the challenge's is refused; the right one (no redirect_uri) gets the tokens, once.
    assert dialogue.redeem(code, verifier=pkce_pair()[0]).status_code == 400
    other = Dialogue(main, seen, APP_DOT)
    expect_step(other.begin(account[0], scope=DOT_SCOPE), "password")
    code = expect_code(other.send(password=account[1]))
    tokens = other.redeem(code)
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["token_type"] == "Bearer" and tokens.json()["access_token"].startswith("gha_"), tokens.json()
    again = other.redeem(code)
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"


def test_redirect_to_web_request_uri_signs_in_in_the_browser(main, world, seen):
    account = take_account(world)
    dialogue = Dialogue(main, seen, APP_BROWSER)
    state = secrets.token_urlsafe(16)
    answer = dialogue.begin(None, redirect_uri=APP_REDIRECT, state=state, scope=DOT_SCOPE)  # no login_hint needed here
    body = expect_error(answer, 403, "redirect_to_web")
    assert body.get("request_uri") and body.get("expires_in") == 600, body
    url = f"{main['url']}/oauth/authorize?client_id={APP_BROWSER}&request_uri={requests.utils.quote(body['request_uri'], safe='')}"
    location = InAppBrowser(username=account[0], password=account[1], seen=seen).follow(url, APP_REDIRECT)
    assert isinstance(location, str), f"the browser sign-in stopped at {location.status_code}: {location.text[:300]}"
    received = query(location)
    assert received.get("state") == state and received.get("code"), received
    seen.add(received["code"], kind="Gatehouse code")
    tokens = requests.post(main["url"] + "/oauth/token", timeout=30, data={
        "grant_type": "authorization_code", "client_id": APP_BROWSER, "code": received["code"],
        "redirect_uri": APP_REDIRECT, "code_verifier": dialogue.verifier})
    remember_tokens(seen, tokens)
    assert tokens.status_code == 200, tokens.text


def test_an_auth_session_is_single_use(main, world, seen):
    account = take_account(world)
    wrong = secrets.token_urlsafe(18)
    seen.add(wrong, kind="password typed in the app")
    dialogue = Dialogue(main, seen, APP_DOT)
    used = expect_step(dialogue.begin(account[0]), "password")["auth_session"]
    expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    mark = world.wire.mark()
    for replayed in (used, used):
        expect_error(dialogue.send(auth_session=replayed, password=account[1]), 400, "invalid_session")
    assert world.wire.since(mark) == [], "a replayed auth_session reached the upstream"
    made_up = secrets.token_urlsafe(32)
    expect_error(dialogue.send(auth_session=made_up, password=account[1]), 400, "invalid_session")
    assert world.wire.since(mark) == []


def test_another_dpop_key_ends_the_dialogue_and_reaches_no_upstream(main, world, seen):
    account = take_account(world)
    owner, thief = Key(), Key()
    dialogue = Dialogue(main, seen, APP_DOT, key=owner)
    expect_step(dialogue.begin(account[0], scope=DOT_SCOPE), "password")
    mark = world.wire.mark()
    stolen = expect_error(dialogue.send(key=thief, password=account[1]), 400, "invalid_dpop_proof")
    assert "auth_session" not in stolen, "the thief was handed the next auth_session"
    # The dialogue is over: its owner starts again too.
    expect_error(dialogue.send(password=account[1]), 400, "invalid_session")
    assert world.wire.since(mark) == [], "a request of another key reached the upstream"


def test_a_malformed_or_missing_proof_is_refused_before_the_upstream(main, world, seen):
    account = take_account(world)
    owner = Key()
    dialogue = Dialogue(main, seen, APP_DOT, key=owner)
    current = expect_step(dialogue.begin(account[0], scope=DOT_SCOPE), "password")["auth_session"]
    mark = world.wire.mark()
    for proof in ("not-a-proof", owner.proof("POST", dialogue.url).rsplit(".", 1)[0] + ".AAAA"):
        body = expect_error(dialogue.send(proof=proof, password=account[1]), 400, "invalid_dpop_proof")
        assert "auth_session" not in body, body
    assert world.wire.since(mark) == []
    # A proof Gatehouse could not read leaves the dialogue as it was: the owner goes on.
    assert dialogue.auth_session == current
    code = expect_code(dialogue.send(password=account[1]))
    tokens = dialogue.redeem(code)
    assert tokens.status_code == 200 and tokens.json()["token_type"] == "DPoP", tokens.text
    # Without a proof at all: refused as well, and nothing goes upstream.
    other = Dialogue(main, seen, APP_DOT, key=owner)
    expect_step(other.begin(account[0], scope=DOT_SCOPE), "password")
    mark = world.wire.mark()
    body = expect_error(other.send(key=None, password=account[1]), 400, "invalid_dpop_proof")
    assert "auth_session" not in body and world.wire.since(mark) == []


def test_the_code_of_a_bound_dialogue_is_refused_to_another_key(main, world, seen):
    account = take_account(world)
    dialogue = Dialogue(main, seen, APP_DOT, key=Key())
    expect_step(dialogue.begin(account[0], scope=DOT_SCOPE), "password")
    code = expect_code(dialogue.send(password=account[1]))
    refused = dialogue.redeem(code, key=Key())
    assert refused.status_code == 400 and refused.json()["error"] in ("invalid_grant", "invalid_dpop_proof"), refused.text
    assert "access_token" not in refused.json()


def test_a_finished_dialogue_cannot_be_continued(main, world, seen):
    account = take_account(world)
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(account[0]), "password")
    last = dialogue.auth_session
    expect_code(dialogue.send(password=account[1]))
    mark = world.wire.mark()
    expect_error(dialogue.send(auth_session=last, password=account[1]), 400, "invalid_session")
    assert world.wire.since(mark) == []


def test_another_apps_auth_session_is_invalid_session(main, world, seen):
    account = take_account(world)
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(account[0]), "password")
    mark = world.wire.mark()
    other_app = Dialogue(main, seen, APP_AUTH0)
    expect_error(other_app.send(auth_session=dialogue.auth_session, password=account[1]), 400, "invalid_session")
    assert world.wire.since(mark) == []


def expect_refused_step(dialogue, **fields):
    """400 invalid_request for a request with another step's fields; the dialogue goes on at its
    step with the next auth_session the refusal carries (the one shown is spent)."""
    current = dialogue.auth_session
    body = expect_error(dialogue.send(**fields), 400, "invalid_request")
    assert AUTH_SESSION.fullmatch(body.get("auth_session") or "") and body["auth_session"] != current, body
    return body


def test_a_step_cannot_be_skipped_and_the_dialogue_stays_at_its_step(main, world, seen):
    account = take_account(world)
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(account[0]), "password")
    mark = world.wire.mark()
    # Four refusals: each counts as a wrong input, fewer than in_app_sign_in.attempts.
    for fields in ({"otp": "123456"}, {"unblock_code": "123456"}, {"resend": "unblock_code"},
                   {"password": account[1], "otp": "123456"}):
        spent = dialogue.auth_session
        expect_refused_step(dialogue, **fields)
    assert world.wire.since(mark) == [], "a refused step reached the upstream"
    expect_error(dialogue.send(auth_session=spent, password=account[1]), 400, "invalid_session")
    expect_code(dialogue.send(password=account[1]))


def test_the_password_cannot_be_sent_again_at_the_totp_step(main, world, seen):
    auth0 = world.auth0
    user = auth0.add_user(f"skip-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18), mfa=True)
    dialogue = Dialogue(main, seen, APP_AUTH0)
    expect_step(dialogue.begin(user.username), "password")
    expect_step(dialogue.send(password=user.password), "otp")
    mark = auth0.mark()
    for fields in ({"password": user.password}, {"unblock_code": "123456"}, {"password": user.password, "otp": auth0.code(user)}):
        expect_refused_step(dialogue, **fields)
    assert auth0.since(mark) == [], "a refused step reached Auth0"
    expect_code(dialogue.send(otp=auth0.code(user)))


def test_too_many_wrong_inputs_end_the_dialogue(main, world, seen):
    auth0 = world.auth0
    user = auth0.add_user(f"attempts-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18), mfa=True)
    dialogue = Dialogue(main, seen, APP_AUTH0)
    expect_step(dialogue.begin(user.username), "password")
    expect_step(dialogue.send(password=user.password), "otp")
    mark = auth0.mark()
    answers = []
    for _ in range(ATTEMPTS + 1):
        last = dialogue.auth_session
        answer = dialogue.send(otp=auth0.wrong_code(user))
        answers.append(answer)
        if answer.status_code == 429:
            break
        expect_step(answer, "otp", failure="invalid_totp_code")
    # The fifth wrong input ends the dialogue (at the latest the sixth request is refused), and no
    # more than five wrong codes reached Auth0.
    assert answers[-1].status_code == 429, [a.status_code for a in answers]
    assert "auth_session" not in expect_too_many(answers[-1]), "the ended dialogue handed out a next auth_session"
    assert len(answers) in (ATTEMPTS, ATTEMPTS + 1), len(answers)
    assert len(auth0.since(mark, grant_type=GRANT_MFA_OTP)) <= ATTEMPTS
    ended = auth0.mark()
    expect_error(dialogue.send(auth_session=last, otp=auth0.code(user)), 400, "invalid_session")
    assert auth0.since(ended) == []


def test_failures_count_per_account_across_dialogues_and_addresses(main, world, seen):
    account = take_account(world)
    wrongs = [secrets.token_urlsafe(18) for _ in range(UNBLOCK_AFTER)]
    seen.add(*wrongs, kind="password typed in the app")
    mark, mail_mark = world.wire.mark(), world.sink.count()
    for wrong in wrongs:  # one failure per dialogue, each from its own address
        dialogue = Dialogue(main, seen, APP_DOT)
        expect_step(dialogue.begin(account[0]), "password")
        expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(account[0]), "password")
    expect_step(dialogue.send(password=account[1]), "unblock_code")
    assert len(password_grants(world.wire.since(mark), account[0])) == UNBLOCK_AFTER, "the blocked password went upstream"
    code = unblock_mail(world, account[0], mail_mark)
    wrong_code = f"{(int(code) + 7) % 1_000_000:06d}"
    expect_step(dialogue.send(unblock_code=wrong_code, password=account[1]), "unblock_code", failure="invalid_unblock_code")
    assert len(password_grants(world.wire.since(mark), account[0])) == UNBLOCK_AFTER, "a wrong unblock code let the password through"
    expect_code(dialogue.send(unblock_code=code, password=account[1]))
    grants = password_grants(world.wire.since(mark), account[0])
    assert len(grants) == UNBLOCK_AFTER + 1 and grants[-1].fields["password"] == account[1]


def test_resending_the_unblock_code_is_limited_per_dialogue(main, world, seen):
    account = take_account(world)
    wrongs = [secrets.token_urlsafe(18) for _ in range(UNBLOCK_AFTER)]
    seen.add(*wrongs, kind="password typed in the app")
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(account[0]), "password")
    for wrong in wrongs:
        expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    mail_mark = world.sink.count()
    expect_step(dialogue.send(password=account[1]), "unblock_code")
    unblock_mail(world, account[0], mail_mark)
    for _ in range(RESENDS):  # in_app_sign_in.resends: e-mails beyond the first
        before = world.sink.count()
        expect_step(dialogue.send(resend="unblock_code"), "unblock_code")
        latest = unblock_mail(world, account[0], before)
    expect_too_many(dialogue.send(resend="unblock_code"))
    assert len(mails_to(world, account[0], mail_mark)) == 1 + RESENDS
    # The latest code still opens the dialogue (the refused resend left it as it was, or handed the next auth_session).
    expect_code(dialogue.send(unblock_code=latest, password=account[1]))


def test_known_and_unknown_accounts_answer_alike(main, world, seen):
    """A known and an unknown account get the same answers, step for step: status and whole
    body, but the auth_session's value (random). The medians of their password answers' response
    times are printed, not asserted (a shared test machine is no place to judge a timing channel)."""
    from statistics import median

    def whole(answer):
        body = json_answer(answer)
        if "auth_session" in body:
            assert AUTH_SESSION.fullmatch(body["auth_session"]), body
            body = {**body, "auth_session": "<random>"}
        return answer.status_code, body

    known, unknown = take_account(world)[0], f"nobody-{secrets.token_hex(4)}@example.test"
    guesses = [secrets.token_urlsafe(18) for _ in range(2 * (UNBLOCK_AFTER + 1))]
    seen.add(*guesses, kind="password typed in the app")
    answers, times, mail_mark = {}, {}, world.sink.count()
    for address in (known, unknown):
        dialogue = Dialogue(main, seen, APP_DOT)
        replies = [dialogue.begin(address)] + [dialogue.send(password=guesses.pop()) for _ in range(UNBLOCK_AFTER + 1)]
        answers[address] = [whole(reply) for reply in replies]
        times[address] = [reply.elapsed.total_seconds() for reply in replies[1:]]
    assert answers[known] == answers[unknown], answers
    assert answers[known][-1][1]["step"] == "unblock_code", answers[known]
    print(f"password answers, median response time: known account {median(times[known]) * 1000:.1f} ms, "
          f"unknown account {median(times[unknown]) * 1000:.1f} ms ({len(times[known])} each)")
    # The unblock code goes out either way: Gatehouse cannot tell, and the answer does not either.
    for address in (known, unknown):
        world.sink.wait_for(address, after=mail_mark)
    # The e-mail link upstream "sends" its link to anyone alike.
    central = [whole(Dialogue(main, seen, APP_CENTRAL).begin(address)) for address in
               (f"known-{secrets.token_hex(3)}@example.test", f"unknown-{secrets.token_hex(3)}@example.test")]
    assert central[0] == central[1], central
    assert central[0][0] == 403 and central[0][1]["step"] == "email_link", central


def test_every_attempt_relays_the_password_once_and_only_to_the_token_endpoint(main, world, seen):
    account = take_account(world)
    wrongs = [secrets.token_urlsafe(18) for _ in range(2)]
    seen.add(*wrongs, kind="password typed in the app")
    mark = world.wire.mark()
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(account[0], scope=DOT_SCOPE), "password")
    for wrong in wrongs:
        expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    tokens = dialogue.redeem(expect_code(dialogue.send(password=account[1]))).json()
    # Using the tokens (an introspection, a refresh) sends no password either.
    assert relay(main, "/api/inapp-dot/x", tokens["access_token"]).status_code == 200
    assert refreshes(main, APP_DOT, tokens["refresh_token"], seen).status_code == 200
    arrivals = world.wire.since(mark)
    secret = world.env["UPSTREAM_SECRET_LEGACY"]
    for password in (*wrongs, account[1]):
        assert_password_only_at_the_token_endpoint(arrivals, password, 1, "/o/token/", secret, "client_secret_basic")
    assert [a.fields["password"] for a in password_grants(arrivals, account[0])] == [*wrongs, account[1]]


def test_a_bound_dialogue_keeps_the_password_off_every_other_path(main, world, seen):
    """The same over the Auth0 double (client_secret_post), with a challenge endpoint configured."""
    auth0 = world.auth0
    user = auth0.add_user(f"wire-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18), mfa=True)
    mark = auth0.mark()
    dialogue = Dialogue(main, seen, APP_AUTH0, key=Key())
    expect_step(dialogue.begin(user.username, scope=AUTH0_SCOPE), "password")
    expect_step(dialogue.send(password=user.password), "otp")
    code = expect_code(dialogue.send(otp=auth0.code(user)))
    assert dialogue.redeem(code).status_code == 200
    arrivals = auth0.since(mark)
    assert_password_only_at_the_token_endpoint(arrivals, user.password, 1, "/oauth/token", auth0.client_secret, "client_secret_post")
    assert all(a.client_authenticated for a in arrivals if a.path in ("/oauth/token", "/mfa/challenge"))


def test_a_refused_password_after_the_code_needs_a_new_code_and_success_clears_the_count(main, world, seen):
    account = take_account(world)
    wrongs = [secrets.token_urlsafe(18) for _ in range(UNBLOCK_AFTER + 2)]
    seen.add(*wrongs, kind="password typed in the app")
    mark = world.wire.mark()
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(account[0]), "password")
    for wrong in wrongs[:UNBLOCK_AFTER]:
        expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    mail_mark = world.sink.count()
    expect_step(dialogue.send(password=account[1]), "unblock_code")
    first = unblock_mail(world, account[0], mail_mark)
    # The code with a password the upstream refuses: back to the password step...
    expect_step(dialogue.send(unblock_code=first, password=wrongs[UNBLOCK_AFTER]), "password", failure="incorrect_password")
    # ... and the next password is met with a new code, which the old one does not replace.
    mail_mark = world.sink.count()
    expect_step(dialogue.send(password=account[1]), "unblock_code")
    second = unblock_mail(world, account[0], mail_mark)
    expect_code(dialogue.send(unblock_code=second, password=account[1]))
    grants = password_grants(world.wire.since(mark), account[0])
    assert [g.fields["password"] for g in grants] == [*wrongs[:UNBLOCK_AFTER + 1], account[1]]
    # A successful sign-in cleared the account's count: a failure now is an ordinary one.
    again = Dialogue(main, seen, APP_DOT)
    expect_step(again.begin(account[0]), "password")
    expect_step(again.send(password=wrongs[-1]), "password", failure="incorrect_password")
    expect_code(again.send(password=account[1]))


def test_an_account_that_is_no_email_address_goes_to_the_browser_when_blocked(main, world, seen):
    username, password = PLAIN_ACCOUNT
    wrongs = [secrets.token_urlsafe(18) for _ in range(UNBLOCK_AFTER)]
    seen.add(*wrongs, kind="password typed in the app")
    mark, mail_mark = world.wire.mark(), world.sink.count()
    dialogue = Dialogue(main, seen, APP_DOT)
    expect_step(dialogue.begin(username), "password")
    for wrong in wrongs:
        expect_step(dialogue.send(password=wrong), "password", failure="incorrect_password")
    expect_error(dialogue.send(password=password), 403, "redirect_to_web")
    assert len(password_grants(world.wire.since(mark), username)) == UNBLOCK_AFTER
    assert world.sink.count() == mail_mark, "an unblock code went somewhere for an account that is no e-mail address"


def register(gatehouse, app):
    answer = requests.post(gatehouse["url"] + "/oauth/register", json={"software_id": app}, timeout=10)
    assert answer.status_code == 201, answer.text
    return answer.json()["client_id"]


def test_an_uncertified_instance_passes_an_unblock_code_before_its_password_is_relayed(main, world, seen):
    account = take_account(world)
    instance = register(main, APP_INSTANCES)
    mark, mail_mark = world.wire.mark(), world.sink.count()
    dialogue = Dialogue(main, seen, instance)
    expect_step(dialogue.begin(account[0], scope=DOT_SCOPE), "password")
    expect_step(dialogue.send(password=account[1]), "unblock_code")
    assert password_grants(world.wire.since(mark)) == [], "an uncertified instance's password went upstream without a code"
    code = unblock_mail(world, account[0], mail_mark)
    tokens = dialogue.redeem(expect_code(dialogue.send(unblock_code=code, password=account[1])))
    assert tokens.status_code == 200, tokens.text
    assert [g.fields["password"] for g in password_grants(world.wire.since(mark))] == [account[1]]


def test_an_app_that_requires_attestation_has_no_dialogue_for_itself_or_an_uncertified_instance(main, world, seen):
    address = f"attested-{secrets.token_hex(4)}@example.test"
    mark = world.wire.mark()
    for client_id in (APP_ATTESTED, register(main, APP_ATTESTED)):
        body = expect_error(Dialogue(main, seen, client_id).begin(address), 400, "unauthorized_client")
        assert "auth_session" not in body
    assert world.wire.since(mark) == []


def test_an_unreadable_request_leaves_the_auth_session_valid(main, world, seen):
    account = take_account(world)
    dialogue = Dialogue(main, seen, APP_DOT)
    current = expect_step(dialogue.begin(account[0]), "password")["auth_session"]
    mark = world.wire.mark()
    as_json = requests.post(dialogue.url, json={"client_id": APP_DOT, "auth_session": current, "password": account[1]},
                            headers={"X-Forwarded-For": dialogue.address}, timeout=30)
    assert as_json.status_code == 415, as_json.text
    assert "auth_session" not in as_json.text
    assert world.wire.since(mark) == []
    expect_code(dialogue.send(auth_session=current, password=account[1]))


def test_the_mfa_challenge_endpoint_is_called_when_configured(world, seen):
    """`mfa_challenge_endpoint` (optional): Gatehouse asks Auth0 for the OTP challenge, as documented,
    before the mfa-otp grant. A Gatehouse of its own: the key is this test's alone."""
    auth0 = world.auth0
    port = free_port()
    config = server_and_store(port, world.workdir / "in-app-challenge.sqlite") + f"""
upstreams:{auth0_upstream("auth0", auth0, "AUTH0_CLIENT_SECRET", "5s", extra=f'''
    mfa_challenge_endpoint: {auth0.challenge_endpoint}''')}
clients:{in_app_client(APP_AUTH0, "auth0", AUTH0_SCOPE)}
{mail_section(world.sink.port, world.sink.certificate)}
rate_limits:
  trusted_proxies: [127.0.0.1/32]
sessions:
  encryption_keys_file: {session_keys(world.workdir, "in-app-challenge-session-keys", seen)}
"""
    user = auth0.add_user(f"challenge-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18), mfa=True)
    with run_gatehouse(world.workdir, "in-app-challenge", config, world.env) as gatehouse:
        mark = auth0.mark()
        dialogue = Dialogue(gatehouse, seen, APP_AUTH0)
        expect_step(dialogue.begin(user.username), "password")
        expect_step(dialogue.send(password=user.password), "otp")
        expect_code(dialogue.send(otp=auth0.code(user)))
    arrivals = auth0.since(mark)
    mfa_token = password_grants(arrivals)[0].answer["mfa_token"]
    order = [(a.path, a.grant_type) for a in arrivals]
    assert order == [("/oauth/token", GRANT_PASSWORD), ("/mfa/challenge", None), ("/oauth/token", GRANT_MFA_OTP)], order
    challenge = arrivals[1]
    assert challenge.fields.get("mfa_token") == mfa_token and challenge.fields.get("challenge_type") == "otp", challenge.fields
    assert challenge.client_authenticated and challenge.status == 200 and not challenge.carries(user.password)


# =========================================================================== last: nothing of this module in its logs

def test_no_password_code_or_auth_session_reaches_this_modules_logs(main, world, seen):
    """This module's Gatehouses, upstreams and doubles, and the Swift driver's diagnostics."""
    logs = sorted(Path(world.workdir).glob("in-app-*.log")) + sorted(Path(world.workdir).glob("signin-driver-*.stderr"))
    assert Path(main["log"]) in logs
    leaks = [f"{path.name}: {kind} ({form})" for path in logs for kind, form in seen.find(path.read_bytes())]
    assert leaks == []


def test_the_endpoint_conforms_to_openapi_under_fuzzing(main, seen, tmp_path):
    """schemathesis (all of its checks, as test_schema runs them) over the authorization challenge
    endpoint of this module's Gatehouse, where apps sign in in the app: no 5xx on a bad input, every
    answer as the description says, schema-valid requests accepted or refused with a documented
    status. The whole-API run leaves the `in-app` tag out (its Gatehouse has no such app)."""
    from test_schema import BROWSER_ENDPOINT_STATUSES, run_schemathesis, toml_list
    FUZZ_CHALLENGE = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"  # RFC 7636 Appendix B
    clients = [APP_DOT, APP_AUTH0, APP_CENTRAL, APP_BROWSER, APP_WEB]
    served = run_schemathesis(main, seen, tmp_path / "in-app.toml", f"""
[dictionaries.client_ids]
values = {toml_list(clients)}

[dictionaries.challenges]
values = [{json.dumps(FUZZ_CHALLENGE)}]

[dictionaries.codes]
values = ["code"]

[dictionaries.methods]
values = ["S256"]

[dictionaries.accounts]
values = ["fuzz@example.test", "fuzzer"]

[dictionaries.empty]
values = [""]

[[operations]]
include-operation-id = "authorizationChallenge"
parameters = {{ "body.client_id" = {{ dictionary = "client_ids", probability = 0.9 }}, "body.code_challenge" = {{ dictionary = "challenges", probability = 0.9 }}, "body.response_type" = {{ dictionary = "codes", probability = 0.9 }}, "body.code_challenge_method" = {{ dictionary = "methods", probability = 0.9 }}, "body.login_hint" = {{ dictionary = "accounts", probability = 0.9 }}, "body.auth_session" = {{ dictionary = "empty", probability = 0.7 }}, "body.scope" = {{ dictionary = "empty", probability = 0.7 }} }}
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}
""", "--include-tag", "in-app", "--max-examples", os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "40"))
    print("served:", served.most_common())
    statuses = {status for (_, path, status) in served if path == "oauth/authorize-challenge"}
    # Drawn requests were read and refused or answered; none broke Gatehouse. (Whether a drawn
    # request reaches the first step depends on its random DPoP header and fields: the success
    # paths are this module's own tests.)
    assert "400" in statuses, served.most_common()
    assert not statuses & {"500", "501"}, served.most_common()


# --------------------------------------------------------------------------- two instances on PostgreSQL

def postgres_pair_config(world, port, database, keys, in_app="  unblock_after: 2"):
    """A Gatehouse on the `dot` upstream over the PostgreSQL `database`, with the
    `in_app_sign_in:` lines `in_app`."""
    host, pg_port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    return server_and_store(port, f"""  postgres:
    host: {host}
    port: {pg_port}
    database: {database}
    username: gatehouse
    pool_size: 4""") + f"""
upstreams:{dot_upstream(world)}
clients:{in_app_client(APP_DOT, "dot", DOT_SCOPE)}
{mail_section(world.sink.port, world.sink.certificate)}
in_app_sign_in:
{in_app}
rate_limits:
  trusted_proxies: [127.0.0.1/32]
sessions:
  encryption_keys_file: {keys}
"""


def new_database(prefix):
    """A database of its own on the suite's PostgreSQL; its name."""
    host, pg_port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    database = f"{prefix}_{secrets.token_hex(4)}"
    subprocess.run(["psql", "-h", host, "-p", pg_port, "-U", "gatehouse", "-d", "gatehouse", "-tAc", f"CREATE DATABASE {database}"],
                   check=True, capture_output=True, timeout=30)
    return database


@pytest.mark.skipif("GATEHOUSE_TEST_POSTGRES" not in os.environ, reason="needs GATEHOUSE_TEST_POSTGRES (scripts/test starts PostgreSQL)")
def test_two_instances_on_postgres_share_the_dialogue_and_the_failure_count_across_a_restart(world, seen):
    """The guarantees that live in the store, on another instance and after a restart: an
    auth_session begun on A continues on B and is then spent on A too; failed passwords counted on
    A and B block the account on a restarted A; the dialogue finishes on B and its code is redeemed
    on A; PostgreSQL holds no password, auth_session, code or account in clear."""
    host, pg_port = os.environ["GATEHOUSE_TEST_POSTGRES"].split(":")
    database = new_database("inapp")
    keys = session_keys(world.workdir, "in-app-pg-session-keys", seen)
    ports = [free_port(), free_port()]
    configs = [postgres_pair_config(world, port, database, keys) for port in ports]
    account, password = take_account(world)
    mark = world.wire.mark()
    with run_gatehouse(world.workdir, "in-app-pg-b", configs[1], world.env) as b:
        with run_gatehouse(world.workdir, "in-app-pg-a", configs[0], world.env) as a:
            # Begun on A, continued on B: one wrong password (the first failure).
            on_a = Dialogue(a, seen, APP_DOT)
            expect_step(on_a.begin(account), "password")
            first = on_a.auth_session
            on_b = Dialogue(b, seen, APP_DOT, address=on_a.address)
            wrong = on_b.send(auth_session=first, password="not-" + password)
            expect_step(wrong, "password", failure="incorrect_password")
            # The spent auth_session is refused on A too.
            assert on_a.send(auth_session=first, password=password).json()["error"] == "invalid_session"
            # The second failure, on A.
            expect_step(on_a.send(auth_session=on_b.auth_session, password="still-not-" + password), "password",
                        failure="incorrect_password")
            carried = on_a.auth_session
        # A restarts: the count is in the store, so its next password meets the unblock code.
        with run_gatehouse(world.workdir, "in-app-pg-a2", configs[0], world.env) as a:
            mail_mark = world.sink.count()
            again = Dialogue(a, seen, APP_DOT, address=on_a.address)
            asked = again.send(auth_session=carried, password=password)
            expect_step(asked, "unblock_code")
            code = unblock_mail(world, account, mail_mark)
            # Finished on B with the code and the password, redeemed on A.
            finish = Dialogue(b, seen, APP_DOT, address=on_a.address)
            done = finish.send(auth_session=again.auth_session, unblock_code=code, password=password)
            authorization_code = expect_code(done)
            tokens = again.redeem(authorization_code, verifier=on_a.verifier)
            assert tokens.status_code == 200, tokens.text
    # The password reached DOT's token endpoint once per relayed attempt: the two wrong ones and the right one.
    assert len(password_grants(world.wire.since(mark), account)) == 3
    dump = subprocess.run(["pg_dump", "-h", host, "-p", pg_port, "-U", "gatehouse", "--data-only", database],
                          check=True, capture_output=True, text=True, timeout=60).stdout
    for secret in [password, first, carried, code, authorization_code, account]:
        assert secret not in dump, "PostgreSQL holds an in-app secret or the account in clear"


# --------------------------------------------------------------------------- the hostile pass (issue 35)

AUTH0_ACCOUNT_STATES = {
    # state: (add_user options, the reason the user is told, what Auth0 answers the right password)
    "blocked": ({"blocked": True}, "blocked", 401),
    "leaked": ({"leaked": True}, "password_leaked", 401),
    "denied": ({"deny": "Only staff may sign in to this app."}, "denied", 403),
    "locked": ({}, "locked", 429),
}


def answer_shape(answer):
    """What an answer tells: its status, the headers that say anything, its whole body but the
    auth_session (random in every answer)."""
    body = json_answer(answer)
    assert AUTH_SESSION.fullmatch(body.pop("auth_session", "") or ""), body
    headers = {name.lower(): value for name, value in answer.headers.items()
               if name.lower() not in ("date", "content-length", "x-request-id", "traceparent")}
    return answer.status_code, headers, body


@pytest.mark.parametrize("state", sorted(AUTH0_ACCOUNT_STATES))
def test_an_auth0_refusal_of_the_account_answers_as_a_wrong_password_until_the_emailed_code(main, world, seen, state):
    """Auth0 refuses a blocked user, a breached password, an Action's denial and a user its
    brute-force protection locked only after (or whatever) the password: told apart, the answer
    would confirm a guessed password. Until the e-mailed code is passed it is a wrong password,
    whole answer alike; past the code the user learns what to do."""
    auth0 = world.auth0
    options, reason, status = AUTH0_ACCOUNT_STATES[state]
    user = auth0.add_user(f"refused-{state}-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18), **options)
    other = auth0.add_user(f"other-{state}-{secrets.token_hex(4)}@example.test", secrets.token_urlsafe(18))
    address = fresh_address()
    if state == "locked":
        # Ten failed logins of the user from the user's address, straight at Auth0 (another client).
        for _ in range(auth0.brute_force_threshold):
            refused = requests.post(auth0.token_endpoint, data={
                "grant_type": "password", "username": user.username, "password": "not-" + user.password,
                "client_id": auth0.client_id, "client_secret": auth0.client_secret}, headers={"auth0-forwarded-for": address}, timeout=10)
            assert refused.status_code == 403, refused.text
    guess = secrets.token_urlsafe(12)
    seen.add(guess, kind="password typed in the app")
    wrong = Dialogue(main, seen, APP_AUTH0)
    expect_step(wrong.begin(other.username), "password")
    wrong_answer = wrong.send(password=guess)
    mark = auth0.mark()
    dialogue = Dialogue(main, seen, APP_AUTH0, address=address)
    expect_step(dialogue.begin(user.username), "password")
    right = dialogue.send(password=user.password)
    assert answer_shape(right) == answer_shape(wrong_answer)
    for _ in range(UNBLOCK_AFTER - 1):
        expect_step(dialogue.send(password=user.password), "password", failure="incorrect_password")
    mail_mark = world.sink.count()
    expect_step(dialogue.send(password=user.password), "unblock_code")
    code = unblock_mail(world, user.username, mail_mark)
    told = dialogue.send(unblock_code=code, password=user.password)
    body = expect_error(told, 403, "access_denied", "account_refused")
    assert body.get("reason") == reason and body.get("dialogue_ended") is True and "auth_session" not in body, body
    # Every one of them reached Auth0 with the right password, and Auth0 itself refused it.
    grants = password_grants(auth0.since(mark), user.username)
    assert len(grants) == UNBLOCK_AFTER + 1
    assert all(g.fields["password"] == user.password and g.status == status for g in grants), [g.status for g in grants]


def test_a_web_page_cannot_make_its_visitors_start_a_dialogue(main, world, seen, browser):
    """A cross-site form needs no CORS: a page could make every visitor's browser post a first
    request that has the central provider e-mail a sign-in link to a chosen address. Chromium
    submits such a page's form; Gatehouse refuses it before any e-mail, and the same request from
    an app (no browser headers) does send the link."""
    victim = f"page-victim-{secrets.token_hex(4)}@example.test"
    target = main["url"] + CHALLENGE
    fields = {"client_id": APP_CENTRAL, "response_type": "code", "code_challenge": pkce_pair()[1],
              "code_challenge_method": "S256", "login_hint": victim}
    inputs = "".join(f'<input type="hidden" name="{name}" value="{value}">' for name, value in fields.items())
    page = (f'<!doctype html><title>win a prize</title><form id=f method=post action="{target}">{inputs}</form>'
            '<script>document.getElementById("f").submit()</script>').encode()

    class Page(StubServer):
        class Handler(StubHandler):
            def do_GET(self):
                self.reply(200, page, "text/html")

    site = Page()
    before = world.central.stats()
    try:
        mark = main["lines"].mark()
        # Another site (localhost is not 127.0.0.1's site): the browser sends Origin and Sec-Fetch-*.
        browser.get(f"http://localhost:{site.port}/")
        main["lines"].wait_for(r"authorization challenge refused: sent by a browser", timeout=30, since=mark)
        assert "invalid_request" in browser.page_source, browser.page_source[:500]
    finally:
        site.stop()
    assert [e for e in centrald_log(world, before) if e["endpoint"] == "email"] == [], "a web page had a sign-in link e-mailed"
    # The same first request from an app goes through: the link is sent.
    app = Dialogue(main, seen, APP_CENTRAL)
    expect_step(app.begin(victim), "email_link")
    assert len([e for e in centrald_log(world, before) if e["endpoint"] == "email"]) == 1


def test_an_oversized_body_is_413_as_at_the_token_endpoint(main):
    for path in (CHALLENGE, "/oauth/token"):
        answer = requests.post(main["url"] + path, data={"client_id": APP_DOT, "pad": "a" * 2_000_000},
                               headers={"X-Forwarded-For": fresh_address()}, timeout=30)
        assert answer.status_code == 413, (path, answer.status_code, answer.text[:200])
        assert answer.headers["Content-Type"].startswith("application/problem+json"), answer.headers


SPRAYING_LIMITS = """  accounts_per_address: 3
  accounts_window: 1d
  breaker_failures: 8
  breaker_window: 10m"""


@pytest.mark.skipif("GATEHOUSE_TEST_POSTGRES" not in os.environ, reason="needs GATEHOUSE_TEST_POSTGRES (scripts/test starts PostgreSQL)")
def test_spraying_one_password_over_many_accounts_is_capped_on_every_instance_and_after_a_restart(world, seen):
    """One common password against many accounts stays under every per-account limit. Counted in
    PostgreSQL: one address range gets passwords relayed for at most `accounts_per_address`
    accounts, on either instance and after a restart (past it the password waits for the code
    e-mailed to the account); and once the upstream's wrong passwords reach `breaker_failures`,
    every dialogue, from any address, passes the e-mailed code first."""
    database = new_database("spray")
    keys = session_keys(world.workdir, "spray-session-keys", seen)
    ports = [free_port(), free_port()]
    configs = [postgres_pair_config(world, port, database, keys, in_app=SPRAYING_LIMITS) for port in ports]
    common = "Summer2026!" + secrets.token_hex(2)
    seen.add(common, kind="password typed in the app")
    attacker = fresh_address()
    victims = [f"spray-{n}-{secrets.token_hex(3)}@example.test" for n in range(5)]
    mark = world.wire.mark()

    def spray(gatehouse, account, address=attacker):
        dialogue = Dialogue(gatehouse, seen, APP_DOT, address=address)
        expect_step(dialogue.begin(account), "password")
        return dialogue.send(password=common)

    with run_gatehouse(world.workdir, "spray-b", configs[1], world.env) as b:
        with run_gatehouse(world.workdir, "spray-a", configs[0], world.env) as a:
            # Three accounts, over both instances: relayed (and wrong).
            for gatehouse, account in zip([a, b, a], victims):
                expect_step(spray(gatehouse, account), "password", failure="incorrect_password")
            # A fourth, on either: its password waits for the code e-mailed to the account.
            mail_mark = world.sink.count()
            for gatehouse in (a, b):
                expect_step(spray(gatehouse, victims[3]), "unblock_code")
            assert len(mails_to(world, victims[3], mail_mark)) == 2
            assert a["lines"].wait_for(r"in_app_accounts_per_address", timeout=10)
        # A restarted A still counts the address's accounts.
        with run_gatehouse(world.workdir, "spray-a2", configs[0], world.env) as a:
            expect_step(spray(a, victims[4]), "unblock_code")
            # An account it tried already is no new one.
            expect_step(spray(a, victims[0]), "password", failure="incorrect_password")
            sprayed = [g.fields["username"] for g in password_grants(world.wire.since(mark)) if g.fields.get("password") == common]
            assert sorted(sprayed) == sorted(victims[:3] + [victims[0]]), sprayed
            # Other addresses push the upstream's wrong passwords to the breaker's line (8)...
            for n in range(4):
                expect_step(spray(b if n % 2 else a, f"spray-more-{n}-{secrets.token_hex(3)}@example.test", address=fresh_address()),
                            "password", failure="incorrect_password")
            # ...and it trips for everyone: a real account from a fresh address passes the e-mailed code first.
            account, password = take_account(world)
            mail_mark, wire_mark = world.sink.count(), world.wire.mark()
            dialogue = Dialogue(b, seen, APP_DOT)
            expect_step(dialogue.begin(account), "password")
            expect_step(dialogue.send(password=password), "unblock_code")
            assert password_grants(world.wire.since(wire_mark), account) == []
            code = unblock_mail(world, account, mail_mark)
            expect_code(dialogue.send(unblock_code=code, password=password))
            tripped = [line for g in (a, b) for line in g["lines"].lines_since(0) if "sign_in_breaker_tripped" in line]
            assert len(tripped) == 1, tripped
