"""Manual certification by e-mailed code (seed 000's fallback for phones that cannot attest),
end to end: a real Chromium signs in through an uncertified instance of an app with
`attestation: required` and `manual_certification`; after the upstream sign-in (a real
django-oauth-toolkit, OpenID Connect, whose userinfo gives the e-mail) Gatehouse e-mails a 6-digit
code through a real SMTP server (aiosmtpd, STARTTLS required), the test types it, clicks "Allow
this app", and the app gets its code. Then: the instance is certified (no second pause), 5 wrong
codes lock a sign-in, "Don't allow" sends access_denied, and a sign-in without an e-mail says so."""

import re

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from browser import LoopbackApp, browser  # noqa: F401 (browser: the fixture)
from sandbox.nativeapp import PASSWORD, USERNAME, App, InAppBrowser, free_port, query
from sandbox.smtpsink import SMTPSink
from processes import run_gatehouse, run_upstream, session_keys
from sandbox.gatehouse import server_and_store

APP = "com.example.certified"
EMAIL = "alice@example.test"


@pytest.fixture(scope="module")
def setup(workdir, seen):
    SEEN.append(seen)
    port = free_port()
    callback = f"http://127.0.0.1:{port}/oauth/callback"
    loopback = LoopbackApp()
    import secrets as random
    smtp_password = random.token_urlsafe(24)
    seen.add(smtp_password, kind="SMTP password")
    sink = SMTPSink(workdir, credentials=("gatehouse", smtp_password))
    users = [{"username": USERNAME, "password": PASSWORD, "email": EMAIL},
             {"username": "noemail", "password": PASSWORD, "email": ""}]
    applications = [{"client_id": "gatehouse-oidc", "client_secret_env": "UPSTREAM_SECRET_LEGACY", "algorithm": "RS256",
                     "redirect_uris": [callback], "pkce_required": True}]
    try:
        with run_upstream(workdir, "upstream-certification", seen, [callback], users=users, applications=applications) as up:
            config = server_and_store(port, f"{workdir}/certification.sqlite") + f"""
upstreams:
  - name: dot
    kind: oidc
    issuer: {up["url"]}/o
    client_id: gatehouse-oidc
    client_secret_env: UPSTREAM_SECRET_LEGACY
    id_token_signing_alg: RS256
    scopes: [openid, profile, email]
clients:
  - client_id: {APP}
    upstream: dot
    scopes: [openid, profile, email]
    redirect_uris: ["{loopback.url}/callback", "com.example.app:/oauth2redirect"]
    instances:
      attestation: required
      manual_certification: true
mail:
  smtp_host: 127.0.0.1
  smtp_port: {sink.port}
  ca_file: {sink.certificate}
  username: gatehouse
  password_env: GATEHOUSE_SMTP_PASSWORD
  from: gatehouse@example.test
sessions:
  encryption_keys_file: {session_keys(workdir, "certification-session-keys", seen)}
"""
            with run_gatehouse(workdir, "certification", config, up["env"],
                               extra_env={"GATEHOUSE_SMTP_PASSWORD": smtp_password}) as process:
                yield {**process, "url": f"http://127.0.0.1:{port}", "sink": sink, "loopback": loopback}
    finally:
        sink.stop()
        loopback.stop()


def register(setup):
    answer = requests.post(setup["url"] + "/oauth/register", json={"software_id": APP}, timeout=10)
    assert answer.status_code == 201, answer.text
    return answer.json()["client_id"]


SEEN = []  # the module's `seen`, for the helpers below (every code and pending id goes to the secret scan)


def code_in(message):
    found = re.search(r"Your code: (\d{6})", message.get_payload(decode=True).decode())
    assert found, "the e-mail holds no 6-digit code"
    for seen in SEEN:
        seen.add(found.group(1), kind="e-mailed certification code")
    return found.group(1)


def pending_in(page):
    pending = re.search(r'name="pending" value="([^"]+)"', page).group(1)
    for seen in SEEN:
        seen.add(pending, kind="paused sign-in id")
    return pending


def paused_sign_in(setup, seen, username=USERNAME):
    """A sign-in of a new instance driven without a browser, up to Gatehouse's code page."""
    instance = register(setup)
    app = App(setup, seen, client_id=instance, redirect_uri="com.example.app:/oauth2redirect")
    mark = setup["sink"].count()
    page = InAppBrowser(username=username, seen=seen).follow(app.authorize_url(scope="openid profile email"), app.redirect_uri)
    assert not isinstance(page, str), f"the sign-in did not pause: {page}"
    return instance, app, page, mark


def certify(setup, pending, code):
    return requests.post(setup["url"] + "/oauth/certify", data={"pending": pending, "code": code}, timeout=10, allow_redirects=False)


def test_a_real_browser_certifies_an_instance_with_the_emailed_code(setup, browser, seen):
    instance = register(setup)
    app = App(setup, seen, client_id=instance, redirect_uri=setup["loopback"].url + "/callback")
    mark = setup["sink"].count()
    browser.get(app.authorize_url(scope="openid profile email"))
    WebDriverWait(browser, 30).until(expected_conditions.presence_of_element_located((By.NAME, "username")))
    browser.find_element(By.NAME, "username").send_keys(USERNAME)
    password = browser.find_element(By.NAME, "password")
    password.send_keys(PASSWORD)
    password.submit()
    WebDriverWait(browser, 30).until(expected_conditions.presence_of_element_located((By.ID, "code")))
    assert browser.current_url.startswith(setup["url"] + "/oauth/callback")
    assert "a***@example.test" in browser.page_source
    message, under_tls = setup["sink"].wait_for(EMAIL, after=mark)
    assert under_tls, "the code crossed the SMTP connection in clear"
    assert message["From"] == "<gatehouse@example.test>" and APP in message["Subject"]
    code = code_in(message)
    seen.add(code, kind="code or token")
    browser.find_element(By.ID, "code").send_keys(code)
    browser.find_element(By.ID, "submit").click()
    WebDriverWait(browser, 30).until(expected_conditions.element_to_be_clickable((By.ID, "allow")))
    assert "Allow this app" in browser.page_source
    browser.find_element(By.ID, "allow").click()
    received = setup["loopback"].wait_for("/callback")
    assert received["state"] == app.state and "code" in received
    seen.add(received["code"], kind="Gatehouse code")
    tokens = app.redeem(received["code"])
    assert tokens.status_code == 200, tokens.text
    # Certified now: the next sign-in of the instance does not pause, and no mail is sent.
    again = App(setup, seen, client_id=instance, redirect_uri="com.example.app:/oauth2redirect")
    before = setup["sink"].count()
    location = InAppBrowser(seen=seen).follow(again.authorize_url(scope="openid profile email"), again.redirect_uri)
    assert isinstance(location, str) and "code" in query(location)
    assert setup["sink"].count() == before


def test_five_wrong_codes_lock_the_sign_in(setup, seen):
    _, _, page, mark = paused_sign_in(setup, seen)
    pending = pending_in(page.text)
    right = code_in(setup["sink"].wait_for(EMAIL, after=mark)[0])
    wrong = "000000" if right != "000000" else "111111"
    for remaining in (4, 3, 2, 1):
        answer = certify(setup, pending, wrong)
        assert answer.status_code == 200 and f"{remaining} tr" in answer.text
        assert answer.headers["Content-Security-Policy"].startswith("default-src 'none'")
        assert answer.headers["X-Frame-Options"] == "DENY" and answer.headers["Cache-Control"] == "no-store"
    locked = certify(setup, pending, wrong)
    assert locked.status_code == 403 and "locked" in locked.text
    assert certify(setup, pending, right).status_code == 403  # the right code, too late
    assert requests.post(setup["url"] + "/oauth/certify/allow", data={"pending": pending, "decision": "allow"},
                         timeout=10, allow_redirects=False).status_code == 400


def test_a_malformed_code_is_not_counted_and_a_forged_pending_is_unknown(setup, seen):
    _, app, page, mark = paused_sign_in(setup, seen)
    pending = pending_in(page.text)
    right = code_in(setup["sink"].wait_for(EMAIL, after=mark)[0])
    for malformed in ("12345", "abcdef", "1234567", ""):
        answer = certify(setup, pending, malformed)
        assert answer.status_code == 400 and "6 digits" in answer.text and 'id="code"' in answer.text
    assert certify(setup, "forged", right).status_code == 400
    assert certify(setup, "A" * 43, right).status_code == 400  # well-formed, never issued
    allowed = certify(setup, pending, right)
    assert allowed.status_code == 200 and 'id="allow"' in allowed.text
    done = requests.post(setup["url"] + "/oauth/certify/allow", data={"pending": pending, "decision": "allow"}, timeout=10,
                         allow_redirects=False)
    assert done.status_code == 303
    received = query(done.headers["Location"])
    assert received["state"] == app.state
    seen.add(received["code"], kind="Gatehouse code")
    assert app.redeem(received["code"]).status_code == 200


def test_dont_allow_sends_access_denied_and_leaves_the_instance_uncertified(setup, seen):
    instance, app, page, mark = paused_sign_in(setup, seen)
    pending = pending_in(page.text)
    right = code_in(setup["sink"].wait_for(EMAIL, after=mark)[0])
    assert certify(setup, pending, right).status_code == 200
    denied = requests.post(setup["url"] + "/oauth/certify/allow", data={"pending": pending, "decision": "deny"}, timeout=10,
                           allow_redirects=False)
    assert denied.status_code == 303
    assert query(denied.headers["Location"])["error"] == "access_denied"
    assert app.redeem("anything").json()["error"] == "unauthorized_client"


def test_a_sign_in_without_an_email_cannot_be_certified_by_code(setup, seen):
    _, app, page, mark = paused_sign_in(setup, seen, username="noemail")
    assert "no e-mail address" in page.text
    back = re.search(r'id="back" href="([^"]+)"', page.text).group(1).replace("&amp;", "&")
    assert query(back)["error"] == "access_denied" and query(back)["state"] == app.state
    assert setup["sink"].count() == mark


def test_mail_goes_through_an_authenticated_relay(setup):
    # Runs last in this module: every code went through AUTH PLAIN after STARTTLS, with the configured password.
    assert setup["sink"].logins >= 1 and setup["sink"].refused_logins == 0
