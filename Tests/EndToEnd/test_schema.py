"""The live Gatehouse against its own OpenAPI description, with schemathesis and all of its
checks (its default): no 5xx, no answer that breaks the description, schema-valid requests
accepted, schema-invalid ones rejected, unsupported methods refused with a matching `Allow`.

Success paths are checked too, not only refusals:

- the fuzzer runs over the whole API with a live access token on the relay's operations (its
  identity cached), live tokens to revoke, and registered client_ids and redirect URIs drawn
  at the authorization endpoint;
- what no generator can draw (a live state at the callback, a live code, a sealed session's and
  a passthrough session's refresh tokens with their own app, their access tokens on the relay)
  is sent by hand and checked by schemathesis with the same checks, one request at a time;
- the OpenID Connect endpoints toward the app (/userinfo, /oauth/logout and its callback) are
  fuzzed on the suite's Gatehouse (whose upstreams are plain OAuth 2.0: 401, 404, 400), and their
  success paths (userinfo 200, Gatehouse's own ID token, the logout through the upstream's
  end-session endpoint and back) on a Gatehouse of this module's own in front of the FranceConnect
  v2 double (sandbox/franceconnect/), fuzzed and sent by hand;
- a `central` upstream's endpoints (the seed's /auth/*, the provider's return to
  /app/auth/callback, its RSA keys in the JWKS) on another Gatehouse of this module's own in front
  of the central sign-in provider double (sandbox/central/), fuzzed (with live codes,
  refresh tokens and Apple identity tokens among the values drawn) and sent by hand, the standard
  face (authorize, the provider, the cookie-bound callback, the token endpoint, the relay) included.
  The suite's Gatehouse has no central upstream, so the whole-API run leaves the `central` tag out;
  nor an app with in-app sign-in, so it leaves the `in-app` tag out too (test_in_app_sign_in
  fuzzes that endpoint on a Gatehouse of its own).

The fuzzer's configuration (it holds live tokens) is written to the test's own folder, never to
a log; output is shown with every known secret replaced (schemathesis masks the Authorization
header, not a token in a form body).
"""

import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests
import schemathesis

from sandbox.gatelog import fields, request_id_of
from sandbox.nativeapp import APP_REDIRECT, App, InAppBrowser, free_port, query
from processes import run_gatehouse, session_keys
from sandbox.gatehouse import server_and_store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the sandbox package
from sandbox import central as ctd  # noqa: E402
from sandbox import franceconnect as fcd  # noqa: E402

SEED = "20261123"

#: Statuses a schema-valid request may get (schemathesis' default for positive_data_acceptance),
#: plus 400 for the two browser endpoints whose parameters name something Gatehouse registered or
#: issued: an unknown client_id at /oauth/authorize must get a 400 page, never a redirect (RFC 6749
#: §4.1.2.1), and an unknown state at /oauth/callback too. A schema can say what such a value
#: looks like, never that it exists (schemathesis makes the same exception by itself for the token
#: endpoint of an OAuth 2.0 security scheme). The same holds for the endpoints of app instances
#: (`instances` tag): a registration's `software_id`, an instance's `client_id`, a challenge, a
#: session code or a paused sign-in can be drawn well-formed, never registered or issued.
#: Any other status on a schema-valid request fails.
BROWSER_ENDPOINT_STATUSES = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]

#: /api/{rest} is one path for every route: the relay's operations go to /api/schema, the route
#: that takes every method the description documents (a route that takes fewer answers 405 to the
#: others, and lists fewer in Allow). Arbitrary paths are test_relay_edge's (3,000 of them).
RELAY_REST = "schema"


def toml_list(values):
    return "[" + ", ".join(json.dumps(value) for value in values) + "]"


def live_pairs(gatehouse, seen, client_id, count):
    pairs = []
    for _ in range(count):
        app = App(gatehouse, seen, client_id=client_id)
        answer = app.redeem(app.sign_in()["code"])
        assert answer.status_code == 200, answer.text
        pairs.append(answer.json())
    return pairs


def served_since(gatehouse, mark):
    """Counter of (method, first two path segments, status) of the requests Gatehouse logged since `mark`."""
    served = Counter()
    for meta in map(fields, gatehouse["lines"].lines_since(mark)):
        if meta.get("status") and meta.get("request_id"):
            segments = meta.get("path", "").strip("/").split("/")
            served[(meta.get("method"), "/".join(segments[:2]), meta["status"])] += 1
    return served


def run_schemathesis(gatehouse, seen, config_path, config, *arguments):
    """Runs `st run` with `config` (TOML) against a live Gatehouse (`url`, `lines`); fails with its
    report (secrets redacted) unless every check passed. Returns what Gatehouse served meanwhile."""
    config_path.touch(mode=0o600)
    config_path.write_text(config)
    st = Path(sys.executable).parent / "st"
    # One worker: Python 3.11's ast module keeps its recursion depth in global state, and
    # hypothesis parses the source of its filters from every worker thread at once (CPython
    # gh-106905: "SystemError: AST constructor recursion depth mismatch", fixed in 3.12).
    mark = gatehouse["lines"].mark()
    started = time.monotonic()
    result = subprocess.run([str(st), "--config-file", str(config_path), "run", str(ROOT / "openapi/gatehouse.yaml"),
                             "--url", gatehouse["url"], "--seed", SEED, "--no-color", "--suppress-health-check", "all",
                             "--workers", "1", *arguments],
                            capture_output=True, text=True, timeout=300)
    report = seen.redact(result.stdout[-8000:] + result.stderr[-2000:])
    print(f"{config_path.name}: {time.monotonic() - started:.1f} s\n{report[-3000:]}")
    assert result.returncode == 0, report
    # Request lines are written as answers go out: one more request, once schemathesis is done,
    # and its line, so that the lines of every request before are in.
    sentinel = requests.get(gatehouse["url"] + "/healthz", timeout=10)
    gatehouse["lines"].request(request_id_of(sentinel))
    return served_since(gatehouse, mark)


def test_live_gatehouse_conforms_to_openapi(gatehouse, tokens, seen, tmp_path):
    bearer = tokens.warm("/api/contracts")  # alice's, identity cached: relayed calls succeed
    doomed = live_pairs(gatehouse, seen, "com.example.sealed", 1) + live_pairs(gatehouse, seen, "com.example.app", 1)
    # A sealed session of a plain OAuth 2.0 upstream: /userinfo knows it, and has no userinfo for it (404).
    sealed = live_pairs(gatehouse, seen, "com.example.sealed", 1)[0]["access_token"]
    served = run_schemathesis(gatehouse, seen, tmp_path / "whole-api.toml", f"""
[dictionaries.client_ids]
values = ["com.example.app", "com.example.sealed"]

[dictionaries.redirect_uris]
values = [{json.dumps(APP_REDIRECT)}]

[dictionaries.revocable]
values = {toml_list([pair[kind] for pair in doomed for kind in ("access_token", "refresh_token")])}

[[operations]]
include-tag = "relay"
headers = {{ Authorization = {json.dumps("Bearer " + bearer)} }}
parameters = {{ "path.rest" = {json.dumps(RELAY_REST)} }}

[[operations]]
include-operation-id = "authorize"
parameters = {{ "query.client_id" = {{ dictionary = "client_ids", probability = 0.9 }}, "query.redirect_uri" = {{ dictionary = "redirect_uris", probability = 0.9 }} }}
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}

[[operations]]
include-operation-id = "authorizationCallback"
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}

[[operations]]
include-operation-id = "revoke"
parameters = {{ "body.client_id" = {{ dictionary = "client_ids", probability = 0.9 }}, "body.token" = {{ dictionary = "revocable", probability = 0.9 }} }}

[[operations]]
include-operation-id = "userinfo"
headers = {{ Authorization = {json.dumps("Bearer " + sealed)} }}

[[operations]]
include-operation-id = "logout"
parameters = {{ "query.client_id" = {{ dictionary = "client_ids", probability = 0.9 }} }}
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}

[[operations]]
include-operation-id = "logoutCallback"
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}

[[operations]]
include-tag = "instances"
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}
""", "--exclude-tag", "central", "--exclude-tag", "in-app", "--max-examples", os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "40"))
    # The fuzzer must have reached the success paths it can draw. A revocation's 200 is not among
    # them: schemathesis draws form bodies from the dictionaries only now and then (a fresh clone
    # got none in 40 examples), so revocations that succeed are sent by hand, below.
    for success in [("GET", "oauth/authorize", "302"), ("GET", "api/schema", "200"),
                    ("POST", "api/schema", "200"), ("PATCH", "api/schema", "200"), ("DELETE", "api/schema", "200"),
                    ("GET", "userinfo", "404"), ("GET", "oauth/logout", "400")]:
        assert served[success] > 0, f"the fuzzer never got {success}: {sorted(served)}"
    assert served[("POST", "oauth/revoke", "401")] + served[("POST", "oauth/revoke", "200")] > 0, sorted(served)


class Validated:
    """Hand-made requests on the success paths (live codes, states and sessions, which no
    generator can draw), sent and checked by schemathesis against the description with every
    check that applies to one request (schema, status, headers, content type, unsupported
    methods, ignored auth…). A failure shows schemathesis' report, secrets redacted."""

    FORM = "application/x-www-form-urlencoded"

    def __init__(self, gatehouse, seen):
        self.schema = schemathesis.openapi.from_path(ROOT / "openapi/gatehouse.yaml")
        self.base = gatehouse["url"]
        self.seen = seen
        self.count = Counter()

    def __call__(self, path, method, expected_status, **case):
        if method in ("POST",) and "body" in case:
            case.setdefault("media_type", self.FORM)
        made = self.schema[path][method].Case(**case)
        try:
            response = made.call_and_validate(base_url=self.base, allow_redirects=False, timeout=30)
        except Exception as error:  # schemathesis' FailureGroup: its report names the failed checks
            raise AssertionError(self.seen.redact(f"{method} {path}: {error}")) from None
        assert response.status_code == expected_status, self.seen.redact(f"{method} {path}: {response.status_code} {response.text[:300]}")
        self.count[(method, path, response.status_code)] += 1
        return response

    @staticmethod
    def location(response):
        """The Location header of a schemathesis Response (headers: lower-cased name -> values)."""
        return response.headers["location"][0]


def test_success_paths_with_live_sessions_conform_to_openapi(gatehouse, seen):
    validated = Validated(gatehouse, seen)
    for owner, other, relay_rest in [("com.example.sealed", "com.example.sealed2", "sealed"),
                                     ("com.example.app", "com.example.app2", "schema")]:
        app = App(gatehouse, seen, client_id=owner)
        # The browser part: Gatehouse's authorization endpoint, and its callback with a live state.
        started = validated("/oauth/authorize", "GET", 302, query=query(app.authorize_url()))
        browser = InAppBrowser(seen=seen)
        to_callback = browser.follow(validated.location(started), gatehouse["url"] + "/oauth/callback")
        assert isinstance(to_callback, str)
        back = validated("/oauth/callback", "GET", 302, query=query(to_callback))
        code = query(validated.location(back))["code"]
        seen.add(code, kind="Gatehouse code")
        # The token endpoint: the code, a refresh, its replay, the other app's attempt, an unknown app.
        redeem = {"grant_type": "authorization_code", "code": code, "code_verifier": app.verifier,
                  "redirect_uri": APP_REDIRECT, "client_id": owner}
        seen.add(app.verifier, kind="app PKCE verifier")
        pair = validated("/oauth/token", "POST", 200, body=redeem).json()
        seen.add(pair["access_token"], pair["refresh_token"], kind=f"{owner} token")
        refresh = {"grant_type": "refresh_token", "refresh_token": pair["refresh_token"], "client_id": owner}
        new = validated("/oauth/token", "POST", 200, body=refresh).json()
        seen.add(new["access_token"], new["refresh_token"], kind=f"{owner} token")
        assert validated("/oauth/token", "POST", 200, body=refresh).json()["refresh_token"] == new["refresh_token"]
        validated("/oauth/token", "POST", 400, body=dict(refresh, client_id=other, refresh_token=new["refresh_token"]))
        validated("/oauth/token", "POST", 400, body=redeem)  # the code is spent
        validated("/oauth/token", "POST", 401, body=dict(refresh, client_id="com.example.unknown"))
        # The relay, every method, with the session's access token; and without one.
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
            body = {"body": b"{}", "media_type": "application/json"} if method in ("POST", "PUT", "PATCH") else {}
            rest = relay_rest if method in ("GET", "HEAD", "POST", "PUT") else "schema"
            validated("/api/{rest}", method, 200, path_parameters={"rest": rest},
                      headers={"Authorization": f"Bearer {new['access_token']}"}, **body)
        validated("/api/{rest}", "GET", 401, path_parameters={"rest": relay_rest})
        # /userinfo: a sealed session of a plain OAuth 2.0 upstream holds no userinfo (404); a
        # passthrough app holds the upstream's token, which is not Gatehouse's (401).
        bearer = {"Authorization": f"Bearer {new['access_token']}"}
        validated("/userinfo", "GET", 404 if owner == "com.example.sealed" else 401, headers=bearer)
        validated("/userinfo", "GET", 401)
        # Revocation: by the other app (no effect), then by the owner.
        validated("/oauth/revoke", "POST", 200, body={"token": new["refresh_token"], "client_id": other})
        validated("/oauth/revoke", "POST", 200, body={"token": new["refresh_token"], "client_id": owner})
        validated("/oauth/token", "POST", 400, body=dict(refresh, refresh_token=new["refresh_token"]))
        if owner == "com.example.sealed":
            validated("/userinfo", "GET", 401, headers=bearer)  # the session is over
    # Logout: no app of this Gatehouse registered a post_logout_redirect_uri, so every logout is an
    # error page; a logout callback with a state Gatehouse never issued too.
    for parameters in [{"client_id": "com.example.unknown", "post_logout_redirect_uri": APP_SIGNED_OUT},
                       {"client_id": "com.example.sealed", "post_logout_redirect_uri": APP_SIGNED_OUT, "state": "s"},
                       {"client_id": "com.example.app", "post_logout_redirect_uri": APP_REDIRECT}]:
        for accept in ("application/json", "text/html"):
            validated("/oauth/logout", "GET", 400, query=parameters, headers={"Accept": accept})
    for parameters in [{"state": secrets.token_urlsafe(32)}, {}]:
        validated("/oauth/logout/callback", "GET", 400, query=parameters)
    print(sorted(validated.count.items()))


# --------------------------------------------------------------------------- OpenID Connect toward the app

APP_SIGNED_OUT = "com.example.app:/signed-out"
FC_SCOPES = ["openid", "given_name", "family_name", "birthdate", "gender", "birthplace", "birthcountry"]
FC_SEALED, FC_PASSTHROUGH, PLAIN = "com.example.fc.sealed", "com.example.fc.passthrough", "com.example.plain"


@pytest.fixture(scope="module")
def fc_gatehouse(workdir, seen):
    """A FranceConnect v2 double and a Gatehouse of this module's own in front of it (a sealed and
    a passthrough app), plus a plain OAuth 2.0 upstream whose app logs out without an ID token.
    Every app registers APP_SIGNED_OUT as its post-logout URI."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, FC_SECRET_SCHEMA=secrets.token_urlsafe(32), PLAIN_SECRET_SCHEMA=secrets.token_urlsafe(32))
    seen.add(env["FC_SECRET_SCHEMA"], env["PLAIN_SECRET_SCHEMA"], kind="upstream client secret")
    keys = session_keys(workdir, "schema-session-keys", seen)
    double_config = {"version": "v2", "alg": "ES256", "clients": [{
        "client_id": "gatehouse-schema", "client_secret_env": "FC_SECRET_SCHEMA", "name": "Gatehouse (schema)",
        "redirect_uris": [f"{base}/oauth/callback"], "post_logout_redirect_uris": [f"{base}/oauth/logout/callback"]}]}

    def client(client_id, upstream, exposure, scopes):
        return f"""
  - client_id: {client_id}
    upstream: {upstream}
    token_exposure: {exposure}
    scopes: [{", ".join(scopes)}]
    redirect_uris: ["{APP_REDIRECT}"]
    post_logout_redirect_uris: ["{APP_SIGNED_OUT}"]"""

    with fcd.start(workdir, "schema-fc-double", double_config, env) as double:
        config = server_and_store(port, f"{workdir}/schema-fc.sqlite") + f"""
upstreams:{fcd.gatehouse_upstream("fc", double, "gatehouse-schema", "FC_SECRET_SCHEMA")}
  - name: plain
    kind: oauth2
    authorization_endpoint: http://127.0.0.1:{free_port()}/authorize
    token_endpoint: http://127.0.0.1:{free_port()}/token
    client_id: gatehouse-plain
    client_secret_env: PLAIN_SECRET_SCHEMA
    scopes: [read]
clients:{client(FC_SEALED, "fc", "sealed", FC_SCOPES)}{client(FC_PASSTHROUGH, "fc", "passthrough", FC_SCOPES)}{client(PLAIN, "plain", "passthrough", ["read"])}
sessions:
  encryption_keys_file: {keys}
"""
        with run_gatehouse(workdir, "schema-fc-gatehouse", config, env, log_level="debug") as gatehouse:
            yield {**gatehouse, "url": base, "double": double}


def jose_payload(token):
    import base64
    segment = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def test_openid_success_paths_conform_to_openapi(fc_gatehouse, seen):
    """Sign-in through FranceConnect (sealed and passthrough), Gatehouse's ID token, /userinfo,
    and the logout through FranceConnect's /session/end and back, each answer checked by
    schemathesis against the description."""
    validated = Validated(fc_gatehouse, seen)
    base, double = fc_gatehouse["url"], fc_gatehouse["double"]
    metadata = validated("/.well-known/oauth-authorization-server", "GET", 200).json()
    assert metadata["jwks_uri"] == base + "/.well-known/jwks.json", metadata
    assert metadata["id_token_signing_alg_values_supported"] == ["ES256"], metadata
    assert (metadata["userinfo_endpoint"], metadata["end_session_endpoint"]) == (base + "/userinfo", base + "/oauth/logout")
    validated("/.well-known/jwks.json", "GET", 200)
    for owner in (FC_SEALED, FC_PASSTHROUGH):
        app = App(fc_gatehouse, seen, client_id=owner)
        nonce = secrets.token_urlsafe(16)
        started = validated("/oauth/authorize", "GET", 302, query=query(app.authorize_url(scope=" ".join(FC_SCOPES), nonce=nonce)))
        browser = fcd.Browser(identity=0)
        to_callback = browser.follow(validated.location(started), base + "/oauth/callback")
        assert isinstance(to_callback, str), browser.visited
        back = validated("/oauth/callback", "GET", 302, query=query(to_callback))
        received = query(validated.location(back))
        assert "code" in received, received
        seen.add(received["code"], kind="Gatehouse code")
        seen.add(app.verifier, kind="app PKCE verifier")
        pair = validated("/oauth/token", "POST", 200, body={
            "grant_type": "authorization_code", "code": received["code"], "code_verifier": app.verifier,
            "redirect_uri": APP_REDIRECT, "client_id": owner}).json()
        seen.add(*[pair[name] for name in ("access_token", "refresh_token", "id_token") if name in pair], kind=f"{owner} token")
        bearer = {"Authorization": f"Bearer {pair['access_token']}"}
        if owner == FC_SEALED:
            claims = jose_payload(pair["id_token"])
            assert claims["iss"] == base and claims["aud"] == owner and claims["nonce"] == nonce, claims
            assert isinstance(claims["iat"], int) and isinstance(claims["exp"], int), claims
            person = validated("/userinfo", "GET", 200, headers=bearer).json()
            assert person["sub"] == claims["sub"] == double.identity("gatehouse-schema", 0)["sub"], person
        else:
            validated("/userinfo", "GET", 401, headers=bearer)  # FranceConnect's token, not Gatehouse's
        # The browser logout: Gatehouse, FranceConnect's /session/end, Gatehouse's callback, the app.
        logout_state = secrets.token_urlsafe(16)
        validated("/oauth/logout", "GET", 400, query={"client_id": owner, "post_logout_redirect_uri": APP_SIGNED_OUT})
        out = validated("/oauth/logout", "GET", 302, query={"client_id": owner, "post_logout_redirect_uri": APP_SIGNED_OUT,
                                                             "state": logout_state, "id_token_hint": pair["id_token"]})
        toward = validated.location(out)
        assert toward.startswith(double.issuer + "/session/end?"), toward
        seen.add(query(toward)["state"], kind="Gatehouse logout state toward the upstream")
        returned = browser.follow(toward, base + "/oauth/logout/callback")
        assert isinstance(returned, str), browser.visited
        home = validated("/oauth/logout/callback", "GET", 302, query=query(returned))
        assert validated.location(home) == f"{APP_SIGNED_OUT}?state={logout_state}"
        validated("/oauth/logout/callback", "GET", 400, query=query(returned))  # single use
        if owner == FC_SEALED:
            validated("/userinfo", "GET", 401, headers=bearer)  # the session is over
    # An app of a plain OAuth 2.0 upstream has no ID token to show: straight home, with its state.
    home = validated("/oauth/logout", "GET", 302, query={"client_id": PLAIN, "post_logout_redirect_uri": APP_SIGNED_OUT,
                                                          "state": "bye"})
    assert validated.location(home) == f"{APP_SIGNED_OUT}?state=bye"
    print(sorted(validated.count.items()))


def test_openid_endpoints_fuzzed_with_a_franceconnect_upstream(fc_gatehouse, seen, tmp_path):
    """The fuzzer on the OpenID endpoints of the FranceConnect Gatehouse, with a live sealed
    session on /userinfo (200) and registered apps and post-logout URIs drawn at /oauth/logout."""
    app = App(fc_gatehouse, seen, client_id=FC_SEALED)
    location = fcd.Browser().follow(app.authorize_url(scope=" ".join(FC_SCOPES)), APP_REDIRECT)
    assert isinstance(location, str), location
    code = query(location)["code"]
    seen.add(code, kind="Gatehouse code")
    answer = app.redeem(code)
    assert answer.status_code == 200, answer.text
    access_token = answer.json()["access_token"]
    served = run_schemathesis(fc_gatehouse, seen, tmp_path / "openid.toml", f"""
[dictionaries.client_ids]
values = {toml_list([FC_SEALED, FC_PASSTHROUGH, PLAIN])}

[dictionaries.post_logout_uris]
values = [{json.dumps(APP_SIGNED_OUT)}]

[[operations]]
include-operation-id = "userinfo"
headers = {{ Authorization = {json.dumps("Bearer " + access_token)} }}

[[operations]]
include-operation-id = "logout"
parameters = {{ "query.client_id" = {{ dictionary = "client_ids", probability = 0.9 }}, "query.post_logout_redirect_uri" = {{ dictionary = "post_logout_uris", probability = 0.9 }} }}
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}

[[operations]]
include-operation-id = "logoutCallback"
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}
""", "--include-tag", "openid", "--max-examples", os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "40"))
    assert served[("GET", "userinfo", "200")] > 0, sorted(served)
    assert served[("GET", "oauth/logout", "400")] > 0, sorted(served)


# --------------------------------------------------------------------------- a central sign-in provider

CENTRAL_FIXTURES = ROOT / "Tests/Fixtures/central"
CENTRAL_APP_ID, CENTRAL_CLIENT = "tasquito", "com.example.central"
CENTRAL_REDIRECT = "com.example.central:/oauth2redirect"
CENTRAL_BUNDLE = "com.example.central.ios"
APPLE_USER = "001234.0a1b2c3d4e5f.0042"  # Apple's `sub` of the identity tokens drawn here
# The raw nonce the app sends with them; Apple's `nonce` claim is its SHA-256 as lowercase hex.
APPLE_RAW_NONCE = "schema-raw-nonce-" + secrets.token_urlsafe(12)
APPLE_NONCE_CLAIM = hashlib.sha256(APPLE_RAW_NONCE.encode()).hexdigest()
SIGN_IN_COOKIE = "__Secure-gatehouse-signin"
JSON = "application/json"


@pytest.fixture(scope="module")
def central_gatehouse(workdir, seen, relay_doubles):
    """The central sign-in provider double and a Gatehouse of this module's own in front of it: one
    `central` upstream with the seed's /auth/* endpoints (a magic-link limit of 3), Sign in with
    Apple against the double's Apple stand-in, one app client for both faces, and a relay route."""
    for name in ("app-private.pem", "jwt-a.pem", "jwt-b.pem"):
        lines = [line for line in (CENTRAL_FIXTURES / name).read_text().splitlines() if line and not line.startswith("-----")]
        seen.add(*lines, kind="central fixture private key (PEM line)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    keys = session_keys(workdir, "schema-central-session-keys", seen)
    double_config = {"apps": {CENTRAL_APP_ID: ctd.app_config(base, mobile_scheme="tasquito")},
                     "appleBundleIds": {CENTRAL_APP_ID: CENTRAL_BUNDLE}}
    with ctd.start(workdir, "schema-central-double", double_config) as double:
        upstream = f"""
  - name: tasquito
    kind: central
    client_id: {CENTRAL_APP_ID}
    s2s_private_key_file: {CENTRAL_FIXTURES / "app-private.pem"}
    api_base: {double.api_base}
    web_base: {double.web_base}
    timeout: 5s
    environment: development
    signing_key_files: [{CENTRAL_FIXTURES / "jwt-a.pem"}, {CENTRAL_FIXTURES / "jwt-b.pem"}]
    magic_link_limit: 3
    magic_link_address_limit: 100000   # every request here is from 127.0.0.1: only the per-mailbox limit is exercised
    app_api:
      client: {CENTRAL_CLIENT}
    apple:
      bundle_id: {CENTRAL_BUNDLE}
      jwks_url: {double.apple_jwks_url}"""
        # A body limit far above the largest body the description allows (an 8,192-character
        # identityToken the fuzzer writes as \uXXXX escapes), so that what it checks is the
        # endpoints' own validation; the 413 is test_central's.
        config = server_and_store(port, f"{workdir}/schema-central.sqlite").replace(
            "\nstore:", "\n  max_body_bytes: 262144\nstore:") + f"""
upstreams:{upstream}
clients:
  - client_id: {CENTRAL_CLIENT}
    upstream: tasquito
    redirect_uris: ["{CENTRAL_REDIRECT}"]
routes:
  - prefix: /api/central
    backend: {relay_doubles["backend"].url}/central
    methods: [GET, HEAD, POST, PUT, PATCH, DELETE]
    upstream: tasquito
    identity_headers:
      X-User-Id: userId
sessions:
  encryption_keys_file: {keys}
"""
        with run_gatehouse(workdir, "schema-central-gatehouse", config, dict(os.environ), log_level="debug") as gatehouse:
            yield {**gatehouse, "url": base, "double": double}


def jose_header(token):
    import base64
    segment = token.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def sign_in_cookie(response):
    """The value of Gatehouse's sign-in cookie in a schemathesis Response's Set-Cookie headers."""
    for header in response.headers.get("set-cookie", []):
        name, _, rest = header.partition("=")
        if name.strip() == SIGN_IN_COOKIE:
            return rest.split(";")[0]
    raise AssertionError(f"no {SIGN_IN_COOKIE} cookie: {response.headers.get('set-cookie')}")


def central_live_values(gatehouse, seen, codes=0, pairs=0, apple=0):
    """Live central values no generator can draw: auth codes minted at the double, refresh tokens of
    sessions opened with /auth/exchange, Apple identity tokens for APPLE_USER."""
    double = gatehouse["double"]
    minted = [double.mint_code(CENTRAL_APP_ID, f"live{secrets.token_hex(4)}@example.com", "Live Person") for _ in range(codes + pairs)]
    seen.add(*minted, kind="central auth code")
    refresh_tokens = []
    for code in minted[codes:]:
        answer = requests.post(gatehouse["url"] + "/auth/exchange", json={"code": code}, timeout=30)
        assert answer.status_code == 200, answer.text
        seen.add(answer.json()["accessToken"], answer.json()["refreshToken"], kind="central token")
        refresh_tokens.append(answer.json()["refreshToken"])
    identity_tokens = [double.apple_token({"sub": APPLE_USER, "email": "apple.person@example.com", "nonce": APPLE_NONCE_CLAIM})
                       for _ in range(apple)]
    seen.add(*identity_tokens, kind="Apple identity token")
    return minted[:codes], refresh_tokens, identity_tokens


def test_central_success_paths_conform_to_openapi(central_gatehouse, seen):
    """The seed's /auth/* endpoints, the standard face through the provider and the cookie-bound
    /app/auth/callback, the relay with a minted token and the RSA keys in the JWKS, each answer
    checked by schemathesis against the description."""
    validated = Validated(central_gatehouse, seen)
    base, double = central_gatehouse["url"], central_gatehouse["double"]
    keys = validated("/.well-known/jwks.json", "GET", 200).json()["keys"]
    rsa_kids = [key["kid"] for key in keys if key["kty"] == "RSA"]
    assert len(rsa_kids) == 2 and all(key["alg"] == "RS256" for key in keys if key["kty"] == "RSA"), keys

    # POST /auth/exchange: a code the provider minted, once; then 404, and malformed bodies.
    code = double.mint_code(CENTRAL_APP_ID, "zoe.unal@example.com", "Zoë Ünal 山田")
    seen.add(code, kind="central auth code")
    tokens = validated("/auth/exchange", "POST", 200, body={"code": code}, media_type=JSON).json()
    seen.add(tokens["accessToken"], tokens["refreshToken"], kind="central token")
    user = tokens["user"]
    assert user["id"] == user["userId"] and user["name"] == "Zoë Ünal 山田" and user["isNewUser"] is True, user
    assert jose_header(tokens["accessToken"])["kid"] == rsa_kids[0]
    claims = jose_payload(tokens["accessToken"])
    assert (claims["iss"], claims["aud"], claims["sub"], claims["data"]["email"]) == \
        (CENTRAL_APP_ID, CENTRAL_APP_ID, user["userId"], "zoe.unal@example.com"), claims
    assert validated("/auth/exchange", "POST", 404, body={"code": code}, media_type=JSON).json() == \
        {"status": 404, "message": "Auth code not found"}
    refused = validated("/auth/exchange", "POST", 400, body={"code": code, "colour": "blue"}, media_type=JSON).json()
    assert refused["message"] == "Validation Error" and any(line.startswith("colour") for line in refused["details"]), refused
    validated("/auth/exchange", "POST", 400, body={}, media_type=JSON)
    validated("/auth/exchange", "POST", 400, body={"code": 42}, media_type=JSON)

    # POST /auth/refresh: a new pair; the replaced token within the grace window answers the same pair.
    new = validated("/auth/refresh", "POST", 200, body={"refreshToken": tokens["refreshToken"]}, media_type=JSON).json()
    seen.add(new["accessToken"], new["refreshToken"], kind="central token")
    assert new["refreshToken"] != tokens["refreshToken"] and new["user"]["isNewUser"] is False, new["user"]
    again = validated("/auth/refresh", "POST", 200, body={"refreshToken": tokens["refreshToken"]}, media_type=JSON).json()
    assert again["refreshToken"] == new["refreshToken"]
    assert validated("/auth/refresh", "POST", 403, body={"refreshToken": "A" * 128}, media_type=JSON).json() == \
        {"status": 403, "message": "Invalid refresh token"}

    # POST /auth/send-magic-link: three per address (magic_link_limit), then 429 with Retry-After; others unaffected.
    for platform in ({"platform": "mobile"}, {}, {}):
        assert validated("/auth/send-magic-link", "POST", 200, body={"email": "mira@example.com", **platform},
                         media_type=JSON).json() == {"success": True}
    seen.add(double.last_magic_link("mira@example.com")["token"], kind="magic-link token")
    limited = validated("/auth/send-magic-link", "POST", 429, body={"email": "MIRA@example.com"}, media_type=JSON)
    assert int(limited.headers["retry-after"][0]) > 0
    validated("/auth/send-magic-link", "POST", 200, body={"email": "other.person@example.com"}, media_type=JSON)
    seen.add(double.last_magic_link("other.person@example.com")["token"], kind="magic-link token")
    validated("/auth/send-magic-link", "POST", 400, body={"email": "not an address"}, media_type=JSON)
    validated("/auth/send-magic-link", "POST", 400, body={"email": "zoe@example.com", "platform": "web"}, media_type=JSON)

    # POST /auth/verify-apple: a token of the Apple stand-in; a wrong audience is 401 naming the check.
    identity_token = double.apple_token({"sub": APPLE_USER, "email": "apple.person@example.com", "nonce": APPLE_NONCE_CLAIM})
    other_audience = double.apple_token({"sub": APPLE_USER, "email": "apple.person@example.com", "aud": "com.example.other",
                                         "nonce": APPLE_NONCE_CLAIM})
    seen.add(identity_token, other_audience, kind="Apple identity token")
    apple = {"identityToken": identity_token, "authorizationCode": "c0ffee", "user": APPLE_USER, "nonce": APPLE_RAW_NONCE,
             "fullName": {"givenName": "Ada", "familyName": None}}
    signed_in = validated("/auth/verify-apple", "POST", 200, body=apple, media_type=JSON).json()
    seen.add(signed_in["accessToken"], signed_in["refreshToken"], kind="central token")
    assert signed_in["user"]["provider"] == "apple", signed_in["user"]
    refused = validated("/auth/verify-apple", "POST", 401, body=dict(apple, identityToken=other_audience), media_type=JSON).json()
    assert refused["message"] == "Invalid Apple identity token" and refused["details"][0].startswith("aud"), refused
    replayed = validated("/auth/verify-apple", "POST", 401, body=apple, media_type=JSON).json()  # single use
    assert replayed["details"][0].startswith("replay"), replayed
    validated("/auth/verify-apple", "POST", 401, body=dict(apple, user="someone-else"), media_type=JSON)

    # The standard face: /oauth/authorize → the provider's /auth → /app/auth/callback with the cookie → /oauth/token.
    app = App(central_gatehouse, seen, client_id=CENTRAL_CLIENT, redirect_uri=CENTRAL_REDIRECT)
    started = validated("/oauth/authorize", "GET", 302, query=query(app.authorize_url(scope=None)))
    toward = validated.location(started)
    assert toward == f"{double.web_base}/auth?app={CENTRAL_APP_ID}&provider=google", toward
    cookie = sign_in_cookie(started)
    seen.add(cookie, kind="Gatehouse state (central sign-in cookie)")
    at_provider = requests.get(toward, allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302, at_provider.text
    returned = at_provider.headers["Location"]
    assert returned.startswith(base + "/app/auth/callback?code="), returned
    seen.add(query(returned)["code"], kind="central auth code")
    validated("/app/auth/callback", "GET", 400, query=query(returned))  # no cookie: nothing is consumed
    validated("/app/auth/callback", "GET", 400, query=query(returned), cookies={SIGN_IN_COOKIE: secrets.token_urlsafe(32)})
    back = validated("/app/auth/callback", "GET", 302, query=query(returned), cookies={SIGN_IN_COOKIE: cookie})
    received = query(validated.location(back))
    assert received["state"] == app.state and received["iss"] == base and "code" in received, received
    seen.add(received["code"], kind="Gatehouse code")
    validated("/app/auth/callback", "GET", 400, query=query(returned), cookies={SIGN_IN_COOKIE: cookie})  # used
    seen.add(app.verifier, kind="app PKCE verifier")
    pair = validated("/oauth/token", "POST", 200, body={
        "grant_type": "authorization_code", "code": received["code"], "code_verifier": app.verifier,
        "redirect_uri": CENTRAL_REDIRECT, "client_id": CENTRAL_CLIENT}).json()
    seen.add(pair["access_token"], pair["refresh_token"], kind="central token")
    assert jose_header(pair["access_token"])["kid"] == rsa_kids[0] and len(pair["refresh_token"]) == 128, pair.keys()
    refreshed = validated("/oauth/token", "POST", 200, body={"grant_type": "refresh_token", "refresh_token": pair["refresh_token"],
                                                               "client_id": CENTRAL_CLIENT}).json()
    seen.add(refreshed["access_token"], refreshed["refresh_token"], kind="central token")
    validated("/oauth/token", "POST", 400, body={"grant_type": "refresh_token", "refresh_token": "A" * 128, "client_id": CENTRAL_CLIENT})

    # The relay: Gatehouse's own JWT, verified in process; a tampered one is 401.
    for token in (refreshed["access_token"], new["accessToken"]):
        validated("/api/{rest}", "GET", 200, path_parameters={"rest": "central"}, headers={"Authorization": f"Bearer {token}"})
    forged = new["accessToken"][:-4] + ("AAAA" if not new["accessToken"].endswith("AAAA") else "BBBB")
    validated("/api/{rest}", "GET", 401, path_parameters={"rest": "central"}, headers={"Authorization": f"Bearer {forged}"})
    print(sorted(validated.count.items()))


#: What a schema-violating request may get (schemathesis' default for negative_data_rejection), plus
#: 413: a body over the limit is refused before it is read, which is a refusal too.
NEGATIVE_DATA_REJECTION_STATUSES = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]


def test_central_endpoints_fuzzed(central_gatehouse, seen, tmp_path):
    """The fuzzer on a central upstream's endpoints, with live codes, refresh tokens and Apple identity
    tokens (for APPLE_USER) among the values it draws."""
    codes, refresh_tokens, identity_tokens = central_live_values(central_gatehouse, seen, codes=6, pairs=4, apple=4)
    served = run_schemathesis(central_gatehouse, seen, tmp_path / "central.toml", f"""
[checks.negative_data_rejection]
expected-statuses = {toml_list(NEGATIVE_DATA_REJECTION_STATUSES)}

[dictionaries.codes]
values = {toml_list(codes)}

[dictionaries.refresh_tokens]
values = {toml_list(refresh_tokens)}

[dictionaries.identity_tokens]
values = {toml_list(identity_tokens)}

[dictionaries.apple_users]
values = [{json.dumps(APPLE_USER)}]

[dictionaries.apple_nonces]
values = [{json.dumps(APPLE_RAW_NONCE)}]

[[operations]]
include-operation-id = "centralExchange"
parameters = {{ "body.code" = {{ dictionary = "codes", probability = 0.5 }} }}

[[operations]]
include-operation-id = "centralRefresh"
parameters = {{ "body.refreshToken" = {{ dictionary = "refresh_tokens", probability = 0.5 }} }}

[[operations]]
include-operation-id = "centralVerifyApple"
parameters = {{ "body.identityToken" = {{ dictionary = "identity_tokens", probability = 0.7 }}, "body.user" = {{ dictionary = "apple_users", probability = 0.9 }}, "body.nonce" = {{ dictionary = "apple_nonces", probability = 0.9 }} }}

[[operations]]
include-operation-id = "centralCallback"
checks = {{ positive_data_acceptance = {{ expected-statuses = {toml_list(BROWSER_ENDPOINT_STATUSES)} }} }}
""", "--include-tag", "central", "--max-examples", os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "40"))
    for expected in [("POST", "auth/exchange", "404"), ("POST", "auth/exchange", "400"), ("POST", "auth/refresh", "403"),
                     ("POST", "auth/send-magic-link", "200"), ("POST", "auth/verify-apple", "401"), ("GET", "app/auth", "400")]:
        assert served[expected] > 0, f"the fuzzer never got {expected}: {sorted(served)}"
    # A success drawn from the live values (which of the three depends on the draws).
    successes = [("POST", "auth/exchange", "200"), ("POST", "auth/refresh", "200"), ("POST", "auth/verify-apple", "200")]
    assert sum(served[success] for success in successes) > 0, sorted(served)
