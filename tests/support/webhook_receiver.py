"""A real HTTP server on loopback that receives webhooks the way a renter's would, and says
what it got. Its paths behave as named:

- ``/ok``: 200.
- ``/fail-N``: 500 the first N times, then 200.
- ``/always-500``: 500.
- ``/hang``: holds the request until ``release()`` (or 60 s), then 200.
- ``/redirect-to/PATH``: 302 to ``/PATH`` (a receiver that moved, or one steering the hub).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    port: int
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: threading.Event = field(default_factory=threading.Event)
    hanging: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str, kind: str | None = None) -> list[Received]:
        """What ``path`` received (of event type ``kind`` only, if given)."""
        with self.lock:
            return [
                r
                for r in self.received
                if r.path == path and kind in (None, r.headers.get("cloudgpu-event-type"))
            ]

    def release(self) -> None:
        self.released.set()


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    counts: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            path = self.path
            with receiver.lock:
                receiver.received.append(
                    Received(
                        path, {k.lower(): v for k, v in self.headers.items()}, body, time.time()
                    )
                )
                counts[path] = counts.get(path, 0) + 1
                seen = counts[path]
            status, location = 200, None
            if path.startswith("/redirect-to/"):
                status, location = 302, "/" + path.removeprefix("/redirect-to/")
            elif path.startswith("/fail-"):
                status = 500 if seen <= int(path.removeprefix("/fail-")) else 200
            elif path == "/always-500":
                status = 500
            elif path == "/hang":
                with receiver.lock:
                    receiver.hanging += 1
                receiver.released.wait(60)
                with receiver.lock:
                    receiver.hanging -= 1
            try:
                self.send_response(status)
                if location is not None:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            except OSError:
                pass  # the hub gave up on this request already

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # the hub hung up on a request it gave up on: expected, not news

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver = Receiver(port=server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.release()
        server.shutdown()
        server.server_close()
