"""A real SMTP server for the suite: aiosmtpd on a loopback port, requiring STARTTLS (RFC 3207)
with a self-signed certificate, keeping every message it accepts in memory. `wait_for(to)` waits
(on a condition, never a sleep) for the next message to an address. With `credentials` (user,
password) it also requires AUTH (PLAIN or LOGIN, after STARTTLS) and counts the logins it
accepted (`logins`) and refused (`refused_logins`)."""

import email
import ssl
import threading

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

from .backends import self_signed_certificate
from .nativeapp import free_port


class SMTPSink:
    def __init__(self, workdir, name="smtp-sink", credentials=None):
        self.certificate, key = self_signed_certificate(workdir, name)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.certificate), str(key))
        self.condition = threading.Condition()
        self.messages = []  # (recipients, email.message.Message, whether the session was under TLS)
        self.port = free_port()
        self.credentials = credentials
        self.logins = 0
        self.refused_logins = 0
        options = {}
        if credentials:
            options = {"authenticator": self._authenticate, "auth_required": True, "auth_require_tls": True}
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port, tls_context=context, require_starttls=True,
                                     **options)
        self.controller.start()

    def _authenticate(self, server, session, envelope, mechanism, data):
        user, password = self.credentials
        good = getattr(data, "login", None) == user.encode() and getattr(data, "password", None) == password.encode()
        with self.condition:
            if good:
                self.logins += 1
            else:
                self.refused_logins += 1
        return AuthResult(success=good)

    async def handle_DATA(self, server, session, envelope):
        message = email.message_from_bytes(envelope.original_content or envelope.content)
        with self.condition:
            self.messages.append((list(envelope.rcpt_tos), message, session.ssl is not None))
            self.condition.notify_all()
        return "250 OK"

    def wait_for(self, to, after=0, timeout=30):
        """The first message to `to` among those accepted after the first `after`: (message, under_tls)."""
        with self.condition:
            def found():
                return next(((m, tls) for rcpts, m, tls in self.messages[after:] if to in rcpts), None)
            if not self.condition.wait_for(found, timeout):
                raise AssertionError(f"no message to {to} arrived within {timeout} s")
            return found()

    def count(self):
        with self.condition:
            return len(self.messages)

    def stop(self):
        self.controller.stop()
