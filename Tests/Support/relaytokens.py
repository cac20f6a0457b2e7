"""Access tokens for relay tests, fresh or warm, so every relay test can run through both of
Gatehouse's relay paths for real:

- a *fresh* token has never been shown to Gatehouse: its first relayed request is an identity
  cache miss and takes the general path (Hummingbird + AsyncHTTPClient);
- a *warm* token has had one relayed GET on a route of the same upstream: its identity is
  cached, so a later GET or HEAD without a body takes the fast path (the NIO handler).

Tokens come from real sign-ins (Gatehouse in front of the real authorization server),
made a few at a time in parallel and handed out once each.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import requests

from sandbox.nativeapp import PASSWORD, USERNAME, App, InAppBrowser

#: Users of the upstream (the conftest seeds them) and their passwords.
PASSWORDS = {USERNAME: PASSWORD, "bob": "builder-42", "eve": "eavesdrop-42"}

#: A relayed GET that warms a token for a route: identity caches are per upstream, so any
#: route of the same upstream will do; routes whose backend cannot answer 200 use another.
WARM_PATHS = {
    "/api/contracts": "/api/contracts/warm",
    "/api/json": "/api/json/warm", "/api/passthrough": "/api/json/warm", "/api/slow": "/api/json/warm",
    "/api/down": "/api/json/warm", "/api/small": "/api/json/warm",
    "/api/introspected": "/api/introspected/warm", "/api/admin": "/api/introspected/warm",
    "/api/userinfo": "/api/userinfo/warm",
}

#: Identity answers are cached for 5 minutes (cache_ttl); a warm token older than this is
#: replaced, so it cannot go cold in the middle of a test.
WARM_FOR_SECONDS = 180


def issue_token(gatehouse, seen, client_id="com.example.app", username=USERNAME, scope="read write"):
    """A fresh access token for `username`, through Gatehouse from the real upstream."""
    app = App(gatehouse, seen, client_id=client_id)
    browser = InAppBrowser(username=username, password=PASSWORDS[username], seen=seen)
    location = browser.follow(app.authorize_url(scope=scope), app.redirect_uri)
    assert isinstance(location, str), f"sign-in stopped at HTTP {location.status_code}"
    code = dict(pair.split("=", 1) for pair in urlsplit(location).query.split("&"))["code"]
    if seen is not None:
        seen.add(code, kind="Gatehouse code")
    tokens = app.redeem(code)
    assert tokens.status_code == 200, tokens.text
    return tokens.json()["access_token"]


class TokenSupply:
    def __init__(self, gatehouse, seen, batch=4):
        self.gatehouse = gatehouse
        self.seen = seen
        self.batch = batch
        self.lock = threading.Lock()
        self.spare = {}  # (client_id, username, scope) -> [fresh tokens]
        self.warmed = {}  # (warm path, client_id, username, scope) -> (token, when)

    def fresh(self, client_id="com.example.app", username=USERNAME, scope="read write"):
        """A token Gatehouse has never seen (handed out once)."""
        key = (client_id, username, scope)
        with self.lock:
            spare = self.spare.setdefault(key, [])
            if not spare:
                with ThreadPoolExecutor(self.batch) as pool:
                    spare.extend(pool.map(lambda _: issue_token(self.gatehouse, self.seen, client_id, username, scope),
                                          range(self.batch)))
            return spare.pop()

    def warm(self, route="/api/contracts", client_id="com.example.app", username=USERNAME, scope="read write"):
        """A token whose identity for `route`'s upstream Gatehouse has cached."""
        path = WARM_PATHS.get(route, route + "/warm")
        key = (path, client_id, username, scope)
        with self.lock:
            token, when = self.warmed.get(key, (None, 0.0))
        if token is None or time.monotonic() - when > WARM_FOR_SECONDS:
            token = self.fresh(client_id, username, scope)
            when = time.monotonic()
            response = requests.get(self.gatehouse["url"] + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert response.status_code == 200, f"warming {path}: {response.status_code} {response.text[:300]}"
            with self.lock:
                self.warmed[key] = (token, when)
        return token
