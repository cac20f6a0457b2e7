"""The central look-alike over HTTP: one request handler that routes to a Central (provider.py),
carries out faults on the wire (a dropped connection, a held answer, a wrong one), answers with
Hono's not-found where no route matches, and logs method, path, status and a refusal's reason
(never a code, token or signature); and the threading server it runs in."""

import json
import socket
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .answers import Answer, PageAnswer
from .constants import HONO_NOT_FOUND, S2S_ROUTES


ERROR_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Error - central sign-in (test double)</title></head>
<body><h1>{status}</h1><p>{message}</p></body></html>
"""


def make_handler(central, quiet):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "CentralDouble/1"

        def log_message(self, *args):
            pass

        def log_line(self, status, note=""):
            if not quiet:
                sys.stderr.write(f"{self.command} {urlsplit(self.path).path} {status}{' ' + note if note else ''}\n")
                sys.stderr.flush()

        def send(self, status, content_type, body, headers=None, note=""):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.log_line(status, note)

        def send_json(self, status, value, headers=None, note=""):
            self.send(status, "application/json", json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(),
                      headers, note)

        def page_error(self, answer):
            import html
            body = ERROR_PAGE.format(status=answer.status, message=html.escape(answer.message)).encode()
            self.send(answer.status, "text/html; charset=utf-8", body)

        def read_body(self):
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length", 0) or 0)
            return self.rfile.read(length) if length else b""

        def drop_connection(self):
            """The "down" fault: no answer, the connection reset."""
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            self.close_connection = True
            self.log_line("-", "(fault down: connection dropped)")

        def apply_fault(self, fault, endpoint):
            """True when the fault answered (or dropped) the request."""
            kind = fault["kind"]
            if kind == "down":
                self.drop_connection()
                return True
            if kind == "slow":
                if fault["release"].wait(fault["seconds"]):  # released by reset, fault none or shutdown: no answer
                    self.drop_connection()
                    return True
                return False  # answers normally, late
            if kind == "500":
                self.send_json(500, {"status": 500, "message": "Internal Server Error"}, note="(fault 500)")
            elif kind == "garbage":
                self.send(200, "application/json", b"<html>not json\x00\xff", note="(fault garbage)")
            elif kind == "wrong_shape":
                self.send_json(200, {"unexpected": True}, note="(fault wrong_shape)")
            elif kind == "401":
                self.send_json(401, {"status": 401, "message": "Invalid signature"}, note="(fault 401)")
            elif kind == "403":  # verify.ts before the S2S signature: the RSA-encrypted code did not decrypt
                self.send_json(403, {"status": 403, "message": "Auth code could not be verified"}, note="(fault 403)")
            elif kind == "400":  # api-router.ts's answer to a body the DTO refuses
                self.send_json(400, {"status": 400, "message": "Validation Error",
                                     "details": ["code: Invalid length: Expected <=1024 but received 1025"]}, note="(fault 400)")
            elif kind == "429":
                self.send_json(429, {"status": 429, "message": "Too many requests. Please try again later."},
                               note="(fault 429)")
            else:
                raise ValueError(kind)
            return True

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            self.route("GET", b"")

        def do_POST(self):
            self.route("POST", self.read_body())

        def do_PUT(self):
            self.route("PUT", self.read_body())

        def do_DELETE(self):
            self.route("DELETE", self.read_body())

        def route(self, method, body):
            path = urlsplit(self.path).path
            try:
                self.dispatch(method, path, body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                self.log_line("-", "(the client went away)")
            except Exception as error:  # a bug of the double: say so loudly, never a secret
                sys.stderr.write(f"central double: {type(error).__name__} on {method} {path}\n")
                import traceback
                traceback.print_exc()
                self.send(500, "text/plain; charset=utf-8", b"internal error of the double")

        def dispatch(self, method, path, body):
            params = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query, keep_blank_values=True).items()}
            if path == "/_control" and method == "POST":
                try:
                    command = json.loads(body or b"{}")
                    if not isinstance(command, dict):
                        raise ValueError("the command must be a JSON object")
                    status, value = central.control(command)
                except (ValueError, TypeError, KeyError) as error:
                    return self.send_json(400, {"error": str(error)})
                return self.send_json(status, value)
            if path == "/_control/stats" and method == "GET":
                return self.send_json(200, central.public_stats())
            if path in S2S_ROUTES:
                if method != "POST":
                    return self.not_found()
                # api-router.ts verifies against the route it registered, which is the path this
                # request arrived on: the raw request target's path, never a re-encoded one.
                return self.s2s(S2S_ROUTES[path], path, body)
            if path == "/auth" and method == "GET":
                return self.page("auth", central.auth_page, params)
            if path == "/auth/email-callback" and method == "GET":
                return self.page("email-callback", central.email_callback, params)
            if path == "/apple/auth/keys" and method == "GET":
                fault = central.take_fault("apple_keys")
                if fault and self.apply_fault(fault, "apple_keys"):
                    with central.lock:
                        central.stats["requests"]["apple_keys"] += 1
                    return None
                return self.send_json(200, central.apple_jwks())
            return self.not_found()

        def not_found(self):
            """No route: Hono's default notFound (`c.text("404 Not Found", 404)`), never the API's JSON error."""
            return self.send(404, "text/plain; charset=UTF-8", HONO_NOT_FOUND)

        def s2s(self, endpoint, url_path, body):
            headers = {name.lower(): self.headers.get(name) for name in self.headers.keys()}
            try:
                status, value = central.s2s(endpoint, url_path, headers, body)
            except Answer as answer:
                note = f"{answer.message} ({answer.detail or answer.message})" if answer.status == 401 else ""
                return self.send_json(answer.status, answer.body(), note=note)
            if status == "fault":
                if self.apply_fault(value, endpoint):
                    return None
                try:  # "slow": answer normally afterwards
                    status, value = central.s2s_handle(endpoint, value["app_id"], value["text"], value["entry"])
                except Answer as answer:
                    return self.send_json(answer.status, answer.body())
            return self.send_json(status, value)

        def page(self, endpoint, handler, params):
            fault = central.take_fault(endpoint)
            if fault and self.apply_fault(fault, endpoint):
                with central.lock:
                    central.stats["requests"][endpoint] += 1
                return None
            try:
                location = handler(params)
            except PageAnswer as answer:
                return self.page_error(answer)
            return self.send(302, "text/plain; charset=utf-8", b"", {"Location": location})

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
