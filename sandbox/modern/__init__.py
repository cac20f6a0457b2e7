"""The modern upstream: an OpenID Connect provider over HTTPS with private_key_jwt (RFC 7523),
mutual TLS (RFC 8705) and pushed authorization requests (RFC 9126), from authlib's server side.

    serve.py          the entry point, a script (its docstring: config keys, listeners, endpoints, log)
    model.py          constants, client, code and token records, the server's State
    authorization.py  client authentication, PKCE, OpenID, authlib's AuthorizationServer
    endpoints.py      the HTTP handler of both listeners

    from sandbox import modern
    with modern.run(workdir, "modern-x", config, env=env) as double:
        double["url"], double["mtls_url"], double["ca"], double["log"](since=0)   # the wire log

Importing this package needs no authlib; serve.py does (run it with the repository's venv).
"""

from pathlib import Path

import requests

from ..doubleprocess import run_double

SERVE = Path(__file__).resolve().parent / "serve.py"


def run(workdir, name, config, env=None, python=None):
    """A context manager: serve.py started from `config` (a dict, written to WORKDIR/NAME.json; its
    stderr in WORKDIR/NAME.log) on free ports, stopped afterwards. Yields {"url", "mtls_url", "log",
    "process", "config", "ca"}: `ca` is server-ca.pem beside the config's server_certificate, and
    `log(since=0)` the wire log (a list of dicts, from /_test/log)."""
    server_ca = Path(config["server_certificate"]).parent / "server-ca.pem"

    def make(ready, process, _log_path):
        def wire_log(since=0):
            answer = requests.get(ready["url"] + f"/_test/log?since={since}", verify=str(server_ca), timeout=10)
            answer.raise_for_status()
            return answer.json()
        return {"url": ready["url"], "mtls_url": ready["mtls_url"], "log": wire_log, "process": process,
                "config": Path(workdir) / f"{name}.json", "ca": server_ca}

    return run_double(SERVE, workdir, name, config, "modern upstream", make, env=env, python=python,
                      arguments=("--port", "0", "--quiet"))
