"""HTTP/1.1 over a raw socket, for tests of framing, request targets and headers that an
HTTP library would normalise, refuse or fix up on the way (raw bytes in the target, two
`Host` headers, header names with underscores, `Expect`, broken chunked framing).

    client = RawClient(port)
    client.send(request("GET", "/api/contracts/%ff?x=1", [("Authorization", "Bearer t")]))
    response = client.read_response()        # RawResponse, or None if the server closed first
    client.wait_closed(5)                    # True once the server has closed the connection

Every read has a deadline; nothing sleeps.
"""

import json
import socket
import time


def request(method, target, headers=(), body=b"", version="HTTP/1.1", host="gatehouse.test", length=True):
    """The bytes of one request. `target` may be str (sent as Latin-1, byte for byte) or bytes.
    `host=None` leaves out `Host`; `length=False` leaves out the automatic `Content-Length`
    (give your own framing headers then)."""
    target = target.encode("latin-1") if isinstance(target, str) else target
    lines = [method.encode() + b" " + target + b" " + version.encode()]
    if host is not None:
        lines.append(b"Host: " + host.encode())
    for name, value in headers:
        lines.append(_bytes(name) + b": " + _bytes(value))
    if length and (body or method in ("POST", "PUT", "PATCH")) and not any(
            _bytes(name).lower() in (b"content-length", b"transfer-encoding") for name, _ in headers):
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _bytes(value):
    return value.encode("latin-1") if isinstance(value, str) else value


class RawResponse:
    def __init__(self, version, status, reason, headers, body):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers  # [(name, value)] as received, in order
        self.body = body

    def header(self, name, default=None):
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), default)

    def header_values(self, name):
        name = name.lower()
        return [value for key, value in self.headers if key.lower() == name]

    @property
    def request_id(self):
        return self.header("X-Request-Id")

    def json(self):
        return json.loads(self.body)

    @property
    def closes(self):
        return "close" in (self.header("Connection") or "").lower()

    def __repr__(self):
        return f"<RawResponse {self.status} {self.reason} {self.body[:200]!r}>"


class RawClient:
    """One client connection on 127.0.0.1. Reads keep their leftovers, so pipelined answers
    that arrive together are all found."""

    def __init__(self, port, host="127.0.0.1", timeout=10.0, connect=True):
        self.address = (host, port)
        self.timeout = timeout
        self.buffer = b""
        self.eof = False
        self.sock = None
        if connect:
            self.connect()

    def connect(self):
        self.sock = socket.create_connection(self.address, timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.eof = False
        return self

    def send(self, data):
        self.sock.sendall(data)

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ reading

    def _fill(self, deadline):
        """Reads more bytes into the buffer; False at EOF (or reset). Raises TimeoutError."""
        if self.eof:
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no answer before the deadline")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no answer before the deadline") from None
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    def _read_until(self, marker, deadline):
        while marker not in self.buffer:
            if not self._fill(deadline):
                return None
        index = self.buffer.index(marker) + len(marker)
        data, self.buffer = self.buffer[:index], self.buffer[index:]
        return data

    def _read_exactly(self, size, deadline):
        while len(self.buffer) < size:
            if not self._fill(deadline):
                raise EOFError(f"connection closed {size - len(self.buffer)} bytes short of the body")
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def read_response(self, head_request=False, timeout=None, interim=False):
        """The next response. 1xx answers are skipped unless `interim` (then returned).
        None when the server closed the connection before sending anything."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            head = self._read_until(b"\r\n\r\n", deadline)
            if head is None:
                if self.buffer:
                    raise EOFError(f"connection closed inside a response head: {self.buffer[:200]!r}")
                return None
            lines = head[:-4].split(b"\r\n")
            version, status, reason = (lines[0].decode("latin-1").split(" ", 2) + [""])[:3]
            headers = []
            for line in lines[1:]:
                name, _, value = line.decode("latin-1").partition(":")
                headers.append((name, value.strip()))
            status = int(status)
            response = RawResponse(version, status, reason, headers, b"")
            if 100 <= status < 200:
                if interim:
                    return response
                continue
            if head_request or status in (204, 304):
                return response
            encoding = (response.header("Transfer-Encoding") or "").lower()
            if "chunked" in encoding:
                response.body = self._read_chunked(deadline)
            elif response.header("Content-Length") is not None:
                response.body = self._read_exactly(int(response.header("Content-Length")), deadline)
            else:  # delimited by the end of the connection
                while self._fill(deadline):
                    pass
                response.body, self.buffer = self.buffer, b""
            return response

    def _read_chunked(self, deadline):
        body = b""
        while True:
            line = self._read_until(b"\r\n", deadline)
            if line is None:
                raise EOFError("connection closed inside a chunked body")
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while self._read_until(b"\r\n", deadline) not in (b"\r\n", None):  # trailer fields
                    pass
                return body
            body += self._read_exactly(size, deadline)
            self._read_exactly(2, deadline)

    def wait_closed(self, timeout):
        """True if the server closes the connection within `timeout` seconds (whatever it
        sends before closing is kept in the buffer); False if it is still open then."""
        deadline = time.monotonic() + timeout
        try:
            while self._fill(deadline):
                pass
        except TimeoutError:
            return False
        return True

    def exchange(self, data, head_request=False, timeout=None):
        self.send(data)
        return self.read_response(head_request=head_request, timeout=timeout)
