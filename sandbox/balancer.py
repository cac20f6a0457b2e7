"""A load balancer as the simplest ones are: TCP, round robin by connection (HAProxy `mode tcp`
with `balance roundrobin`, a cloud network load balancer). Each connection a client opens goes to
the next backend in turn and stays there; a client that keeps its connection open keeps its
instance, one that opens a connection per request lands on each instance in turn (what a
per-request round robin does). Counts the connections each backend got. Standard library only."""

import itertools
import socket
import threading


class RoundRobinBalancer:
    def __init__(self, backends):
        """`backends`: (host, port) pairs."""
        self.backends = list(backends)
        self.connections = [0] * len(self.backends)
        self._turn = itertools.cycle(range(len(self.backends)))
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                index = next(self._turn)
                self.connections[index] += 1
            try:
                backend = socket.create_connection(self.backends[index], timeout=10)
            except OSError:
                client.close()
                continue
            for source, sink in ((client, backend), (backend, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self._closed = True
        self._listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
