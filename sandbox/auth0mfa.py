"""An Auth0 double for the end-to-end suite: the Authentication API's Resource Owner Password
flow with multi-factor authentication by one-time password, as Auth0 documents it. Built from
Auth0's public documentation and the error pairs Auth0's own SDKs recognise, never from
Gatehouse's code:

- "Authenticate Using the Resource Owner Password Flow with MFA"
  (auth0.com/docs/secure/multi-factor-authentication/authenticate-using-ropg-flow-with-mfa):
  the password grant answers `mfa_required` with an `mfa_token` (valid 10 minutes); an OTP
  code is single use.
- "Enroll and Challenge OTP Authenticators" (…/authenticate-using-ropg-flow-with-mfa/
  enroll-and-challenge-otp-authenticators): `POST /mfa/challenge` with `challenge_type=otp`
  (optional for OTP), then `POST /oauth/token` with
  `grant_type=http://auth0.com/oauth/grant-type/mfa-otp`, `mfa_token` and `otp`; the answer is
  the password grant's. The OTP is TOTP (`otpauth://totp/…?algorithm=SHA1&digits=6&period=30`).
- Authentication API reference (auth0.com/docs/api/authentication): Resource Owner Password
  (`grant_type=password`, or `http://auth0.com/oauth/grant-type/password-realm` with `realm`),
  Challenge Request, Verify with OTP, Refresh Token, User Profile (`GET /userinfo`). A refresh
  token is issued only for the scope `offline_access`; an ID token only for `openid`.
- The error pairs of Auth0.swift's and Auth0.Android's AuthenticationError
  (`isInvalidCredentials`: invalid_grant "Wrong email or password."; `isMultifactorRequired`:
  mfa_required; `isMultifactorCodeInvalid`: invalid_grant "Invalid otp_code.";
  `isMultifactorTokenInvalid`: expired_token "mfa_token is expired" or invalid_grant
  "Malformed mfa_token"). Auth0 answers these with 403; a client whose credentials are wrong
  gets 401 access_denied "Unauthorized" (as Auth0's /oauth/token does).
- Refusals of the account itself, from Auth0's error tables for the password grant (auth0/docs
  `articles/api/authentication/errors/_oauth-ro.md`, `_co_authenticate_errors.md`) and the
  error predicates of Auth0.swift (`isTooManyAttempts`, `isPasswordLeaked`, `isRuleError`,
  `isAccessDenied`): a user an administrator blocked gets 401 `unauthorized` "user is blocked"; a
  breached password 401 `password_leaked`; a denying Action (`api.access.deny(reason)`) 403
  `access_denied` with its reason; each only once the password was right (Auth0 checks the
  credentials first). Brute-force protection: after `brute_force_threshold` (Auth0: 10)
  consecutive failed logins of one user from one address (the `auth0-forwarded-for` address when
  sent), that user from that address gets 429 `too_many_attempts` "Your account has been blocked
  after multiple consecutive login attempts. …", whatever the password.
- Rate limits (auth0.com/docs/troubleshoot/customer-support/operational-policies/rate-limit-policy):
  429 with `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (epoch seconds);
  double: `Retry-After` too, so a client may read either.

Shapes, all `application/json`:

    POST /oauth/token  grant_type=password, username, password, client_id, client_secret (or
                       HTTP Basic), scope, audience?          (form or JSON body)
        200 {"access_token", "token_type": "Bearer", "expires_in", "scope", "id_token"?, "refresh_token"?}
        403 {"error": "mfa_required", "error_description": "Multifactor authentication required",
             "mfa_token": "…"}                                 (a user enrolled in MFA)
        403 {"error": "invalid_grant", "error_description": "Wrong email or password."}
    POST /mfa/challenge  client_id, client_secret, mfa_token, challenge_type=otp, authenticator_id?
        200 {"challenge_type": "otp"}
    POST /oauth/token  grant_type=http://auth0.com/oauth/grant-type/mfa-otp, mfa_token, otp, client credentials
        200 the tokens;  403 {"error": "invalid_grant", "error_description": "Invalid otp_code."}
        403 {"error": "expired_token", "error_description": "mfa_token is expired"}
        403 {"error": "invalid_grant", "error_description": "Malformed mfa_token"}  (unknown or used)
    POST /oauth/token  grant_type=refresh_token, refresh_token, client credentials → 200 a new access token
        (no rotation: Auth0's default), 403 invalid_grant "Unknown or invalid refresh token."
    GET  /userinfo     Authorization: Bearer <access token> → 200 {"sub", "email", "email_verified", "name"}; 401

Every request is checked for the client's credentials (401 access_denied "Unauthorized" when
missing or wrong; several mechanisms at once: 400 invalid_request) and RECORDED as it arrived on
the wire (`arrivals`: method, path, query, raw body, parsed fields, headers, which client
authentication it used), so a test asserts what Gatehouse really sent, not what it says it sent.

What a test can make it do (each for the next `times` requests to `path`, /oauth/token by default):
`fault("429", retry_after=N)`, `fault("stall")` (read, recorded, never answered: held until
`release()` or `hold` seconds, then the connection is closed without a word), `fault("garbage")`
(200 with a body that is not JSON), `fault("500")`. `stop()` closes the port (an upstream that is
down), `start()` opens the same port again.

    double = Auth0MFA(client_id="gatehouse-auth0", client_secret=…, seen=seen)
    user = double.add_user("carol@example.test", "a long password", mfa=True)
    double.code(user)          # the TOTP code an authenticator app shows now (RFC 6238)
    double.wrong_code(user)    # six digits no window around now accepts

Every secret it is given or gives out (client secret, passwords, TOTP secrets, mfa_tokens,
tokens) goes to `seen` (the suite's Secrets), for the secret scans.
"""

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, unquote_plus, urlsplit

import jwt  # PyJWT: the ID tokens (HS256 with the client secret, an algorithm Auth0 offers)

from .stubserver import StubHandler, StubServer

GRANT_PASSWORD = "password"
GRANT_PASSWORD_REALM = "http://auth0.com/oauth/grant-type/password-realm"
GRANT_MFA_OTP = "http://auth0.com/oauth/grant-type/mfa-otp"
GRANT_REFRESH = "refresh_token"
DEFAULT_REALM = "Username-Password-Authentication"

MFA_TOKEN_LIFETIME = 600  # "The default expiry time of … the https://{yourDomain}/mfa/* audience is 10 minutes"
TOTP_STEP, TOTP_DIGITS = 30, 6


# --------------------------------------------------------------------------- TOTP (RFC 6238, RFC 4226)

def new_totp_secret():
    """A base32 secret as Auth0's /mfa/associate gives one (20 random bytes, no padding)."""
    return base64.b32encode(secrets.token_bytes(20)).decode().rstrip("=")


def totp(secret, at=None, step=TOTP_STEP, digits=TOTP_DIGITS):
    """The TOTP code of base32 `secret` at Unix time `at` (now by default): HMAC-SHA-1 over the
    step counter, dynamic truncation (RFC 4226 §5.3), `digits` decimal digits."""
    key = base64.b32decode(secret.upper() + "=" * (-len(secret) % 8))
    counter = int((time.time() if at is None else at) // step)
    return hotp(key, counter, digits)


def hotp(key, counter, digits=TOTP_DIGITS):
    mac = hmac.new(key, counter.to_bytes(8, "big"), hashlib.sha1).digest()
    offset = mac[-1] & 0x0F
    number = int.from_bytes(mac[offset:offset + 4], "big") & 0x7FFFFFFF
    return f"{number % 10 ** digits:0{digits}d}"


# --------------------------------------------------------------------------- what arrived

@dataclass
class Arrival:
    """One request as it reached the double."""
    method: str
    target: str                      # the raw request target (path and query)
    path: str
    query: dict
    body: bytes
    fields: dict                     # the body's fields (form or JSON), name → str (last one wins)
    content_type: str
    headers: dict                    # name (lower case) → value
    client_auth: str = None          # "client_secret_basic", "client_secret_post", or None
    client_id: str = None
    client_authenticated: bool = False
    status: int = None               # what the double answered (None: held, dropped)
    answer: dict = None
    at: float = field(default_factory=time.monotonic)

    @property
    def grant_type(self):
        return self.fields.get("grant_type")

    def carries(self, value):
        """Whether `value` is anywhere in the request: the target (raw or decoded), the body (raw
        or decoded), or a header (HTTP Basic decoded)."""
        if not value:
            return False
        places = [self.target, unquote_plus(self.target), self.body.decode("utf-8", "replace"),
                  unquote_plus(self.body.decode("utf-8", "replace")), *self.fields.values(), *self.headers.values()]
        basic = self.headers.get("authorization", "")
        if basic.lower().startswith("basic "):
            try:
                places.append(unquote_plus(base64.b64decode(basic[6:].strip()).decode("utf-8", "replace")))
            except (binascii.Error, ValueError):
                pass
        return any(value in str(place) for place in places)


@dataclass
class User:
    username: str
    password: str
    email: str
    name: str
    user_id: str
    secret: str = None               # the TOTP secret; None: not enrolled in MFA
    blocked: bool = False            # blocked by an administrator (user.blocked)
    leaked: bool = False             # its password is in a breach Auth0 knows of
    deny: str = None                 # an Action denies it with this reason

    @property
    def mfa(self):
        return self.secret is not None


class Answer(Exception):
    def __init__(self, status, body, headers=()):
        super().__init__(body.get("error") if isinstance(body, dict) else status)
        self.status, self.body, self.headers = status, body, list(headers)


def error(status, code, description):
    return Answer(status, {"error": code, "error_description": description})


# --------------------------------------------------------------------------- the double

class Auth0MFA(StubServer):
    """The double: an Auth0 tenant with one confidential application (`client_id`,
    `client_secret`) whose grant types are password, password-realm, MFA and refresh token."""

    def __init__(self, client_id, client_secret, seen=None, access_token_lifetime=86400, port=0):
        self.client_id, self.client_secret = client_id, client_secret
        self.seen = seen
        self.access_token_lifetime = access_token_lifetime
        self.users = {}                  # username → User
        self.mfa_tokens = {}             # mfa_token → {"user", "scope", "audience", "expires_at", "used"}
        self.access_tokens = {}          # access token → User
        self.refresh_tokens = {}         # refresh token → {"user", "scope", "audience"}
        self.used_codes = set()          # (username, counter): "Once a user verifies an MFA OTP code, it cannot be used again"
        self.brute_force_threshold = 10  # Auth0's default for brute-force protection
        self.consecutive_failures = {}   # (username, address) → failed logins in a row
        self.arrivals = []
        self.faults = []                 # [{"kind", "path", "times", "retry_after"}]
        self.release_event = threading.Event()
        self.held = 0
        self._remember(client_secret, kind="Auth0 client secret")
        super().__init__(self._handler(), port=port)
        self.running = True

    # ----- set-up

    def add_user(self, username, password, mfa=False, email=None, name=None, blocked=False, leaked=False, deny=None):
        user = User(username=username, password=password, email=email or username, name=name or username.split("@")[0],
                    user_id="auth0|" + secrets.token_hex(12), secret=new_totp_secret() if mfa else None,
                    blocked=blocked, leaked=leaked, deny=deny)
        with self.condition:
            self.users[username] = user
        self._remember(password, kind="password typed in the app")
        self._remember(user.secret, kind="TOTP secret")
        return user

    def code(self, user, at=None):
        """The code the user's authenticator app shows at `at` (now)."""
        return totp(self._user(user).secret, at)

    def wrong_code(self, user):
        """Six digits that no step from two before now to two after accepts."""
        now = time.time()
        near = {totp(self._user(user).secret, now + offset * TOTP_STEP) for offset in range(-2, 3)}
        while True:
            candidate = f"{secrets.randbelow(10 ** TOTP_DIGITS):06d}"
            if candidate not in near:
                return candidate

    def _user(self, user):
        return user if isinstance(user, User) else self.users[user]

    # ----- faults and life

    def fault(self, kind, times=1, path="/oauth/token", retry_after=7, grant_type=None):
        """The next `times` requests to `path` (of `grant_type` only, when given) answer with
        `kind`: "429", "stall", "garbage" or "500". Recorded first, as every request."""
        assert kind in ("429", "stall", "garbage", "500"), kind
        with self.condition:
            self.faults.append({"kind": kind, "path": path, "times": times, "retry_after": retry_after,
                                "grant_type": grant_type})

    def clear_faults(self):
        with self.condition:
            self.faults.clear()

    def release(self):
        """Ends every held request (their connections close without an answer)."""
        with self.condition:
            event, self.release_event = self.release_event, threading.Event()
        event.set()

    def wait_held(self, count=1, timeout=30):
        self.wait_until(lambda: self.held >= count, timeout, f"{count} held request(s)")

    def stop(self):
        self.release()
        if self.running:
            super().stop()
            self.running = False

    def start(self):
        """Listens again on the same port (after `stop()`)."""
        if self.running:
            return
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.server.stub = self
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                       name=type(self).__name__, daemon=True)
        self.thread.start()
        self.running = True

    def expire_mfa_tokens(self):
        with self.condition:
            for entry in self.mfa_tokens.values():
                entry["expires_at"] = 0

    # ----- what arrived

    def mark(self):
        with self.condition:
            return len(self.arrivals)

    def since(self, mark=0, path=None, grant_type=None):
        """The arrivals from `mark` on (to `path`, of `grant_type`), oldest first."""
        with self.condition:
            found = self.arrivals[mark:]
        return [a for a in found if (path is None or a.path == path) and (grant_type is None or a.grant_type == grant_type)]

    def wait_until(self, predicate, timeout, what):
        with self.condition:
            if not self.condition.wait_for(predicate, timeout):
                raise AssertionError(f"the Auth0 double did not see {what} within {timeout} s")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    @url.setter
    def url(self, value):  # StubServer sets it; the double's URL is always its origin
        pass

    @property
    def token_endpoint(self):
        return self.url + "/oauth/token"

    @property
    def challenge_endpoint(self):
        return self.url + "/mfa/challenge"

    @property
    def userinfo_endpoint(self):
        return self.url + "/userinfo"

    # ----- the protocol

    def _remember(self, *values, kind):
        if self.seen is not None:
            self.seen.add(*values, kind=kind)

    def _take_fault(self, arrival):
        with self.condition:
            for fault in self.faults:
                if fault["path"] == arrival.path and (fault["grant_type"] is None or fault["grant_type"] == arrival.grant_type):
                    fault["times"] -= 1
                    if fault["times"] <= 0:
                        self.faults.remove(fault)
                    return dict(fault)
        return None

    def _authenticate_client(self, arrival):
        """Auth0's client authentication: client_secret_post or client_secret_basic, one of them."""
        header = arrival.headers.get("authorization", "")
        posted_id, posted_secret = arrival.fields.get("client_id"), arrival.fields.get("client_secret")
        if header.lower().startswith("basic "):
            if posted_secret is not None:
                raise error(400, "invalid_request", "Only one client authentication method may be used.")
            try:
                decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
                client_id, _, client_secret = decoded.partition(":")
                client_id, client_secret = unquote_plus(client_id), unquote_plus(client_secret)  # RFC 6749 §2.3.1
            except (binascii.Error, ValueError):
                raise error(401, "access_denied", "Unauthorized") from None
            if posted_id is not None and posted_id != client_id:
                raise error(400, "invalid_request", "client_id mismatch")
            arrival.client_auth = "client_secret_basic"
        elif posted_secret is not None:
            client_id, client_secret = posted_id, posted_secret
            arrival.client_auth = "client_secret_post"
        else:
            raise error(401, "access_denied", "Unauthorized")
        arrival.client_id = client_id
        good = client_id == self.client_id and hmac.compare_digest(client_secret.encode(), self.client_secret.encode())
        if not good:
            raise error(401, "access_denied", "Unauthorized")
        arrival.client_authenticated = True

    def _tokens(self, user, scope, audience):
        granted = scope or "openid"
        access_token = secrets.token_urlsafe(32)
        body = {"access_token": access_token, "token_type": "Bearer", "expires_in": self.access_token_lifetime,
                "scope": granted}
        scopes = granted.split()
        if "openid" in scopes:
            now = int(time.time())
            body["id_token"] = jwt.encode({"iss": self.url + "/", "sub": user.user_id, "aud": self.client_id, "iat": now,
                                           "exp": now + 36000, "email": user.email, "name": user.name},
                                          self.client_secret, algorithm="HS256")
        if "offline_access" in scopes:
            body["refresh_token"] = secrets.token_urlsafe(32)
            self.refresh_tokens[body["refresh_token"]] = {"user": user, "scope": granted, "audience": audience}
        self.access_tokens[access_token] = user
        self._remember(body["access_token"], body.get("refresh_token"), body.get("id_token"), kind="Auth0 token")
        return 200, body

    def _token(self, arrival):
        self._authenticate_client(arrival)
        fields = arrival.fields
        grant = fields.get("grant_type")
        if grant in (GRANT_PASSWORD, GRANT_PASSWORD_REALM):
            for name in ("username", "password") + (("realm",) if grant == GRANT_PASSWORD_REALM else ()):
                if not fields.get(name):
                    raise error(400, "invalid_request", f"Missing required parameter: {name}")
            if grant == GRANT_PASSWORD_REALM and fields["realm"] != DEFAULT_REALM:
                raise error(400, "invalid_request", "connection not found")
            user = self.users.get(fields["username"])
            address = arrival.headers.get("auth0-forwarded-for") or "gatehouse"
            failures = self.consecutive_failures.get((fields["username"], address), 0)
            if user is not None and failures >= self.brute_force_threshold:
                raise error(429, "too_many_attempts", "Your account has been blocked after multiple consecutive login attempts. "
                            "We've sent you an email with instructions on how to unblock it.")
            if user is None or not hmac.compare_digest(user.password.encode(), fields["password"].encode()):
                self.consecutive_failures[(fields["username"], address)] = failures + 1
                raise error(403, "invalid_grant", "Wrong email or password.")
            self.consecutive_failures.pop((fields["username"], address), None)
            if user.blocked:
                raise error(401, "unauthorized", "user is blocked")
            if user.leaked:
                raise error(401, "password_leaked", "This login attempt has been blocked because the password you're using was "
                            "previously disclosed through a data breach (not in this application).")
            if user.deny is not None:
                raise error(403, "access_denied", user.deny)
            if user.mfa:
                mfa_token = secrets.token_urlsafe(48)
                self.mfa_tokens[mfa_token] = {"user": user, "scope": fields.get("scope"), "audience": fields.get("audience"),
                                              "expires_at": time.time() + MFA_TOKEN_LIFETIME, "used": False}
                self._remember(mfa_token, kind="Auth0 mfa_token")
                raise Answer(403, {"error": "mfa_required", "error_description": "Multifactor authentication required",
                                   "mfa_token": mfa_token})
            return self._tokens(user, fields.get("scope"), fields.get("audience"))
        if grant == GRANT_MFA_OTP:
            for name in ("mfa_token", "otp"):
                if not fields.get(name):
                    raise error(400, "invalid_request", f"Missing required parameter: {name}")
            entry = self._mfa_entry(fields["mfa_token"])
            user = entry["user"]
            counter = self._accepted_counter(user, fields["otp"])
            if counter is None:
                raise error(403, "invalid_grant", "Invalid otp_code.")
            self.used_codes.add((user.username, counter))
            self._remember(fields["otp"], kind="TOTP code accepted by Auth0")
            entry["used"] = True
            return self._tokens(user, entry["scope"], entry["audience"])
        if grant == GRANT_REFRESH:
            found = self.refresh_tokens.get(fields.get("refresh_token") or "")
            if found is None:
                raise error(403, "invalid_grant", "Unknown or invalid refresh token.")
            status, body = self._tokens(found["user"], found["scope"], found["audience"])
            self.refresh_tokens.pop(body.pop("refresh_token", None), None)  # Auth0 does not rotate by default
            return status, body
        if grant is None:
            raise error(400, "invalid_request", "Missing required parameter: grant_type")
        raise error(403, "unauthorized_client", f"Grant type '{grant}' not allowed for the client.")

    def _mfa_entry(self, mfa_token):
        entry = self.mfa_tokens.get(mfa_token)
        if entry is None or entry["used"]:
            raise error(403, "invalid_grant", "Malformed mfa_token")
        if entry["expires_at"] < time.time():
            raise error(403, "expired_token", "mfa_token is expired")
        return entry

    def _accepted_counter(self, user, code):
        """The step counter `code` is right for, within one step of now, never one used before."""
        if not (len(code) == TOTP_DIGITS and code.isdigit()):
            return None
        key = base64.b32decode(user.secret + "=" * (-len(user.secret) % 8))
        now = int(time.time() // TOTP_STEP)
        for counter in (now - 1, now, now + 1):
            if hmac.compare_digest(hotp(key, counter), code) and (user.username, counter) not in self.used_codes:
                return counter
        return None

    def _challenge(self, arrival):
        self._authenticate_client(arrival)
        fields = arrival.fields
        for name in ("mfa_token", "challenge_type"):
            if not fields.get(name):
                raise error(400, "invalid_request", f"Missing required parameter: {name}")
        entry = self._mfa_entry(fields["mfa_token"])
        if fields["challenge_type"] != "otp" or not entry["user"].mfa:
            raise error(400, "unsupported_challenge_type",
                        "User is not enrolled with an authenticator that supports the requested challenge type.")
        return 200, {"challenge_type": "otp"}

    def _userinfo(self, arrival):
        header = arrival.headers.get("authorization", "")
        user = self.access_tokens.get(header[7:].strip()) if header.lower().startswith("bearer ") else None
        if user is None:
            raise Answer(401, {"error": "invalid_token", "error_description": "Unauthorized"},
                         [("WWW-Authenticate", 'Bearer error="invalid_token"')])
        return 200, {"sub": user.user_id, "email": user.email, "email_verified": True, "name": user.name}

    def _dispatch(self, arrival):
        """(status, JSON body, headers) of one recorded request; the caller holds the lock."""
        route = {("POST", "/oauth/token"): self._token, ("POST", "/mfa/challenge"): self._challenge,
                 ("GET", "/userinfo"): self._userinfo}.get((arrival.method, arrival.path))
        if route is None:
            return 404, {"statusCode": 404, "error": "Not Found", "message": "Not Found"}, []
        try:
            status, body = route(arrival)
            return status, body, []
        except Answer as answer:
            return answer.status, answer.body, answer.headers

    def _handler(self):
        double = self

        class Handler(StubHandler):
            def do_GET(self):
                self.serve(b"")

            def do_POST(self):
                self.serve(self.read_body())

            def serve(self, body):
                arrival = double._arrival(self, body)
                fault = double._take_fault(arrival)
                if fault is not None and fault["kind"] == "stall":
                    with double.condition:
                        double.held += 1
                        event = double.release_event
                        double.condition.notify_all()
                    event.wait(60)
                    self.close_connection = True
                    return
                if fault is not None:
                    with double.condition:
                        if fault["kind"] == "429":
                            reset = int(time.time()) + fault["retry_after"]
                            arrival.status, arrival.answer = 429, {"error": "too_many_requests",
                                                                   "error_description": "Global limit has been reached"}
                            headers = [("Retry-After", str(fault["retry_after"])), ("x-ratelimit-limit", "30"),
                                       ("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", str(reset))]
                        elif fault["kind"] == "500":
                            arrival.status, arrival.answer, headers = 500, {"error": "server_error",
                                                                            "error_description": "Internal Server Error"}, []
                        else:
                            arrival.status, headers = 200, []
                        double.condition.notify_all()
                    if fault["kind"] == "garbage":
                        return self.reply(200, b"<html><body>Auth0 is down for maintenance</body></html>", "text/html")
                    return self.reply(arrival.status, json.dumps(arrival.answer).encode(), headers=headers)
                with double.condition:
                    status, answer, headers = double._dispatch(arrival)
                    arrival.status, arrival.answer = status, answer
                    double.condition.notify_all()
                self.reply(status, json.dumps(answer).encode(), headers=[("Cache-Control", "no-store"), *headers])

        return Handler

    def _arrival(self, handler, body):
        arrival = read_arrival(handler, body)
        with self.condition:
            self.arrivals.append(arrival)
            self.condition.notify_all()
        return arrival


def read_arrival(handler, body):
    """The Arrival of the request `handler` (an http.server handler) is serving, whose body was `body`."""
    target = handler.path
    split = urlsplit(target)
    content_type = handler.headers.get("Content-Type", "")
    if content_type.split(";")[0].strip().lower() == "application/json":
        try:
            parsed = json.loads(body or b"{}")
        except ValueError:
            parsed = None
        fields = {str(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}
    else:
        fields = {name: values[-1] for name, values in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
    return Arrival(method=handler.command, target=target, path=split.path,
                   query={k: v[-1] for k, v in parse_qs(split.query).items()}, body=body, fields=fields,
                   content_type=content_type, headers={name.lower(): value for name, value in handler.headers.items()})
