"""The central look-alike seen from the tests and demos: `start` runs it as a process and yields a
Double (its URLs, /_control and its shorthands); `app_config` is one app of its configuration and
`gatehouse_upstream` the Gatehouse configuration in front of it."""

import json
from pathlib import Path

from ..doubleprocess import run_double
from .constants import FIXTURES

PACKAGE = Path(__file__).resolve().parent  # run as `python sandbox/central` (its __main__.py)


class ControlError(Exception):
    def __init__(self, status, value):
        super().__init__(f"/_control answered {status}: {value}")
        self.status, self.value = status, value


class Double:
    """A running central double seen from a test: `url`, `port`, `api_base`, `web_base`,
    `apple_jwks_url`; `control(op, **fields)` → the answer (dict; ControlError when not 200), and
    shorthands. Start one with `start(workdir, name, config)`."""

    def __init__(self, ready, process=None, log_path=None):
        self.url, self.port = ready["url"], ready["port"]
        self.api_base, self.web_base, self.apple_jwks_url = ready["api_base"], ready["web_base"], ready["apple_jwks_url"]
        self.process, self.log_path = process, log_path

    def control(self, op, **fields):
        import urllib.error
        import urllib.request
        request = urllib.request.Request(self.url + "/_control", data=json.dumps({"op": op, **fields}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise ControlError(error.code, error.read().decode(errors="replace")) from None

    def stats(self):
        return self.control("stats")

    def reset(self):
        return self.control("reset")

    def next_user(self, email, name, provider=None):
        return self.control("next_user", email=email, name=name, provider=provider)

    def mint_code(self, app, email, name, provider="google", **extra):
        return self.control("mint_code", app=app, email=email, name=name, provider=provider, **extra)["code"]

    def last_magic_link(self, email):
        return self.control("last_magic_link", email=email)

    def apple_token(self, claims=None, **extra):
        return self.control("apple_token", claims=claims or {}, **extra)["token"]

    def fault(self, endpoint, kind, **extra):
        return self.control("fault", endpoint=endpoint, kind=kind, **extra)

    def clock(self, **fields):
        return self.control("clock", **fields)

    def age(self, what, seconds):
        return self.control("age", what=what, seconds=seconds)


def app_config(base_url, public_key_file=FIXTURES / "app-public.pem", mobile_scheme=None):
    """One entry of the config's "apps"."""
    entry = {"publicKeyPem": Path(public_key_file).read_text(), "baseUrl": base_url}
    if mobile_scheme:
        entry["mobileScheme"] = mobile_scheme
    return entry


def gatehouse_upstream(name, double, app_id, key_file=FIXTURES / "app-private.pem", extra=""):
    """The `upstreams:` entry of a Gatehouse configuration in front of this double (YAML list item)."""
    return f"""
  - name: {name}
    kind: central
    client_id: {app_id}
    s2s_private_key_file: {key_file}
    api_base: {double.api_base}
    web_base: {double.web_base}
    timeout: 5s{extra}"""


def start(workdir, name, config, env=None, python=None, record=None, port=0):
    """Context manager: runs this package as a process with `config` (dict), its log in WORKDIR/NAME.log;
    yields a Double. Secrets go to `record` (a path), else to GATEHOUSE_SECRETS_RECORD of `env`."""
    arguments = ("--port", str(port)) + (("--record", str(record)) if record else ())
    return run_double(PACKAGE, workdir, name, config, "central double", Double, env=env, python=python, arguments=arguments)
