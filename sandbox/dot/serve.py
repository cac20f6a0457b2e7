"""Local upstream authorization server for Gatehouse tests and demos.

A real OAuth 2.0 / OpenID Connect server built from django-oauth-toolkit
(DOT). Every start gets a fresh SQLite database in a temporary directory,
seeded from a JSON config. Run it with the repo's venv (scripts/python-env):

    .venv/bin/python sandbox/dot/serve.py --config cfg.json [--port 0] [--host 127.0.0.1] [--quiet]

Once listening it prints exactly one line to stdout and nothing after it:

    {"ready": true, "url": "http://127.0.0.1:PORT"}

Access log and errors go to stderr (--quiet: only 5xx errors and tracebacks;
drain or redirect stderr, a full pipe blocks the server). SIGTERM/SIGINT
exit with status 0.

Config (every key except "users" and "applications" is optional; defaults in
parentheses):

    {"users": [{"username": "alice", "password": "wonderland-42",
                "email": "alice@example.test", "first_name": "Alice", "last_name": ""}],
     "applications": [{
        "client_id": "gatehouse-legacy",
        "client_secret_env": "UPSTREAM_SECRET_LEGACY",  # env var holding the secret;
                                                        # required unless client_type is public
        "redirect_uris": ["http://127.0.0.1:8080/oauth/callback", "com.example.app:/oauth2redirect"],
        "client_type": "confidential",       # or "public" (confidential)
        "grant_type": "authorization-code",  # or "client-credentials" (authorization-code)
        "pkce_required": false,              # per client (true)
        "skip_authorization": true,          # false shows DOT's consent page (true)
        "algorithm": "",                     # "" plain OAuth; "RS256"/"HS256" OIDC ("");
                                             # HS256: secret stored unhashed, 32+ bytes
        "introspection": false}],            # may be granted scope "introspection" (false)
     "access_token_expire_seconds": 3600, "refresh_token_expire_seconds": 86400,
     "rotate_refresh_token": true, "refresh_token_grace_period_seconds": 0,
     "refresh_token_reuse_protection": false,  # reusing a rotated refresh token revokes its family
     "allowed_redirect_uri_schemes": ["http", "https", "com.example.app"]}

Endpoints (DOT's default urls mounted at /o/):

    GET  /accounts/login/                     login form (csrfmiddlewaretoken, username, password, next)
    POST /accounts/logout/                    end the upstream browser session
    GET  /o/authorize/                        authorization endpoint
    POST /o/token/                            token endpoint (client_secret_basic or client_secret_post)
    POST /o/revoke_token/                     RFC 7009 revocation
    POST /o/introspect/                       RFC 7662 introspection (see below)
    GET  /o/userinfo/                         OIDC userinfo (Bearer token with scope openid)
    GET  /o/.well-known/openid-configuration  OIDC discovery (issuer http://HOST:PORT/o)
    GET  /o/.well-known/jwks.json             JWKS (RSA key generated at every start)
    GET  /o/.well-known/oauth-authorization-server  RFC 8414 metadata
    (DOT's device-flow and application-management views are mounted too, unused.)

Scopes: read, write (default when "scope" is omitted: "read write"), openid,
profile, email, introspection.

Introspection: DOT lets ANY confidential application that authenticates with
its own client_id/secret (HTTP Basic, or client_id + client_secret form fields)
introspect any token; no flag needed. Alternatively a Bearer access token with
scope "introspection" works; only applications with "introspection": true may
obtain that scope (typically "grant_type": "client-credentials").

Not for production: secrets are hashed with Django's fast MD5 test hasher.

Secrets record: when the environment variable GATEHOUSE_SECRETS_RECORD names a file, the
server appends to it one JSON line {"kind": …, "value": …} for every secret it is given or
gives out: each application's client secret; the state (and nonce) of every authorization
request and the code of every authorization response; every code, code_verifier,
refresh_token, token and client_secret POSTed to /o/token/, /o/revoke_token/ and
/o/introspect/ (and the secret of HTTP Basic client authentication); every access, refresh
and ID token /o/token/ answers. Gatehouse's end-to-end suite searches its logs and databases
for all of them, including those no test sees (what Gatehouse exchanged with this server).
Several processes may share one record: each line is one O_APPEND write.
"""

import argparse
import base64
import binascii
import io
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, unquote_plus, urlsplit

import django

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the sandbox package
from sandbox.secretsrecord import SecretsRecord  # noqa: E402  (shared with sandbox/franceconnect/)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings
from django.core.management import call_command
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application

HERE = Path(__file__).resolve().parent


class Server(ThreadedWSGIServer):  # one thread per request
    request_queue_size = 128  # listen backlog for bursts of 50+ connections


def configure_django(config, db_path, host, quiet):
    pkce_clients = {a["client_id"] for a in config["applications"] if a.get("pkce_required", True)}
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    settings.configure(
        DEBUG=False,
        SECRET_KEY=os.urandom(32).hex(),
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "[::1]", host],
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "oauth2_provider",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
        ROOT_URLCONF="authserver",
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "DIRS": [HERE / "templates"],
                "APP_DIRS": True,  # DOT's consent page
                "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
            }
        ],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": db_path,
                # Many threads write concurrently: queue on the lock instead of failing.
                "OPTIONS": {
                    "timeout": 30,
                    "transaction_mode": "IMMEDIATE",
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                },
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        USE_TZ=True,
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        LOGIN_URL="/accounts/login/",
        # Cookies ignore ports: keep clear of the names Gatehouse may use on 127.0.0.1.
        SESSION_COOKIE_NAME="upstream_sessionid",
        CSRF_COOKIE_NAME="upstream_csrftoken",
        LOGGING={
            "version": 1,
            "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
            "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
            "root": {"handlers": ["stderr"], "level": "WARNING"},
            "loggers": {  # django.server: access log; django.request: 4xx warnings, 5xx tracebacks
                "django.server": {"handlers": ["stderr"], "level": "ERROR" if quiet else "INFO", "propagate": False},
                "django.request": {"handlers": ["stderr"], "level": "ERROR" if quiet else "WARNING", "propagate": False},
            },
        },
        UPSTREAM_INTROSPECTION_CLIENTS={
            a["client_id"] for a in config["applications"] if a.get("introspection", False)
        },
        OAUTH2_PROVIDER={
            "OAUTH2_VALIDATOR_CLASS": "authserver.Validator",
            "SCOPES": {
                "read": "Read",
                "write": "Write",
                "openid": "OpenID Connect",
                "profile": "Profile",
                "email": "Email",
                "introspection": "Token introspection",
            },
            "DEFAULT_SCOPES": ["read", "write"],
            "PKCE_REQUIRED": lambda client_id: client_id in pkce_clients,
            "ACCESS_TOKEN_EXPIRE_SECONDS": config.get("access_token_expire_seconds", 3600),
            "REFRESH_TOKEN_EXPIRE_SECONDS": config.get("refresh_token_expire_seconds", 86400),
            "ROTATE_REFRESH_TOKEN": config.get("rotate_refresh_token", True),
            "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": config.get("refresh_token_grace_period_seconds", 0),
            "REFRESH_TOKEN_REUSE_PROTECTION": config.get("refresh_token_reuse_protection", False),
            "ALLOWED_REDIRECT_URI_SCHEMES": config.get("allowed_redirect_uri_schemes", ["http", "https"]),
            "OIDC_ENABLED": True,
            "OIDC_RSA_PRIVATE_KEY": rsa_key.decode(),
        },
    )
    django.setup()


#: Form fields of the token, revocation and introspection endpoints, by the kind of secret they carry.
FORM_FIELDS = {"code": "upstream authorization code", "code_verifier": "PKCE verifier toward the upstream",
               "refresh_token": "refresh token presented to the upstream",
               "token": "token presented to the upstream (revoked or introspected)",
               "client_secret": "upstream client secret"}
RECORDED_POSTS = ("/o/token/", "/o/revoke_token/", "/o/introspect/")


class RecordingApp:
    """WSGI middleware that gives every secret passing through to a SecretsRecord."""

    def __init__(self, app, record):
        self.app = app
        self.record = record

    def __call__(self, environ, start_response):
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if method == "POST" and path in RECORDED_POSTS:
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            form = parse_qs(body.decode("utf-8", "replace"))
            for name, kind in FORM_FIELDS.items():
                self.record.add(kind, *form.get(name, []))
            self.record_authorization(environ.get("HTTP_AUTHORIZATION", ""))
        if method == "GET" and path == "/o/authorize/":
            parameters = parse_qs(environ.get("QUERY_STRING", ""))
            self.record.add("Gatehouse state toward the upstream", *parameters.get("state", []))
            self.record.add("OpenID nonce", *parameters.get("nonce", []))
        answer = {}

        def capture(status, headers, exc_info=None):
            answer["headers"] = headers
            return start_response(status, headers, exc_info)

        result = self.app(environ, capture)
        for name, value in answer.get("headers", []):
            if name.lower() == "location":
                self.record.add("upstream authorization code", *parse_qs(urlsplit(value).query).get("code", []))
        if method == "POST" and path == "/o/token/":
            try:
                content = b"".join(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
            try:
                tokens = json.loads(content)
            except ValueError:
                tokens = None
            if isinstance(tokens, dict):
                self.record.add("upstream access token", tokens.get("access_token"))
                self.record.add("upstream refresh token", tokens.get("refresh_token"))
                self.record.add("upstream ID token", tokens.get("id_token"))
            return [content]
        return result

    def record_authorization(self, header):
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8", "replace")
            except (binascii.Error, ValueError):
                return
            _, _, secret = decoded.partition(":")
            self.record.add("upstream client secret", unquote_plus(secret), secret)  # RFC 6749 §2.3.1 form-encodes it
        elif scheme.lower() == "bearer":
            self.record.add("upstream access token", credentials.strip())


def seed(config, record):
    from django.contrib.auth.models import User
    from oauth2_provider.models import Application

    for u in config["users"]:
        User.objects.create_user(
            u["username"], u.get("email", ""), u["password"],
            first_name=u.get("first_name", ""), last_name=u.get("last_name", ""),
        )
    for a in config["applications"]:
        app = Application(
            name=a["client_id"],
            client_id=a["client_id"],
            client_type=a.get("client_type", "confidential"),
            authorization_grant_type=a.get("grant_type", "authorization-code"),
            redirect_uris=" ".join(a.get("redirect_uris", [])),
            skip_authorization=a.get("skip_authorization", True),
            algorithm=a.get("algorithm", ""),
            # HS256 ID tokens are signed with the client secret, so it can't be hashed.
            hash_client_secret=a.get("algorithm") != "HS256",
        )
        if app.client_type == "confidential":  # public clients keep DOT's random, unusable secret
            secret = os.environ.get(a.get("client_secret_env", ""))
            if not secret:
                sys.exit(f"serve.py: {a['client_id']}: set client_secret_env to a non-empty environment variable")
            if app.algorithm == "HS256" and len(secret.encode()) < 32:
                sys.exit(f"serve.py: {a['client_id']}: HS256 needs a client secret of 32+ bytes")
            app.client_secret = secret
            record.add("upstream client secret", secret)
        app.full_clean()
        app.save()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--quiet", action="store_true", help="log server errors (5xx) only")
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    # Exit via SystemExit so the temporary directory is removed. Explicit for SIGINT
    # too: background jobs may inherit it as ignored.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))

    with tempfile.TemporaryDirectory(prefix="gatehouse-upstream-") as tmp:
        configure_django(config, os.path.join(tmp, "db.sqlite3"), args.host, args.quiet)
        call_command("migrate", verbosity=0, interactive=False)
        record = SecretsRecord(os.environ.get("GATEHOUSE_SECRETS_RECORD"))
        seed(config, record)

        httpd = Server((args.host, args.port), WSGIRequestHandler, ipv6=":" in args.host)
        application = get_wsgi_application()
        httpd.set_app(RecordingApp(application, record) if record.fd is not None else application)
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(json.dumps({"ready": True, "url": f"http://{host}:{httpd.server_address[1]}"}), flush=True)
        sys.stdout = sys.stderr  # the ready line is the only stdout output

        try:
            httpd.serve_forever()
        finally:
            httpd.server_close()


if __name__ == "__main__":
    main()
