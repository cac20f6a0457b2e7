"""A native app and its in-app browser, simulated: what Gatehouse's end-to-end tests and
the demo walkthrough both drive. Also the small process helpers they share."""

import base64
import hashlib
import json
import os
import re
import secrets
import socket
import threading
from urllib.parse import parse_qs, urlencode, urlsplit

import requests

APP_REDIRECT = "com.example.app:/oauth2redirect"
USERNAME, PASSWORD = "alice", "wonderland-42"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_line(stream, pattern, timeout, what):
    """Reads `stream` line by line until one matches; returns it. Fails after `timeout`."""
    found = {}

    def reader():
        for line in iter(stream.readline, ""):
            if re.search(pattern, line):
                found["line"] = line
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout)
    if "line" not in found:
        raise RuntimeError(f"{what} did not become ready within {timeout}s")
    return found["line"]


def pump(stream, sink, on_line=None):
    """Copies the rest of a process's output to a file, so the pipe never fills; `on_line`
    (e.g. a LogFollower's `feed`) sees every line too."""
    def run():
        for line in iter(stream.readline, ""):
            sink.write(line)
            sink.flush()
            if on_line is not None:
                on_line(line)
    threading.Thread(target=run, daemon=True).start()



class SecretsFile:
    """Records secrets into a JSON-lines file ({"kind", "value"} a line), for a process other
    than the test suite's (the demo's walkthrough): `App(…, seen=SecretsFile(path))`. The
    end-to-end suite reads the file back (its `seen.harvest()`). Each line is one O_APPEND write."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def add(self, *values, kind="code or token"):
        lines = "".join(json.dumps({"kind": kind, "value": value}) + "\n" for value in values if value and isinstance(value, str))
        if lines:
            os.write(self.fd, lines.encode())


def token_kind(name, value):
    """The kind of a token an app received, for the secrets record."""
    if name == "id_token":
        return "upstream ID token"
    if value.startswith(("gha_", "ghd_")):  # bearer, or bound to a DPoP key
        return "Gatehouse access token"
    if value.startswith("ghr_"):
        return "Gatehouse refresh token"
    return "upstream access token (passthrough)" if name == "access_token" else "upstream refresh token (passthrough)"


def pkce_pair():
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def query(location):
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


class InAppBrowser:
    """The in-app browser of RFC 8252: follows redirects and fills in the upstream's login form,
    stopping at the first redirect that leaves the web (the app's own URI)."""

    def __init__(self, username=USERNAME, password=PASSWORD, on_step=None, seen=None):
        self.session = requests.Session()
        self.credentials = {"username": username, "password": password}
        self.on_step = on_step or (lambda message: None)
        self.seen = seen  # where the secrets the browser carries are recorded (Gatehouse's state, the upstream's code)

    def remember(self, location):
        """Gatehouse's own state on its way to the upstream, the upstream's code on its way back."""
        if self.seen is None:
            return
        parameters = query(location)
        path = urlsplit(location).path
        if path.endswith("/authorize/") or path.endswith("/authorize"):
            self.seen.add(parameters.get("state"), kind="Gatehouse state toward the upstream")
        elif path.endswith("/oauth/callback"):
            self.seen.add(parameters.get("code"), kind="upstream authorization code")
            self.seen.add(parameters.get("state"), kind="Gatehouse state toward the upstream")

    def follow(self, url, stop_prefix):
        for _ in range(10):
            response = self.session.get(url, allow_redirects=False, timeout=10)
            self.on_step(f"GET {url.split('?')[0]} -> {response.status_code}")
            if response.status_code in (301, 302, 303):
                location = requests.compat.urljoin(url, response.headers["Location"])
                self.remember(location)
                if location.startswith(stop_prefix):
                    return location
                url = location
                continue
            if response.status_code == 200 and "csrfmiddlewaretoken" in response.text:
                url = self.log_in(url, response.text)
                if url.startswith(stop_prefix):
                    return url
                continue
            return response
        raise AssertionError("too many redirects")

    def log_in(self, url, page):
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        next_match = re.search(r'name="next" value="([^"]*)"', page)
        form = {"csrfmiddlewaretoken": token, **self.credentials}
        self.on_step(f"the upstream shows its login page; signing in as {self.credentials['username']}")
        if next_match:
            form["next"] = next_match.group(1).replace("&amp;", "&")
        response = self.session.post(url, data=form, headers={"Referer": url}, allow_redirects=False, timeout=10)
        assert response.status_code == 302, f"login failed: {response.status_code}"
        location = requests.compat.urljoin(url, response.headers["Location"])
        self.remember(location)
        return location


class App:
    """The native app: starts a sign-in at Gatehouse and talks to its token endpoint."""

    def __init__(self, gatehouse, seen=None, client_id="com.example.app", redirect_uri=APP_REDIRECT):
        self.base = gatehouse["url"]
        self.seen = seen
        self.client_id = client_id
        self.redirect_uri = redirect_uri
        self.verifier, self.challenge = pkce_pair()
        self.state = secrets.token_urlsafe(16)

    def _remember(self, *values, kind="code or token"):
        if self.seen is not None:
            self.seen.add(*values, kind=kind)

    def authorize_url(self, **overrides):
        parameters = {"response_type": "code", "client_id": self.client_id, "redirect_uri": self.redirect_uri,
                      "state": self.state, "code_challenge": self.challenge, "code_challenge_method": "S256",
                      "scope": "read write"}
        parameters.update(overrides)
        return f"{self.base}/oauth/authorize?" + urlencode({k: v for k, v in parameters.items() if v is not None})

    def sign_in(self, browser=None):
        """Runs the browser part; returns the parameters the app receives on its redirect URI."""
        browser = browser or InAppBrowser()
        if browser.seen is None:
            browser.seen = self.seen
        location = browser.follow(self.authorize_url(), self.redirect_uri)
        assert isinstance(location, str), f"sign-in stopped at HTTP {location.status_code}: {location.text[:300]}"
        received = query(location)
        relay_mode = received.get("state") != self.state  # relay mode: the upstream's code and Gatehouse's state
        self._remember(received.get("code"), kind="upstream authorization code" if relay_mode else "Gatehouse code")
        if relay_mode:
            self._remember(received.get("state"), kind="Gatehouse state toward the upstream")
        return received

    def token(self, headers=None, **form):
        """POSTs `form` to the token endpoint (`headers`: e.g. a DPoP proof)."""
        form.setdefault("client_id", self.client_id)
        response = requests.post(f"{self.base}/oauth/token", data=form, headers=headers, timeout=30)
        if response.headers.get("Content-Type", "").startswith("application/json"):
            body = response.json()
            if isinstance(body, dict):
                for name in ("access_token", "refresh_token", "id_token"):
                    if isinstance(body.get(name), str):
                        self._remember(body[name], kind=token_kind(name, body[name]))
        return response

    def redeem(self, code, verifier="own", headers=None, **extra):
        self._remember(self.verifier, kind="app PKCE verifier")
        verifier = self.verifier if verifier == "own" else verifier
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": self.redirect_uri}
        if verifier is not None:
            form["code_verifier"] = verifier
        form.update(extra)
        return self.token(headers=headers, **form)

    def refresh(self, refresh_token, headers=None):
        return self.token(headers=headers, grant_type="refresh_token", refresh_token=refresh_token)
