"""The FranceConnect look-alike's command line: reads the config, listens, prints its one ready
line on stdout and serves until SIGTERM or SIGINT (exit status 0)."""

import argparse
import json
import os
import signal
import sys
import threading

from ..secretsrecord import SecretsRecord
from .handler import Server, make_handler
from .provider import FranceConnect


def main():
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.franceconnect", description=sys.modules[__package__].__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--quiet", action="store_true")
    arguments = parser.parse_args()
    config = json.loads(open(arguments.config).read())
    record = SecretsRecord(os.environ.get("GATEHOUSE_SECRETS_RECORD"))
    server = Server((arguments.host, arguments.port), lambda *a: None)
    origin = f"http://{arguments.host}:{server.server_address[1]}"
    fc = FranceConnect(config, record, origin)
    server.RequestHandlerClass = make_handler(fc, arguments.quiet)

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({"ready": True, "url": origin, "issuer": fc.issuer, "id_token_iss": fc.id_token_iss,
                      "version": fc.version}), flush=True)
    sys.stdout = sys.stderr  # the ready line is the only stdout output
    server.serve_forever()
    server.server_close()
