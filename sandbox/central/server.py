"""The central look-alike's command line: reads the config, listens, prints its one ready line on
stdout and serves until SIGTERM or SIGINT (exit status 0; requests held by a "slow" fault are
released first)."""

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from ..secretsrecord import SecretsRecord
from .handler import Server, make_handler
from .provider import Central


def main():
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.central", description=sys.modules[__package__].__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--record", default=None, help="secrets record file (default: $GATEHOUSE_SECRETS_RECORD)")
    parser.add_argument("--quiet", action="store_true")
    arguments = parser.parse_args()
    config = json.loads(Path(arguments.config).read_text())
    record = SecretsRecord(arguments.record or os.environ.get("GATEHOUSE_SECRETS_RECORD"))
    server = Server((arguments.host, arguments.port), lambda *a: None)
    port = server.server_address[1]
    origin = f"http://{arguments.host}:{port}"
    central = Central(config, record, origin)
    server.RequestHandlerClass = make_handler(central, arguments.quiet)

    def shutdown(*_):
        central.release.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    print(json.dumps({"ready": True, "url": origin, "port": port, "api_base": origin + "/api", "web_base": origin,
                      "apple_jwks_url": origin + "/apple/auth/keys"}), flush=True)
    sys.stdout = sys.stderr  # the ready line is the only stdout output
    server.serve_forever()
    server.server_close()
