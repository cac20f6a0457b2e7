#!/usr/bin/env python3
"""A counting pass-through proxy in front of the upstream's token endpoint (standard library only).

    token_proxy.py --target http://127.0.0.1:PORT/o/token/

Listens on a free loopback port and, once listening, prints one line to stdout:

    {"ready": true, "url": "http://127.0.0.1:PORT/o/token/"}

Every POST is forwarded as is (body, Authorization, Content-Type, Accept) to --target and the
upstream's answer (status and body, also a 400 invalid_grant) goes back unchanged. The proxy counts
the requests by their `grant_type`; `GET /_counts` answers with the counts so far, e.g.
{"total": 3, "authorization_code": 2, "refresh_token": 1}. SIGTERM stops it.

Benchmarks/run points the sealed Gatehouse instances' `token_endpoint` here, so the refresh storm
can report how many refresh grants reached the upstream.
"""

import argparse
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

FORWARDED = ("authorization", "content-type", "accept")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the upstream's token endpoint")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()

    counts = {"total": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: Gatehouse's HTTP client pools its connections

        def reply(self, status, body, content_type="application/json", extra=()):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in extra:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path != "/_counts":
                self.reply(404, b'{"error": "not found"}')
                return
            with lock:
                body = json.dumps(counts).encode()
            self.reply(200, body)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
            grant = parse_qs(body.decode("latin-1")).get("grant_type", ["(none)"])[0]
            with lock:
                counts["total"] += 1
                counts[grant] = counts.get(grant, 0) + 1
            request = urllib.request.Request(args.target, data=body, method="POST")
            for name in FORWARDED:
                if self.headers.get(name) is not None:
                    request.add_header(name, self.headers[name])
            try:
                with urllib.request.urlopen(request, timeout=args.timeout) as answer:
                    status, payload, kind = answer.status, answer.read(), answer.headers.get("Content-Type")
            except urllib.error.HTTPError as error:  # 400 invalid_grant and the like: passed on as is
                status, payload, kind = error.code, error.read(), error.headers.get("Content-Type")
            except OSError as error:
                self.reply(502, json.dumps({"error": "token_proxy", "detail": str(error)}).encode())
                return
            self.reply(status, payload, kind or "application/json", [("Cache-Control", "no-store")])

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(json.dumps({"ready": True, "url": f"http://127.0.0.1:{server.server_address[1]}/o/token/"}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
