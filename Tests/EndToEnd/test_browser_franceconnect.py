"""A real browser signs in through FranceConnect v2 and logs out, end to end.

Debian's Chromium (/usr/bin/chromium), headless, driven by Debian's chromedriver
(/usr/bin/chromedriver) through Selenium; the driver's path is given, so Selenium Manager never
downloads anything. The app is a loopback web server of the test's own (RFC 8252 §7.3 redirect
URIs http://127.0.0.1:PORT/callback and /signed-out); Gatehouse (a process of this module's own)
is in front of the FranceConnect v2 double (sandbox/franceconnect/).

The browser opens Gatehouse's /oauth/authorize for a sealed client, is sent to FranceConnect's
login page, where the test clicks "Continuer"; it lands on the app's redirect URI with a code and
the app's state; the test redeems the code. Then the browser opens Gatehouse's /oauth/logout: it is
sent to FranceConnect's /session/end (with id_token_hint, state and post_logout_redirect_uri), which
ends FranceConnect's session cookie, back to Gatehouse's /oauth/logout/callback, and ends on the
app's post-logout URI with the app's state.

The browser's profile lives outside the run's temporary folder: its LevelDB *.log files record the
URLs it visited, which the suite's log scan (test_zz) would rightly call leaks.
"""

import os
import secrets
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the sandbox package

from sandbox import franceconnect as fcd  # noqa: E402
from sandbox.nativeapp import App, free_port  # noqa: E402
from processes import run_gatehouse, session_keys  # noqa: E402
from sandbox.gatehouse import server_and_store  # noqa: E402

from browser import LoopbackApp, browser  # noqa: E402,F401 (browser: the fixture)
CLIENT = "com.example.browser"
SCOPES = "openid given_name family_name birthdate gender birthplace birthcountry"


@pytest.fixture(scope="module")
def setup(workdir, seen):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, FC_SECRET_BROWSER=secrets.token_urlsafe(32))
    seen.add(env["FC_SECRET_BROWSER"], kind="upstream client secret")
    app_server = LoopbackApp()
    keys = session_keys(workdir, "fc-browser-session-keys", seen)
    double_config = {"version": "v2", "alg": "ES256", "clients": [{
        "client_id": "gatehouse-browser", "client_secret_env": "FC_SECRET_BROWSER", "name": "Gatehouse (navigateur)",
        "redirect_uris": [f"{base}/oauth/callback"], "post_logout_redirect_uris": [f"{base}/oauth/logout/callback"]}]}
    try:
        with fcd.start(workdir, "fc-double-browser", double_config, env) as double:
            config = server_and_store(port, f"{workdir}/fc-browser.sqlite") + f"""
upstreams:{fcd.gatehouse_upstream("fc", double, "gatehouse-browser", "FC_SECRET_BROWSER")}
clients:
  - client_id: {CLIENT}
    upstream: fc
    wiring: callback
    token_exposure: sealed
    scopes: [{", ".join(SCOPES.split())}]
    redirect_uris: ["http://127.0.0.1/callback"]
    post_logout_redirect_uris: ["http://127.0.0.1/signed-out"]
sessions:
  encryption_keys_file: {keys}
"""
            with run_gatehouse(workdir, "fc-browser-gatehouse", config, env) as gatehouse:
                yield {"url": base, "gatehouse": {**gatehouse, "url": base}, "double": double, "app": app_server}
    finally:
        app_server.stop()


def test_a_real_browser_signs_in_through_franceconnect_and_logs_out(browser, setup, seen):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    double, loopback = setup["double"], setup["app"]
    app = App(setup["gatehouse"], seen, client_id=CLIENT, redirect_uri=f"{loopback.url}/callback")
    nonce = secrets.token_urlsafe(24)

    # Sign in: Gatehouse → FranceConnect's page → "Continuer" → Gatehouse → the app.
    browser.get(app.authorize_url(scope=SCOPES, nonce=nonce))
    WebDriverWait(browser, 30).until(expected_conditions.element_to_be_clickable((By.ID, "continue")))
    assert browser.current_url.startswith(double.issuer + "/interaction/"), "not on FranceConnect's page"
    assert browser.find_element(By.ID, "continue").text == "Continuer"
    assert browser.find_element(By.ID, "cancel").text == "Annuler"
    browser.find_element(By.ID, "identity-0").click()
    browser.find_element(By.ID, "continue").click()
    received = loopback.wait_for("/callback")
    seen.add(received.get("code"), kind="Gatehouse code")
    assert received.get("state") == app.state, received
    assert "error" not in received and received.get("code"), received
    WebDriverWait(browser, 30).until(expected_conditions.presence_of_element_located((By.ID, "done")))
    cookies = {cookie["name"] for cookie in browser.get_cookies()}
    assert fcd.SESSION_COOKIE in cookies, f"FranceConnect's session cookie is not in the browser: {cookies}"

    answer = app.redeem(received["code"])
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    person = double.identity("gatehouse-browser", 0)
    _, claims = fcd.verify_jws(tokens["id_token"], requests.get(setup["url"] + "/.well-known/jwks.json", timeout=10).json(),
                               algorithms=("ES256",))
    assert claims["sub"] == person["sub"] and claims["nonce"] == nonce and claims["aud"] == CLIENT

    # Log out: Gatehouse → FranceConnect's /session/end → Gatehouse's logout callback → the app.
    logout_state = secrets.token_urlsafe(16)
    browser.get(setup["url"] + "/oauth/logout?" + urlencode({
        "client_id": CLIENT, "post_logout_redirect_uri": f"{loopback.url}/signed-out", "state": logout_state,
        "id_token_hint": tokens["id_token"]}))
    signed_out = loopback.wait_for("/signed-out")
    assert signed_out == {"state": logout_state}, signed_out
    ended = double.stats()["session_end"]
    assert len(ended) == 1, ended
    assert ended[0]["outcome"] == "redirect", ended[0]
    assert ended[0]["id_token_hint_issued"] and ended[0]["sub"] == person["sub"], ended[0]
    assert ended[0]["post_logout_redirect_uri"] == setup["url"] + "/oauth/logout/callback"
    assert ended[0]["state_length"] == 43
    assert ended[0]["had_session_cookie"], "FranceConnect's /session/end did not get the browser's session cookie"
    WebDriverWait(browser, 30).until(expected_conditions.presence_of_element_located((By.ID, "done")))
    cookies = {cookie["name"] for cookie in browser.get_cookies()}
    assert fcd.SESSION_COOKIE not in cookies, "FranceConnect's session cookie survived the logout"
    assert app.refresh(tokens["refresh_token"]).status_code == 400  # Gatehouse's session ended too
