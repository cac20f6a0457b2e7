"""The FranceConnect look-alike over HTTP: one request handler that routes to a FranceConnect
(provider.py), answers a Problem with the HTML error page and logs method, path and status
(never the interaction id, never a secret); and the threading server it runs in."""

import html
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .catalog import SESSION_COOKIE
from .jose import json_bytes
from .problem import Problem


ERROR_PAGE = """<!doctype html>
<html lang="fr"><head><meta charset="utf-8"><title>Erreur - FranceConnect (double de test)</title></head>
<body><h1>Une erreur est survenue</h1><p>Code erreur : <strong>{code}</strong></p><p>{message}</p></body></html>
"""


def make_handler(fc, quiet):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "FranceConnectDouble/1"

        def log_message(self, *args):
            pass

        def log_line(self, status):
            if not quiet:
                path = urlsplit(self.path).path
                if "/interaction/" in path:  # the interaction id is in the path: never logged
                    head, _, tail = path.partition("/interaction/")
                    path = head + "/interaction/…" + ("/" + tail.split("/", 1)[1] if "/" in tail else "")
                sys.stderr.write(f"{self.command} {path} {status}\n")
                sys.stderr.flush()

        def send(self, status, content_type, body, headers=None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                if isinstance(value, list):
                    for v in value:
                        self.send_header(name, v)
                else:
                    self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.log_line(status)

        def redirect(self, location, headers=None, status=303):
            self.send(status, "text/plain; charset=utf-8", b"", {"Location": location, **(headers or {})})

        def error_page(self, problem):
            body = ERROR_PAGE.format(code=html.escape(problem.code), message=html.escape(str(problem))).encode()
            self.send(problem.status, "text/html; charset=utf-8", body)

        def send_json(self, status, value, headers=None):
            self.send(status, "application/json; charset=utf-8", json_bytes(value), headers)

        def cookie(self):
            for header in self.headers.get_all("Cookie", []):
                for part in header.split(";"):
                    name, _, value = part.strip().partition("=")
                    if name == SESSION_COOKIE:
                        return value
            return None

        def read_form(self):
            length = int(self.headers.get("Content-Length", 0) or 0)
            body = self.rfile.read(length) if length else b""
            return body, parse_qs(body.decode(errors="replace"), keep_blank_values=True)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            self.route("GET", parse_qs(urlsplit(self.path).query, keep_blank_values=True), None)

        def do_POST(self):
            body, form = self.read_form()
            self.route("POST", form, body)

        def route(self, method, params, body):
            path = urlsplit(self.path).path
            try:
                self.dispatch(method, path, params, body)
            except Problem as problem:
                self.error_page(problem)
            except Exception as error:  # a bug of the double: say so loudly, never a secret
                sys.stderr.write(f"franceconnect double: {type(error).__name__} on {method} {path}\n")
                import traceback
                traceback.print_exc()
                self.send(500, "text/plain; charset=utf-8", b"internal error of the double")

        def dispatch(self, method, path, params, body):
            if path == "/_control" and method == "POST":
                try:
                    command = json.loads(body or b"{}")
                except ValueError:
                    raise Problem("control body is not JSON") from None
                fc.control(command)
                return self.send_json(200, {"ok": True})
            if path == "/_control/stats":
                return self.send_json(200, fc.public_stats())
            if not path.startswith(fc.prefix + "/"):
                raise Problem("not found", status=404, code="Y000404")
            rest = path[len(fc.prefix):]
            v2 = fc.version == "v2"
            if v2 and rest == "/.well-known/openid-configuration" and method == "GET":
                return self.send_json(200, fc.discovery())
            if v2 and rest == "/jwks" and method == "GET":
                keys = fc.jwks()
                if keys is None:
                    return self.send_json(503, {"error": "temporarily_unavailable"})
                return self.send_json(200, keys)
            if rest == "/authorize" and method in ("GET", "POST"):
                kind, value = fc.authorize(params)
                if kind == "page":
                    return self.redirect(f"{fc.prefix}/interaction/{value}")
                return self.redirect(value)
            if rest.startswith("/interaction/"):
                parts = rest.split("/")  # "", "interaction", uid[, action]
                uid = parts[2] if len(parts) > 2 else ""
                action = parts[3] if len(parts) > 3 else None
                if action is None and method == "GET":
                    return self.send(200, "text/html; charset=utf-8", fc.login_page(uid).encode())
                if action == "login" and method == "POST":
                    session, location = fc.login(uid, params, self.cookie())
                    return self.redirect(location, {"Set-Cookie": f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Lax"})
                if action == "abort" and method in ("GET", "POST"):
                    return self.redirect(fc.abort(uid))
            if rest == "/token" and method == "POST":
                status, content_type, payload = fc.token(params, self.headers.get("Authorization", ""))
                return self.send(status, content_type, payload, {"Pragma": "no-cache"})
            if rest == "/token/revocation" and method == "POST":
                status, content_type, payload = fc.revoke(params, self.headers.get("Authorization", ""))
                return self.send(status, content_type, payload)
            if rest == "/userinfo" and method in ("GET", "POST"):
                status, headers, content_type, payload = fc.userinfo(self.headers.get("Authorization", ""))
                return self.send(status, content_type, payload, headers)
            if rest == ("/session/end" if v2 else "/logout") and method == "GET":
                cookie = self.cookie()
                location = fc.end_session(params, cookie)
                return self.redirect(location, {"Set-Cookie": f"{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax"})
            raise Problem("not found", status=404, code="Y000404")

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
