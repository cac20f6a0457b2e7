"""A modern upstream authorization server for Gatehouse tests: private_key_jwt, mutual TLS, PAR.
This file is its entry point (the listeners); the package's other modules are its parts.

An OpenID Connect provider over HTTPS built from authlib's server side (authorization code grant,
PKCE, OpenID Connect code flow, refresh grant, RFC 7009 revocation, RFC 7523 client assertions),
with the parts authlib has no server code for written here from their RFCs: pushed authorization
requests (RFC 9126) and mutual-TLS client authentication and certificate-bound tokens (RFC 8705).
No database: everything lives in memory for the life of the process. Run it with the repo's venv:

    .venv/bin/python sandbox/modern/serve.py --config cfg.json [--port 0] [--mtls-port 0] [--host 127.0.0.1] [--quiet]

Once both listeners listen it prints exactly one line to stdout and nothing after it:

    {"ready": true, "url": "https://127.0.0.1:PORT", "mtls_url": "https://127.0.0.1:PORT2"}

`url` is the issuer. Access log (method, path without its query, listener, status) and errors go
to stderr (--quiet: tracebacks only); no secret is ever written there. SIGTERM/SIGINT exit 0.

Config (every key but "server_certificate", "server_key" and "clients" optional; defaults in
parentheses):

    {"server_certificate": "server.pem",      # PEM chain of both listeners (for 127.0.0.1)
     "server_key": "server-key.pem",
     "client_ca_file": "client-ca.pem",       # trust roots of tls_client_auth certificates (none)
     "trusted_self_signed_certificates": ["self.pem"],
                                              # certificates the mTLS listener accepts at the TLS
                                              # layer besides those of client_ca_file (see below)
     "require_pushed_authorization_requests": false,   # for every client (false)
     "par_expires_in": 60,                    # lifetime of a request_uri (60)
     "access_token_expires_in": 3600, "authorization_code_expires_in": 60,
     "assertion_leeway": 0,                   # clock skew allowed on exp/nbf/iat of assertions (0)
     "max_assertion_lifetime": null,          # refuse assertions whose exp - iat is longer (none)
     "clock_offset": 0,                       # seconds this server's clock is ahead (negative: behind)
     "user": {"sub": "alice-sub-1", "name": "Alice Liddell", "given_name": "Alice",
              "family_name": "Liddell", "email": "alice@example.test"},
     "clients": [{
        "client_id": "gatehouse-pkjwt",
        "token_endpoint_auth_method": "private_key_jwt",   # | tls_client_auth |
                                                            # self_signed_tls_client_auth | client_secret_basic
        "jwks": {"keys": [...]},              # the client's public keys, inline, or
        "jwks_uri": "http://127.0.0.1:8080/upstreams/modern/jwks.json",  # fetched at every verification
        "assertion_audience": "issuer",       # aud accepted: "issuer" (the issuer only),
                                              # "token_endpoint" (the main token endpoint URL only,
                                              # at every endpoint), "endpoint" (the exact URL of the
                                              # endpoint the assertion is posted to, listener and
                                              # path: as idpyoidc checks at each of its endpoints),
                                              # "any" (issuer, token, PAR, revocation endpoint URLs) ("any")
        "assertion_algorithms": ["RS256", "PS256", "ES256"],
        "tls_client_auth_subject_dn": "CN=gatehouse-mtls,O=Gatehouse Tests",  # tls_client_auth
        "client_secret_env": "ENV_VAR",       # client_secret_basic: env var holding the secret
        "redirect_uris": ["http://127.0.0.1:8080/oauth/callback"],
        "scopes": ["openid", "profile", "email"],           # what it may be granted (these)
        "max_assertion_lifetime": 30,         # this client's, instead of the server's
        "require_par": false}]}               # this client must push its requests (false)

Listeners (both HTTPS with the server certificate, HTTP/1.1 keep-alive):

    main (url)       asks for no client certificate. Everything but the mTLS aliases.
    mtls (mtls_url)  asks for a client certificate (CERT_OPTIONAL). Python's ssl cannot ask for a
                     certificate and accept any: the handshake verifies it against client_ca_file,
                     trusted_self_signed_certificates and the x5c of every self-signed client's
                     inline jwks. A certificate none of them vouches for fails the handshake (logged
                     with "handshake_error"). Which client a certificate authenticates is decided
                     after, by the auth method.

Endpoints:

    GET  /.well-known/openid-configuration   discovery (also /.well-known/oauth-authorization-server)
    GET  /jwks.json                          the RSA key of the ID tokens
    GET  /authorize                          authorization endpoint: signs the configured user in at
                                             once, redirects with code, state and iss (RFC 9207)
    POST /par        (main and mtls)         RFC 9126: 201 {"request_uri", "expires_in"}
    POST /token      (main and mtls)         authorization_code (PKCE S256 required for every
                                             client, nonce required with openid), refresh_token
                                             (rotating, single-use refresh tokens)
    POST /revoke     (main and mtls)         RFC 7009
    GET|POST /userinfo (main and mtls)       OpenID userinfo; certificate-bound tokens only on mtls,
                                             with the same certificate
    GET  /_test/log                          every request so far (below), JSON list; ?since=N
                                             skips the first N

Client authentication at /par, /token and /revoke (authlib's ClientAuthentication registry):
client_secret_basic (authlib's), private_key_jwt (authlib's JWTBearerClientAssertion: signature
against the client's jwks or jwks_uri, iss = sub, aud, exp, plus here: a jti seen before is
refused, iat required, exp - iat <= max_assertion_lifetime, the form's client_id must be sub,
the alg one of assertion_algorithms), tls_client_auth (RFC 8705 §2.1: a certificate issued by a
client_ca_file certificate, whose subject DN equals the registered one), and
self_signed_tls_client_auth (§2.2: the certificate is the x5c[0] of one key of the client's jwks
or jwks_uri). A client may use its registered method only. Failures are invalid_client, 401.

Tokens issued to a client authenticated by certificate are bound to it (RFC 8705 §3, cnf
x5t#S256, kept here): /userinfo then needs that certificate on the mtls listener, else 401
invalid_token.

Errors (RFC 6749 §5.2): JSON {"error", "error_description"} with status 400, or 401 and a
WWW-Authenticate header for invalid_client (token, PAR, revocation) and invalid_token (userinfo).
The authorization endpoint redirects its errors to a registered redirect_uri with error,
error_description, state and iss; without one it answers 400 JSON. A PAR-required client's plain
request: redirect with error=invalid_request. An unknown, spent, expired or other client's
request_uri: 400 {"error": "invalid_request_uri"}.

The log (/_test/log): one object per request, in arrival order:
    {"n", "at", "listener": "main" | "mtls", "method", "path", "url" (the listener's URL and the
     path, without the query: what an "endpoint" audience names), "endpoint", "status", "error",
     "error_description", "client_id" (the request's; else the authenticated client's), "form" / "query" (parameter names, sorted),
     "params" (values of the parameters that are no secret: response_type, client_id,
     redirect_uri, scope, code_challenge, code_challenge_method, grant_type, client_assertion_type,
     token_type_hint, prompt, request_uri), "client_auth" (the method that authenticated the
     client), "client_assertion": {"header", "claims"} (decoded, as received), "jwks_source"
     ("inline" | "jwks_uri"), "jwks_kids", "client_certificate": {"sha256" (base64url, the
     x5t#S256), "subject", "issuer"} (RFC 4514), "pushed" (authorize: served from a pushed
     request), "pushed_params" (its parameter names), "code_was_pushed" (token: the code came from
     a pushed request), "bound" (the tokens issued are certificate-bound), "refresh_rotated",
     "revoked" ("access_token" | "refresh_token" | null), "handshake_error", "refusal" (why a
     client assertion was refused: "unknown_key", "signature", "algorithm", "expired", "issued_in_future",
     "lifetime", "replayed", "claim <name>" (missing or invalid, e.g. "claim aud"), "client_id")}.
Handshake failures are entries too ({"endpoint": "tls-handshake", "handshake_error"}).

Secrets record: when GATEHOUSE_SECRETS_RECORD names a file, every secret received or issued is
appended to it as sandbox/dot/serve.py does (codes, verifiers, state, nonce, tokens, client secrets) and
every client assertion received ("client assertion").
"""

import argparse
import base64
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the sandbox package
from sandbox.modern.authorization import make_server  # noqa: E402
from sandbox.modern.endpoints import Handler  # noqa: E402
from sandbox.modern.model import State  # noqa: E402
from sandbox.secretsrecord import SecretsRecord  # noqa: E402


class TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address, context, listener, state, oauth, quiet):
        self.state, self.listener, self.oauth, self.quiet = state, listener, oauth, quiet
        super().__init__(address, Handler)
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request_thread(self, request, client_address):
        try:
            request.settimeout(30)
            request.do_handshake()
        except (ssl.SSLError, OSError) as error:
            self.state.append_log({"at": time.time(), "listener": self.listener, "endpoint": "tls-handshake",
                                   "path": None, "status": None, "error": "handshake_failed",
                                   "handshake_error": getattr(error, "reason", None) or type(error).__name__,
                                   "client_certificate": None, "client_auth": None, "client_assertion": None})
            self.shutdown_request(request)
            return
        super().process_request_thread(request, client_address)

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, ssl.SSLError, socket.timeout, TimeoutError)):
            return  # a client going away
        super().handle_error(request, client_address)


def contexts(config):
    main = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    main.minimum_version = ssl.TLSVersion.TLSv1_2
    main.load_cert_chain(config["server_certificate"], config["server_key"])
    mtls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    mtls.minimum_version = ssl.TLSVersion.TLSv1_2
    mtls.load_cert_chain(config["server_certificate"], config["server_key"])
    mtls.verify_mode = ssl.CERT_OPTIONAL
    anchors = 0
    if config.get("client_ca_file"):
        mtls.load_verify_locations(cafile=config["client_ca_file"])
        anchors += 1
    for path in config.get("trusted_self_signed_certificates", []):
        mtls.load_verify_locations(cafile=path)
        anchors += 1
    for client in config["clients"]:
        if client.get("token_endpoint_auth_method") == "self_signed_tls_client_auth":
            for key in (client.get("jwks") or {}).get("keys", []):
                chain = key.get("x5c")
                if isinstance(chain, list) and chain and isinstance(chain[0], str):
                    mtls.load_verify_locations(cadata=base64.b64decode(chain[0]))
                    anchors += 1
    if not anchors:  # a context with no trust anchor refuses every certificate; say why
        sys.stderr.write("modern.py: no client_ca_file nor self-signed certificate: the mtls listener accepts no certificate\n")
    return main, mtls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="main listener; 0 picks a free port")
    parser.add_argument("--mtls-port", type=int, default=0, help="mTLS listener; 0 picks a free port")
    parser.add_argument("--quiet", action="store_true", help="log tracebacks only")
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))

    record = SecretsRecord(os.environ.get("GATEHOUSE_SECRETS_RECORD"))
    state = State(config, record)
    for client in state.clients.values():
        record.add("upstream client secret", client.secret)
    oauth = make_server(state)
    main_context, mtls_context = contexts(config)
    main_server = TLSServer((args.host, args.port), main_context, "main", state, oauth, args.quiet)
    mtls_server = TLSServer((args.host, args.mtls_port), mtls_context, "mtls", state, oauth, args.quiet)
    host = f"[{args.host}]" if ":" in args.host else args.host
    state.issuer = f"https://{host}:{main_server.server_address[1]}"
    state.mtls_url = f"https://{host}:{mtls_server.server_address[1]}"
    threading.Thread(target=mtls_server.serve_forever, daemon=True).start()
    print(json.dumps({"ready": True, "url": state.issuer, "mtls_url": state.mtls_url}), flush=True)
    sys.stdout = sys.stderr  # the ready line is the only stdout output
    try:
        main_server.serve_forever()
    finally:
        main_server.server_close()
        mtls_server.server_close()


if __name__ == "__main__":
    main()
