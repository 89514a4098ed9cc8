"""A small OpenAI-compatible completions server for `cloudgpu-agent bench`'s tests: it streams
exactly ``max_tokens`` tokens over SSE after ``ttft_s``, ``itl_s`` apart, and records what it
was asked (prompt words, max_tokens, the API key, the most requests in flight at once)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_TOKENS = 4096  # bounded: a test's typo must not stream for ever


@dataclass
class Seen:
    prompts_words: list[int] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # the Host header of each request
    access: list[str] = field(default_factory=list)  # X-CloudGPU-Access (the edge's token)
    in_flight: int = 0
    peak_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class OpenAiServer:
    url: str
    seen: Seen


@contextmanager
def openai_server(
    *, ttft_s: float, itl_s: float, api_key: str = "", model: str = "tiny"
) -> Iterator[OpenAiServer]:
    seen = Seen()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            authorization = self.headers.get("Authorization", "")
            with seen.lock:
                seen.authorizations.append(authorization)
                seen.hosts.append(self.headers.get("Host", ""))
                seen.access.append(self.headers.get("X-CloudGPU-Access", ""))
            if self.path != "/v1/completions" or (api_key and authorization != f"Bearer {api_key}"):
                self._plain(401 if self.path == "/v1/completions" else 404, b"no\n")
                return
            tokens = min(int(body["max_tokens"]), MAX_TOKENS)
            with seen.lock:
                seen.prompts_words.append(len(body["prompt"].split()))
                seen.max_tokens.append(int(body["max_tokens"]))
                seen.in_flight += 1
                seen.peak_in_flight = max(seen.peak_in_flight, seen.in_flight)
            counted = True
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                time.sleep(ttft_s)  # the server's instructions, which the figures must show
                for n in range(tokens):
                    if n:
                        time.sleep(itl_s)
                    self._event({"model": model, "choices": [{"index": 0, "text": f" t{n}"}]})
                self._event({"model": model, "choices": [], "usage": {"completion_tokens": tokens}})
                # Out of the count before the client can see the end: once it has read [DONE]
                # it may send its next request before this thread ran another line.
                with seen.lock:
                    seen.in_flight -= 1
                counted = False
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            finally:
                if counted:
                    with seen.lock:
                        seen.in_flight -= 1
            self.close_connection = True

        def _event(self, data: object) -> None:
            self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        def _plain(self, status: int, text: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield OpenAiServer(f"http://127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
