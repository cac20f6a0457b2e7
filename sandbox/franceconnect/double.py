"""The FranceConnect look-alike seen from the tests and demos: `start` runs it as a process and
yields a Double (its URLs, /_control, stats); Browser is a person at a browser that signs in on
its login page; `gatehouse_upstream` is the Gatehouse configuration in front of it."""

import html
import json
from pathlib import Path
from urllib.parse import urlsplit

from ..doubleprocess import run_double
from .catalog import SESSION_COOKIE

PACKAGE = Path(__file__).resolve().parent  # run as `python sandbox/franceconnect` (its __main__.py)


class Double:
    """A running double seen from a test: `url`, `issuer`, `id_token_iss`, `control(**command)`,
    `stats()`, `fault(...)` shorthands. Start one with `start(workdir, name, config, env)`."""

    def __init__(self, ready, process, log_path):
        self.url, self.issuer, self.id_token_iss, self.version = ready["url"], ready["issuer"], ready["id_token_iss"], ready["version"]
        self.process, self.log_path = process, log_path

    def control(self, **command):
        import urllib.request
        request = urllib.request.Request(self.url + "/_control", data=json.dumps(command).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        return self

    def stats(self):
        import urllib.request
        with urllib.request.urlopen(self.url + "/_control/stats", timeout=10) as response:
            return json.loads(response.read())

    def identity(self, client_id, index=0):
        """The claims (and pairwise `sub`) identity `index` has toward `client_id`."""
        return self.stats()["identities"][client_id][index]


class Browser:
    """A person at a browser, simulated with requests: follows redirects; on the double's login
    page picks identity `identity` and presses "Continuer" (or "Annuler" when `cancel`). Keeps
    cookies (the FranceConnect session cookie among them) across calls. `visited` lists the
    paths it went through (no query: no secret)."""

    def __init__(self, identity=0, cancel=False):
        import requests
        self.session = requests.Session()
        self.identity, self.cancel = identity, cancel
        self.visited = []
        self.login_pages = 0

    def follow(self, url, stop_prefix):
        """The first URL starting with `stop_prefix` reached (a string), or the first answer that
        is neither a redirect nor the login page (a requests.Response)."""
        import re
        from urllib.parse import urljoin
        for _ in range(20):
            response = self.session.get(url, allow_redirects=False, timeout=30)
            self.visited.append(f"GET {urlsplit(url).netloc}{urlsplit(url).path} {response.status_code}")
            if response.status_code in (301, 302, 303, 307):
                url = urljoin(url, response.headers["Location"])
                if url.startswith(stop_prefix):
                    return url
                continue
            if response.status_code == 200 and 'id="login-form"' in response.text:
                self.login_pages += 1
                action = re.search(r'<form method="post" action="([^"]+)" id="%s"' %
                                   ("cancel-form" if self.cancel else "login-form"), response.text).group(1)
                target = urljoin(url, html.unescape(action))
                answer = self.session.post(target, data={} if self.cancel else {"identity": str(self.identity)},
                                           allow_redirects=False, timeout=30)
                self.visited.append(f"POST {urlsplit(target).netloc}{urlsplit(target).path} {answer.status_code}")
                if answer.status_code not in (302, 303):
                    return answer
                url = urljoin(target, answer.headers["Location"])
                if url.startswith(stop_prefix):
                    return url
                continue
            return response
        raise AssertionError(f"too many redirects: {self.visited}")

    def cookie(self):
        return self.session.cookies.get(SESSION_COOKIE)


def gatehouse_upstream(name, double, client_id, secret_env, extra=""):
    """The `upstreams:` entry of a Gatehouse configuration in front of this double (YAML, indented as a list item)."""
    return f"""
  - name: {name}
    kind: franceconnect
    version: {double.version}
    issuer: {double.issuer}
    client_id: {client_id}
    client_secret_env: {secret_env}
    timeout: 5s{extra}"""


def start(workdir, name, config, env=None, python=None):
    """Context manager: runs this package as a process with `config` (dict), its log in WORKDIR/NAME.log;
    yields a Double. The environment must hold the clients' secrets (client_secret_env)."""
    return run_double(PACKAGE, workdir, name, config, "FranceConnect double", Double, env=env, python=python,
                      arguments=("--port", "0"))
