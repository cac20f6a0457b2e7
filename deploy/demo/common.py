"""What Gatehouse's demos share (deploy/demo/walkthrough.py, franceconnect.py, central.py): the
numbered steps they print, starting Gatehouse from a configuration, the small local backend
behind its routes, the loopback "app" a person can sign in to with a browser, and the run
itself (--no-wait, --data, clean-up on Ctrl-C or SIGTERM).

The identity providers the FranceConnect and central demos talk to are the local look-alikes
in sandbox/ (the same ones the end-to-end tests use)."""

import argparse
import contextlib
import json
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from urllib.parse import urlencode

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the sandbox package
from sandbox import gatehouse as gatehouse_process  # noqa: E402
from sandbox.backends import EchoBackend  # noqa: E402,F401  (the demos' backend)
from sandbox.nativeapp import SecretsFile, free_port, pkce_pair, query  # noqa: E402,F401
from sandbox.stubserver import StubHandler, StubServer  # noqa: E402

#: When the end-to-end suite runs a demo it names a file in GATEHOUSE_SECRETS_RECORD: the codes,
#: verifiers and tokens the demo's app sees are recorded there, so the suite can check that none
#: of them reached a log or a database (the upstream records its side itself).
RECORD = SecretsFile(os.environ["GATEHOUSE_SECRETS_RECORD"]) if os.environ.get("GATEHOUSE_SECRETS_RECORD") else None

BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def step(number, text):
    print(f"\n{BOLD}[{number}] {text}{RESET}", flush=True)


def detail(text):
    print(f"    {text}", flush=True)


def heading(text):
    print(f"\n{BOLD}{text}{RESET}", flush=True)


def short(token):
    return token[:8] + "…" if token else "(none)"


def sqlite_server(port):
    """The `server:` and `store:` sections of a demo's Gatehouse: 127.0.0.1:PORT, its SQLite file
    in the demo's folder (the configuration's own)."""
    return gatehouse_process.server_and_store(port, "gatehouse.sqlite")


def start_gatehouse(data, config, env):
    """Gatehouse from the YAML text `config` (written to DATA/gatehouse.yaml, whose relative paths
    are DATA's: the key ring DATA/session-keys is made on first use), its log DATA/gatehouse.log.
    Returns it (a sandbox.gatehouse.GatehouseProcess: `stop()` ends it) once its ready line is out."""
    gatehouse_process.generate_keys(data / "session-keys")
    return gatehouse_process.start(data, "gatehouse", config, env=env)


def code_received(received, state):
    """Prints what the app got back on its redirect (a one-time Gatehouse code and its state);
    returns whether the state is the app's own."""
    matches = received.get("state") == state
    detail(f"the app receives a one-time Gatehouse code={short(received.get('code'))} and its own state back: "
           f"{'matches' if matches else 'DOES NOT MATCH'}")
    return matches


def relayed_call(base, path, access_token, backend, names):
    """GETs `path` through Gatehouse with the app's access token and prints the identity headers
    `names` the echo backend received, and whether an Authorization header reached it. Returns
    (the answer, the X-… headers received, whether Authorization reached the backend)."""
    answer = requests.get(f"{base}{path}", headers={"Authorization": f"Bearer {access_token}"}, timeout=10)
    seen = answer.json().get("headers", {}) if answer.status_code == 200 else {}
    headers = {name: value for name, value in seen.items() if name.startswith("x-") and name != "x-request-id"}
    authorization = "authorization" in seen
    detail(f"GET {path} -> HTTP {answer.status_code}; the backend at {backend.url} received:")
    for name in names:
        detail(f"  {name}: {headers.get(name)}")
    detail(f"  and an Authorization header: {authorization}")
    return answer, headers, authorization


def print_try_it(url, instructions):
    """How a person tries the same sign-in in a browser (the suite's browser test reads the URL
    on the line after "Open:")."""
    print(f"\nNow try it in a browser. Open:\n\n    {url}\n\n{instructions} The demo app on its loopback redirect "
          f"shows the tokens it received. Ctrl-C stops everything.")


def serve_loopback_app(base, client_id="com.example.app", scope="read", show=None):
    """A tiny "native app" on a loopback redirect (RFC 8252 §7.3) for a person with a browser: returns
    Gatehouse's /oauth/authorize URL (PKCE S256, redirect http://127.0.0.1:PORT/callback). On its
    callback the app redeems the code and shows the token response (tokens shortened) and what
    `show(tokens)` returns (HTML), if given."""
    port = free_port()
    verifier, challenge = pkce_pair()
    state = secrets.token_urlsafe(16)
    redirect = f"http://127.0.0.1:{port}/callback"

    class Handler(StubHandler):
        def do_GET(self):
            received = query(self.path)
            if received.get("state") != state:
                body = f"<p>Unexpected state or error: {received}</p>"
            elif "code" in received:
                tokens = requests.post(f"{base}/oauth/token", timeout=30, data={
                    "grant_type": "authorization_code", "client_id": client_id, "code": received["code"],
                    "redirect_uri": redirect, "code_verifier": verifier}).json()
                shown = {k: (short(v) if k.endswith("_token") else v) for k, v in tokens.items()}
                body = f"<h1>Signed in</h1><p>The app redeemed its code at Gatehouse and received:</p><pre>{json.dumps(shown, indent=2)}</pre>"
                if show and "access_token" in tokens:
                    body += show(tokens)
            else:
                body = f"<h1>Sign-in failed</h1><pre>{json.dumps(received, indent=2)}</pre>"
            page = f"<!doctype html><meta charset=utf-8><title>Demo app</title>{body}".encode()
            self.reply(200, page, "text/html; charset=utf-8")

    StubServer(Handler, port=port)  # listening until the demo ends
    parameters = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect, "state": state,
                  "code_challenge": challenge, "code_challenge_method": "S256", "scope": scope}
    return f"{base}/oauth/authorize?" + urlencode({k: v for k, v in parameters.items() if v is not None})


def arguments(description, default_data):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--no-wait", action="store_true", help="stop after the automatic walkthrough")
    parser.add_argument("--data", default=str(default_data), help=f"folder for the demo's files (default {default_data})")
    return parser.parse_args()


def run(description, default_data, demo):
    """Runs `demo(data, stack)` → (ok, try_it) with the demo's arguments: `stack` (an ExitStack)
    takes what must be stopped at the end; `try_it()` prints how to try it in a browser and is
    called unless --no-wait, after which the demo waits for Ctrl-C. Returns the exit status."""
    options = arguments(description, default_data)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the clean-up below on SIGTERM too
    data = Path(options.data)
    data.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.ExitStack() as stack:
            ok, try_it = demo(data, stack)
            print(f"\n{BOLD}Walkthrough {'complete' if ok else 'FAILED'}.{RESET}", flush=True)
            if not ok:
                return 1
            if not options.no_wait:
                try_it()
                threading.Event().wait()
        return 0
    except KeyboardInterrupt:
        return 0
