"""django-oauth-toolkit (DOT): the real OAuth 2.0 / OpenID Connect server upstream of the default
demo, most end-to-end tests and the benchmark's sealed parts. Not a look-alike: DOT itself,
seeded from a JSON config at every start.

    serve.py          the server, a script (its docstring: the config keys, the endpoints)
    authserver.py     its URLs and OAuth2Validator (imported by Django)
    templates/        its login page
    check_flow.py     its self-check (python sandbox/dot/check_flow.py), with demo-config.json

    from sandbox import dot
    with dot.run(workdir, "upstream", config, env=env) as upstream:
        upstream.url      # http://127.0.0.1:PORT (the token endpoint is upstream.url + "/o/token/")
"""

from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

from ..doubleprocess import run_double

SERVE = Path(__file__).resolve().parent / "serve.py"


@dataclass
class RunningDOT:
    url: str
    process: Popen
    log: Path


def run(workdir, name, config, env=None, python=None):
    """A context manager: serve.py started from `config` (a dict, written to WORKDIR/NAME.json; its
    stderr in WORKDIR/NAME.log) on a free port, yielding a RunningDOT once its ready line is out
    and stopping it afterwards. `env` carries the client secrets its config names; `python` is
    the interpreter (the one running this, by default: it needs Django and DOT)."""
    return run_double(SERVE, workdir, name, config, "django-oauth-toolkit upstream",
                      lambda ready, process, log: RunningDOT(ready["url"], process, log),
                      env=env, python=python, arguments=("--port", "0", "--quiet"))
