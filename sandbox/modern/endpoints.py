"""The modern upstream's HTTP endpoints (sandbox/modern/serve.py): one handler for both listeners,
the wire log entry of every request, discovery, JWKS, PAR, authorize, token, revoke, userinfo."""

import base64
import json
import secrets
import sys
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from authlib.oauth2.rfc6749.errors import InvalidRequestError, OAuth2Error

from .authorization import certificate_facts, user_claims
from .model import (ASSERTION_ALGORITHMS, AUTH_METHODS, AUTH_PARAMS, PUBLIC_PARAMS, REQUEST_URI_PREFIX, WireRequest,
                    certificate_thumbprint)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection is closed after a minute

    def log_message(self, format, *args):
        pass  # the access log is written by `finish_entry`, without the query

    @property
    def state(self):
        return self.server.state

    @property
    def listener(self):
        return self.server.listener

    def peer_certificate(self):
        try:
            return self.connection.getpeercert(binary_form=True)
        except (ValueError, AttributeError):
            return None

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def parameters(self, raw):
        parsed = parse_qs(raw, keep_blank_values=True)
        duplicated = sorted(name for name, values in parsed.items() if len(values) > 1)
        return {name: values[0] for name, values in parsed.items()}, duplicated

    def new_entry(self, endpoint, data, kind):
        entry = {"at": time.time(), "listener": self.listener, "method": self.command, "path": urlsplit(self.path).path,
                 "endpoint": endpoint, kind: sorted(data), "client_id": data.get("client_id"),
                 "params": {name: data[name] for name in PUBLIC_PARAMS if name in data},
                 "client_auth": None, "client_assertion": None, "client_certificate": None, "status": None, "error": None}
        der = self.peer_certificate()
        if der:
            entry["client_certificate"] = certificate_facts(der)[1]
        return entry

    def answer(self, entry, status, body, headers=()):
        """Writes (status, body, headers): a dict body as JSON; logs the entry."""
        headers = list(headers)
        if isinstance(body, dict) or isinstance(body, list):
            if isinstance(body, dict) and "error" in body and entry is not None:
                entry["error"] = body["error"]
                entry["error_description"] = body.get("error_description")
            payload = json.dumps(body).encode()
            if not any(name.lower() == "content-type" for name, _ in headers):
                headers.append(("Content-Type", "application/json"))
        else:
            payload = (body or "").encode() if isinstance(body, str) else (body or b"")
        if entry is not None:
            location = dict((name.lower(), value) for name, value in headers).get("location")
            if location and "error=" in location:
                returned = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
                entry["error"], entry["error_description"] = returned.get("error"), returned.get("error_description")
            entry["status"] = status
            self.state.append_log(entry)
        self.send_response(status)
        for name, value in headers:
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        if not self.server.quiet:
            sys.stderr.write(f"{self.command} {urlsplit(self.path).path} [{self.listener}] {status}\n")

    def error(self, entry, status, error, description, headers=()):
        return self.answer(entry, status, {"error": error, "error_description": description},
                           [("Cache-Control", "no-store"), *headers])

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def dispatch(self, method):
        path = urlsplit(self.path).path
        mtls = self.listener == "mtls"
        routes = {
            ("GET", "/.well-known/openid-configuration"): self.discovery,
            ("GET", "/.well-known/oauth-authorization-server"): self.discovery,
            ("GET", "/jwks.json"): self.jwks,
            ("GET", "/authorize"): self.authorize,
            ("POST", "/par"): self.par,
            ("POST", "/token"): self.token,
            ("POST", "/revoke"): self.revoke,
            ("GET", "/userinfo"): self.userinfo,
            ("POST", "/userinfo"): self.userinfo,
            ("GET", "/_test/log"): self.test_log,
        }
        if mtls and path not in ("/par", "/token", "/revoke", "/userinfo"):
            route = None
        else:
            route = routes.get((method, path))
        body = self.read_body() if method == "POST" else b""
        try:
            if route is None:
                return self.answer(None, 404, {"error": "not_found"})
            route(body)
        except Exception:  # a bug of this server: 500, with the traceback on stderr
            import traceback
            traceback.print_exc()
            try:
                self.answer(None, 500, {"error": "server_error", "error_description": "modern.py failed; see its stderr"})
            except OSError:
                pass

    # --- endpoints ---

    def discovery(self, _):
        state = self.state
        aliases = {"token_endpoint": state.endpoint("token", True), "revocation_endpoint": state.endpoint("revocation", True),
                   "userinfo_endpoint": state.endpoint("userinfo", True),
                   "pushed_authorization_request_endpoint": state.endpoint("par", True)}
        document = {
            "issuer": state.issuer,
            "authorization_endpoint": state.endpoint("authorize"),
            "token_endpoint": state.endpoint("token"),
            "userinfo_endpoint": state.endpoint("userinfo"),
            "jwks_uri": state.issuer + "/jwks.json",
            "revocation_endpoint": state.endpoint("revocation"),
            "pushed_authorization_request_endpoint": state.endpoint("par"),
            "require_pushed_authorization_requests": bool(state.config.get("require_pushed_authorization_requests", False)),
            "scopes_supported": ["openid", "profile", "email"],
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": AUTH_METHODS,
            "token_endpoint_auth_signing_alg_values_supported": ASSERTION_ALGORITHMS,
            "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
            "revocation_endpoint_auth_signing_alg_values_supported": ASSERTION_ALGORITHMS,
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "nonce", "name", "given_name", "family_name", "email",
                                 "email_verified"],
            "mtls_endpoint_aliases": aliases,
            "tls_client_certificate_bound_access_tokens": True,
            "authorization_response_iss_parameter_supported": True,
        }
        self.answer(None, 200, document)

    def jwks(self, _):
        key = self.state.signing_key.as_dict(private=False)
        key.update({"kid": self.state.signing_kid, "use": "sig", "alg": "RS256"})
        self.answer(None, 200, {"keys": [key]})

    def test_log(self, _):
        since = int(parse_qs(urlsplit(self.path).query).get("since", ["0"])[0])
        with self.state.lock:
            entries = self.state.log[since:]
        self.answer(None, 200, entries)

    def oauth_request(self, data, entry, method="POST"):
        url = (self.state.issuer if self.listener == "main" else self.state.mtls_url) + self.path
        entry["url"] = url.split("?")[0]  # the URL the request was posted to: an "endpoint" audience
        return WireRequest(method, url, self.headers, data, self.listener, self.peer_certificate(), entry)

    def reply(self, entry, result, request=None):
        status, body, headers = result
        if request is not None:
            entry["client_auth"] = request.auth_method
            if entry.get("client_id") is None and request.client is not None:
                entry["client_id"] = request.client.client_id  # authenticated without a client_id parameter
        self.answer(entry, status, body, headers)

    def token(self, body):
        data, duplicated = self.parameters(body.decode(errors="replace"))
        entry = self.new_entry("token", data, "form")
        entry["grant_type"] = data.get("grant_type")
        record = self.state.record
        record.add("upstream authorization code", data.get("code"))
        record.add("PKCE verifier toward the upstream", data.get("code_verifier"))
        record.add("refresh token presented to the upstream", data.get("refresh_token"))
        record_basic(record, self.headers.get("Authorization", ""))
        if duplicated:
            return self.error(entry, 400, "invalid_request", f"Repeated parameters: {', '.join(duplicated)}")
        request = self.oauth_request(data, entry)
        server = self.server.oauth
        if data.get("grant_type") == "refresh_token":
            with self.state.refresh_lock:  # single use: one refresh of a token at a time
                result = server.create_token_response(request)
        else:
            result = server.create_token_response(request)
        status, answer, _ = result
        if status == 200 and isinstance(answer, dict):
            record.add("upstream access token", answer.get("access_token"))
            record.add("upstream refresh token", answer.get("refresh_token"))
            record.add("upstream ID token", answer.get("id_token"))
        self.reply(entry, result, request)

    def revoke(self, body):
        data, _ = self.parameters(body.decode(errors="replace"))
        entry = self.new_entry("revocation", data, "form")
        entry["revoked"] = None
        self.state.record.add("token presented to the upstream (revoked or introspected)", data.get("token"))
        record_basic(self.state.record, self.headers.get("Authorization", ""))
        request = self.oauth_request(data, entry)
        self.reply(entry, self.server.oauth.create_endpoint_response("revocation", request), request)

    def par(self, body):
        state = self.state
        data, duplicated = self.parameters(body.decode(errors="replace"))
        entry = self.new_entry("par", data, "form")
        state.record.add("Gatehouse state toward the upstream", data.get("state"))
        state.record.add("OpenID nonce", data.get("nonce"))
        record_basic(state.record, self.headers.get("Authorization", ""))
        if duplicated:
            return self.error(entry, 400, "invalid_request", f"Repeated parameters: {', '.join(duplicated)}")
        request = self.oauth_request(data, entry)
        server = self.server.oauth
        try:
            client = server.authenticate_client(request, AUTH_METHODS, "pushed_authorization_request")
        except OAuth2Error as error:
            return self.reply(entry, server.handle_error_response(request, error), request)
        entry["client_auth"] = request.auth_method
        if "request_uri" in data:  # RFC 9126 §2.1
            return self.error(entry, 400, "invalid_request", "request_uri must not be pushed")
        if data.get("client_id") not in (None, client.client_id):
            return self.error(entry, 400, "invalid_request", "client_id is not the authenticated client")
        params = {name: value for name, value in data.items() if name not in AUTH_PARAMS}
        params["client_id"] = client.client_id
        # The same validation as at the authorization endpoint (RFC 9126 §2.1), answered here as JSON.
        check = WireRequest("GET", state.endpoint("authorize"), self.headers, params, self.listener, None, entry)
        try:
            grant = server.get_authorization_grant(check)
            grant.validate_authorization_request()
        except OAuth2Error as error:
            return self.error(entry, 400, error.error, error.get_error_description() or error.error)
        request_uri = REQUEST_URI_PREFIX + secrets.token_urlsafe(24)
        expires_in = state.config.get("par_expires_in", 60)
        with state.lock:
            state.pushed[request_uri] = (client.client_id, params, time.time() + expires_in)
        self.answer(entry, 201, {"request_uri": request_uri, "expires_in": expires_in}, [("Cache-Control", "no-store")])

    def authorize(self, _):
        state = self.state
        data, duplicated = self.parameters(urlsplit(self.path).query)
        entry = self.new_entry("authorize", data, "query")
        entry["pushed"] = False
        state.record.add("Gatehouse state toward the upstream", data.get("state"))
        state.record.add("OpenID nonce", data.get("nonce"))
        if duplicated:
            return self.error(entry, 400, "invalid_request", f"Repeated parameters: {', '.join(duplicated)}")
        client = state.clients.get(data.get("client_id", ""))
        if "request_uri" in data:
            with state.lock:
                pushed = state.pushed.get(data["request_uri"])
                if pushed is not None and pushed[0] == data.get("client_id"):
                    del state.pushed[data["request_uri"]]  # single use (another client's attempt does not spend it)
            if pushed is None or pushed[2] < time.time() or pushed[0] != data.get("client_id"):
                reason = "unknown or already used" if pushed is None else ("expired" if pushed[2] < time.time() else "pushed by another client")
                return self.error(entry, 400, "invalid_request_uri", f"The request_uri is {reason}")
            params = pushed[1]
            entry["pushed"] = True
            entry["pushed_params"] = sorted(params)
        else:
            if client is not None and (state.config.get("require_pushed_authorization_requests") or client.require_par):
                redirect_uri = data.get("redirect_uri") or client.get_default_redirect_uri()
                error = InvalidRequestError("Pushed authorization requests are required (RFC 9126): send request_uri from the PAR endpoint",
                                            state=data.get("state"))
                if redirect_uri and client.check_redirect_uri(redirect_uri):
                    error.redirect_uri = redirect_uri
                    return self.redirect_error(entry, error)
                return self.error(entry, 400, error.error, error.get_error_description())
            params = data
        request = WireRequest("GET", state.issuer + self.path, self.headers, params, self.listener, None, entry)
        request.pushed = entry["pushed"]
        server = self.server.oauth
        try:
            grant = server.get_authorization_grant(request)
            redirect_uri = grant.validate_authorization_request()
            status, body, headers = grant.create_authorization_response(redirect_uri, dict(state.user))
        except OAuth2Error as error:
            error.state = params.get("state")
            if error.redirect_uri:
                return self.redirect_error(entry, error)
            return self.error(entry, 400, error.error, error.get_error_description() or error.error)
        self.answer(entry, status, body, [(name, with_issuer(value, state.issuer) if name == "Location" else value)
                                          for name, value in headers])

    def redirect_error(self, entry, error):
        status, body, headers = error()
        self.answer(entry, status, body, [(name, with_issuer(value, self.state.issuer) if name == "Location" else value)
                                          for name, value in headers])

    def userinfo(self, body):
        state = self.state
        data, _ = self.parameters(body.decode(errors="replace")) if self.command == "POST" else ({}, [])
        entry = self.new_entry("userinfo", data, "form")
        scheme, _, value = self.headers.get("Authorization", "").partition(" ")
        token_string = value.strip() if scheme.lower() == "bearer" else data.get("access_token")
        state.record.add("upstream access token", token_string)
        if not token_string:
            return self.answer(entry, 401, b"", [("WWW-Authenticate", 'Bearer realm="modern"')])
        with state.lock:
            token = state.access_tokens.get(token_string)

        def refuse(description):
            escaped = description.replace('"', "'")
            return self.error(entry, 401, "invalid_token", description,
                              [("WWW-Authenticate", f'Bearer error="invalid_token", error_description="{escaped}"')])

        if token is None:
            return refuse("Unknown access token")
        entry["client_id"] = token.client_id
        if token.access_revoked:
            return refuse("The access token is revoked")
        if token.is_expired():
            return refuse("The access token has expired")
        if "openid" not in token.scope.split():
            return self.error(entry, 403, "insufficient_scope", "The access token lacks scope openid",
                              [("WWW-Authenticate", 'Bearer error="insufficient_scope", scope="openid"')])
        entry["bound"] = token.cnf is not None
        if token.cnf is not None:  # RFC 8705 §3
            der = self.peer_certificate()
            if self.listener != "mtls" or der is None:
                return refuse("The access token is bound to a client certificate; present it on the mtls_endpoint_aliases")
            if certificate_thumbprint(der) != token.cnf:
                return refuse("The client certificate is not the one the access token is bound to")
        self.answer(entry, 200, user_claims(token.user, token.scope), [("Cache-Control", "no-store")])


def with_issuer(location, issuer):
    """The redirect with RFC 9207's iss added."""
    parts = urlsplit(location)
    query = parts.query + ("&" if parts.query else "") + urlencode({"iss": issuer})
    return urlunsplit(parts._replace(query=query))


def record_basic(record, header):
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8", "replace")
        except ValueError:
            return
        record.add("upstream client secret", decoded.partition(":")[2])
