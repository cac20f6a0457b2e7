"""The small in-process HTTP servers of the tests and demos (a proxy that counts, an app's loopback
redirect, a receiver of traces, an upstream that answers garbage): what they all repeat, once.

    class Handler(StubHandler):                  # a BaseHTTPRequestHandler with no access log
        def do_POST(self):
            body = self.read_body()              # the body, by Content-Length
            self.stub.record(body)               # kept in stub.received, waiters woken
            self.reply(200, b'{"ok": true}')     # Content-Type (application/json unless given),
                                                 # Content-Length, any extra headers, the body
    with StubServer(Handler, path="/token") as stub:   # or a subclass with a Handler of its own
        stub.url                                 http://127.0.0.1:PORT/token (stub.port)
        stub.wait_received(lambda received: len(received) == 2, 10, "two requests")

StubServer listens on 127.0.0.1 on a free port (ThreadingHTTPServer: a daemon thread per
connection) and serves in a daemon thread until `stop()` (or the end of its `with`). A double
with state of its own subclasses it, or gives its handler a closure over that state. The handler
keeps http.server's defaults (HTTP/1.0 unless it sets protocol_version, its Server header): what
goes on the wire is the handler's, the helper adds nothing to it.

sandbox/backends.py has its own plumbing (connections it can cut, a restart on the same
port, TLS, in-flight counters), and the provider look-alikes (sandbox/franceconnect, central,
dot, modern) are processes of their own: they do not use this.
"""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubHandler(BaseHTTPRequestHandler):
    """A request handler of a StubServer: silent, with the body read and the answer written for it."""

    def log_message(self, *args):
        pass

    @property
    def stub(self):
        """The StubServer this request arrived at."""
        return self.server.stub

    def read_body(self):
        """The request body: Content-Length bytes (none without the header)."""
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def reply(self, status, body, content_type="application/json", headers=()):
        """Answers `status` with `body` (bytes): Content-Type, Content-Length, then `headers`
        ((name, value) pairs), after the Server and Date headers http.server writes itself."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class StubServer:
    """`handler` (a StubHandler class; by default the subclass's own `Handler`) served on
    127.0.0.1:`port` (0: a free one) in a daemon thread; `url` is http://127.0.0.1:PORT then
    `path`. What the handler records (`record(…)`) is kept in `received`, under `condition`,
    which a subclass may use for its own state too."""

    Handler = None

    def __init__(self, handler=None, path="", port=0):
        self.condition = threading.Condition()
        self.received = []
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler or self.Handler)
        self.server.stub = self
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                       name=type(self).__name__, daemon=True)
        self.thread.start()

    def record(self, *items):
        """Appends `items` to `received` and wakes whoever waits for them."""
        with self.condition:
            self.received.extend(items)
            self.condition.notify_all()

    def wait_received(self, predicate, timeout, failure):
        """A copy of `received` once `predicate(copy)` holds (checked whenever `condition` is
        notified); after `timeout` seconds an AssertionError saying `failure` (a string, or a
        function of the copy that returns one)."""
        with self.condition:
            if not self.condition.wait_for(lambda: predicate(list(self.received)), timeout):
                raise AssertionError(failure(list(self.received)) if callable(failure) else failure)
            return list(self.received)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
