"""Session codes for webviews (seed 000) end to end: the app trades its sealed access token for a
one-time, 60-second code; the webview opens /session with it and gets the `__Host-` cookie bound
to the same session; routes with `accept_session_cookie` take that cookie (GET as it is, anything
that changes something only with an Origin of Gatehouse or of `webviews.origins`), and no backend
ever sees it."""

import re
from urllib.parse import urlencode

import pytest
import requests

from sandbox.dpop import Key
from sandbox.nativeapp import APP_REDIRECT, App
from trusted import trusted_gatehouse

APP = "com.example.web"
WEB = "https://app.example.test"


@pytest.fixture(scope="module")
def gatehouse(workdir, seen):
    clients = f"""
  - client_id: {APP}
    upstream: legacy
    scopes: [read, write]
    redirect_uris: ["{APP_REDIRECT}"]"""
    routes = """
  - prefix: /web
    backend: {backend}/web
    methods: [GET, HEAD, OPTIONS, POST]
    upstream: legacy
    accept_session_cookie: true
  - prefix: /api
    backend: {backend}/api
    methods: [GET, POST]
    upstream: legacy"""
    extra = f"webviews:\n  origins: [\"{WEB}\"]\n  cookie_lifetime: 10m"
    with trusted_gatehouse(workdir, seen, "webviews", clients, routes, extra) as running:
        yield running


def signed_in(gatehouse, seen, headers=None):
    app = App(gatehouse, seen, client_id=APP)
    answer = app.redeem(app.sign_in()["code"], headers=headers)
    assert answer.status_code == 200, answer.text
    return app, answer.json()


def session_code(gatehouse, token, seen, headers=None):
    answer = requests.post(gatehouse["url"] + "/oauth/session_code", timeout=10,
                           headers=headers or {"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["Cache-Control"] == "no-store"
    body = answer.json()
    assert body["expires_in"] == 60
    seen.add(body["session_code"], kind="code or token")
    return body["session_code"]


def open_session(gatehouse, code, return_to=WEB + "/inbox?x=1"):
    return requests.get(gatehouse["url"] + "/session?" + urlencode({"session_code": code, "return_to": return_to}),
                        allow_redirects=False, timeout=10)


def web_cookie(gatehouse, seen):
    _, pair = signed_in(gatehouse, seen)
    opened = open_session(gatehouse, session_code(gatehouse, pair["access_token"], seen))
    assert opened.status_code == 303, opened.text
    cookie = re.match(r"__Host-gatehouse-session=(ghc_[A-Za-z0-9_-]+);", opened.headers["Set-Cookie"]).group(1)
    seen.add(cookie, kind="Gatehouse access token")
    return pair, cookie


def test_a_session_code_opens_a_web_session_with_a_host_cookie(gatehouse, seen):
    _, pair = signed_in(gatehouse, seen)
    opened = open_session(gatehouse, session_code(gatehouse, pair["access_token"], seen))
    assert opened.status_code == 303
    assert opened.headers["Location"] == WEB + "/inbox?x=1"
    attributes = [part.strip() for part in opened.headers["Set-Cookie"].split(";")]
    assert attributes[0].startswith("__Host-gatehouse-session=ghc_")
    assert {"Path=/", "Secure", "HttpOnly", "SameSite=Lax"} <= set(attributes)
    assert not any(part.lower().startswith("domain=") for part in attributes)
    max_age = int(next(part for part in attributes if part.startswith("Max-Age=")).split("=")[1])
    assert 0 < max_age <= 600


def test_a_session_code_is_single_use(gatehouse, seen):
    _, pair = signed_in(gatehouse, seen)
    code = session_code(gatehouse, pair["access_token"], seen)
    assert open_session(gatehouse, code).status_code == 303
    again = open_session(gatehouse, code)
    assert again.status_code == 400 and "Set-Cookie" not in again.headers


@pytest.mark.parametrize("return_to", [
    "https://evil.example/inbox", "https://app.example.test@evil.example/", "//evil.example/x", "https:\\\\evil.example",
    "javascript:alert(1)", "http://app.example.test/inbox", "https://app.example.test:8443/", "/relative", "",
])
def test_return_to_must_be_under_a_configured_origin_and_the_code_is_spent_anyway(gatehouse, seen, return_to):
    _, pair = signed_in(gatehouse, seen)
    code = session_code(gatehouse, pair["access_token"], seen)
    refused = open_session(gatehouse, code, return_to)
    assert refused.status_code == 400 and "Set-Cookie" not in refused.headers and "Location" not in refused.headers
    assert open_session(gatehouse, code).status_code == 400  # spent by the refused try


def test_only_a_live_sealed_access_token_gets_a_code(gatehouse, seen):
    url = gatehouse["url"] + "/oauth/session_code"
    assert requests.post(url, timeout=10).status_code == 401
    _, pair = signed_in(gatehouse, seen)
    for token in (pair["refresh_token"], "gha_unknown", "upstream-token"):
        refused = requests.post(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert refused.status_code == 401 and 'error="invalid_token"' in refused.headers["WWW-Authenticate"]


def test_a_dpop_bound_token_gets_a_code_only_with_its_proof(gatehouse, seen):
    key = Key()
    _, pair = signed_in(gatehouse, seen, headers={"DPoP": key.proof("POST", gatehouse["url"] + "/oauth/token")})
    url = gatehouse["url"] + "/oauth/session_code"
    token = pair["access_token"]
    assert requests.post(url, headers={"Authorization": f"DPoP {token}"}, timeout=10).status_code == 401
    assert requests.post(url, headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code == 401
    code = session_code(gatehouse, token, seen, headers={"Authorization": f"DPoP {token}",
                                                         "DPoP": key.proof("POST", url, access_token=token)})
    assert open_session(gatehouse, code).status_code == 303


def test_the_cookie_works_on_a_cookie_route_and_never_reaches_the_backend(gatehouse, seen):
    _, cookie = web_cookie(gatehouse, seen)
    jar = f"theme=dark; __Host-gatehouse-session={cookie}; lang=fr"
    answer = requests.get(gatehouse["url"] + "/web/page", headers={"Cookie": jar}, timeout=10)
    assert answer.status_code == 200, answer.text
    received = answer.json()["headers"]
    assert received["cookie"] == "theme=dark; lang=fr"
    alone = requests.get(gatehouse["url"] + "/web/page", headers={"Cookie": f"__Host-gatehouse-session={cookie}"}, timeout=10)
    assert alone.status_code == 200 and "cookie" not in alone.json()["headers"]


def test_a_cookie_request_that_changes_something_needs_a_same_site_origin(gatehouse, seen):
    _, cookie = web_cookie(gatehouse, seen)
    url, jar = gatehouse["url"] + "/web/form", {"Cookie": f"__Host-gatehouse-session={cookie}"}
    assert requests.post(url, headers=jar, data="x=1", timeout=10).status_code == 403
    assert requests.post(url, headers={**jar, "Origin": "https://evil.example"}, data="x=1", timeout=10).status_code == 403
    assert requests.post(url, headers={**jar, "Origin": WEB}, data="x=1", timeout=10).status_code == 200
    assert requests.post(url, headers={**jar, "Origin": gatehouse["url"]}, data="x=1", timeout=10).status_code == 200
    assert requests.post(url, headers={**jar, "Referer": WEB + "/page"}, data="x=1", timeout=10).status_code == 200
    assert requests.post(url, headers={**jar, "Referer": "https://evil.example/"}, data="x=1", timeout=10).status_code == 403


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "GET"])
def test_a_cookie_request_from_another_sites_page_never_reaches_the_backend_with_the_users_identity(gatehouse, seen, method):
    # A page elsewhere probing with the user's cookie (fetch with credentials, or a HEAD, which
    # needs no preflight) gets nothing: the identity goes only with requests that pass the CSRF rule.
    _, cookie = web_cookie(gatehouse, seen)
    url, jar = gatehouse["url"] + "/web/probe", {"Cookie": f"__Host-gatehouse-session={cookie}"}
    mark = gatehouse["backend"].mark()
    for origin in ("https://evil.example", "null"):
        answer = requests.request(method, url, headers={**jar, "Origin": origin}, timeout=10)
        assert answer.status_code == 403, (method, origin, answer.status_code)
    assert gatehouse["backend"].request_lines_since(mark) == []
    # Without an Origin (a navigation) and from a configured page it goes through, on the first
    # request and on the next (a warm token).
    for headers in (jar, jar, {**jar, "Origin": WEB}):
        assert requests.request(method, url, headers=headers, timeout=10).status_code == 200, (method, headers)


def test_the_cookie_is_only_a_cookie_and_only_on_cookie_routes(gatehouse, seen):
    pair, cookie = web_cookie(gatehouse, seen)
    jar = {"Cookie": f"__Host-gatehouse-session={cookie}"}
    assert requests.get(gatehouse["url"] + "/api/x", headers=jar, timeout=10).status_code == 401
    assert requests.get(gatehouse["url"] + "/web/x", headers={"Authorization": f"Bearer {cookie}"}, timeout=10).status_code == 401
    other = {"Cookie": f"__Host-gatehouse-session={pair['access_token']}"}
    assert requests.get(gatehouse["url"] + "/web/x", headers=other, timeout=10).status_code == 401
    # With an Authorization header the cookie is not looked at.
    both = requests.get(gatehouse["url"] + "/web/x", headers={**jar, "Authorization": "Bearer gha_nothing"}, timeout=10)
    assert both.status_code == 401


def test_revoking_the_session_kills_the_cookie(gatehouse, seen):
    pair, cookie = web_cookie(gatehouse, seen)
    jar = {"Cookie": f"__Host-gatehouse-session={cookie}"}
    assert requests.get(gatehouse["url"] + "/web/x", headers=jar, timeout=10).status_code == 200
    revoked = requests.post(gatehouse["url"] + "/oauth/revoke", data={"token": pair["refresh_token"], "client_id": APP}, timeout=10)
    assert revoked.status_code == 200
    assert requests.get(gatehouse["url"] + "/web/x", headers=jar, timeout=10).status_code == 401
