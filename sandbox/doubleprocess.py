"""Runs a stand-in of sandbox/ (a script, or a package's folder) as a process: its
config written as JSON, its log in the session workdir, its ready line (a JSON object on stdout) read
before anything talks to it, and the process stopped afterwards. Shared by every stand-in started
as a process: FranceConnect, the central provider, django-oauth-toolkit (sandbox.dot), the modern
upstream (sandbox.modern)."""

import contextlib
import json
import subprocess
import sys
from pathlib import Path

from .secretsrecord import stop


@contextlib.contextmanager
def run_double(script, workdir, name, config, describe, make, env=None, python=None, arguments=()):
    """Yields `make(ready, process, log_path)` for the double `script` started with `config` (a dict):
    `python SCRIPT --config WORKDIR/NAME.json …`, SCRIPT a file or a package's folder (its __main__.py).
    `describe` names it in the error raised when it dies before its ready line."""
    config_path = Path(workdir) / f"{name}.json"
    config_path.write_text(json.dumps(config))
    log_path = Path(workdir) / f"{name}.log"
    with open(log_path, "w") as log:
        command = [python or sys.executable, str(script), "--config", str(config_path), *arguments]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        try:
            line = process.stdout.readline()  # the ready line, or "" when it died
            if not line.startswith("{"):
                process.wait(10)
                raise RuntimeError(f"the {describe} {name} did not start:\n{log_path.read_text()[-2000:]}")
            yield make(json.loads(line), process, log_path)
        finally:
            stop(process)
