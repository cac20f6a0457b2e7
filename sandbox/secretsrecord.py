"""The secrets record the test servers keep (sandbox/dot/serve.py, sandbox/modern, sandbox/franceconnect/,
sandbox/central/).

When the environment variable GATEHOUSE_SECRETS_RECORD names a file, a server appends to it one
JSON line {"kind": …, "value": …} for every secret it is given or gives out; the end-to-end suite
searches Gatehouse's logs and databases for all of them (test_zz_no_secrets_logged.py).
"""

import json
import os


class SecretsRecord:
    """Appends {"kind", "value"} JSON lines to the file named by GATEHOUSE_SECRETS_RECORD."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None

    def add(self, kind, *values):
        if self.fd is None:
            return
        lines = "".join(json.dumps({"kind": kind, "value": value}) + "\n" for value in values if value and isinstance(value, str))
        if lines:
            os.write(self.fd, lines.encode())  # one write: lines of concurrent writers never interleave


def stop(process, timeout=10):
    """Terminates a server process, killing it when it does not stop within `timeout` seconds."""
    process.terminate()
    try:
        process.wait(timeout)
    except Exception:  # subprocess.TimeoutExpired
        process.kill()
        process.wait(timeout)
