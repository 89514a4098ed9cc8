"""A tiny real HTTP server on 127.0.0.1 answering what a test tells it to, and the CLI run as a
subprocess against it: the CLI's own code runs whole, only the hub is canned."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CLOUDGPU = str(Path(sys.executable).with_name("cloudgpu"))
TOKEN = "cgpr_canned_token_0123456789abcdefghijklmn"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


# An answer: (status, JSON body or raw text), or a callable of the request giving one.
Answer = tuple[int, Any] | Callable[[Seen], tuple[int, Any]]


@dataclass
class CannedHub:
    url: str = ""
    routes: dict[tuple[str, str], Answer] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    # Set at the end of the test: a request to a "hang" route waits for it (a hub that took
    # the request and never answers), never for a fixed time.
    release: threading.Event = field(default_factory=threading.Event)

    def answer(self, method: str, path: str, status: int, body: Any = None) -> None:
        self.routes[(method, path)] = (status, body if body is not None else {})

    def hang(self, method: str, path: str) -> None:
        def wait(_: Seen) -> tuple[int, Any]:
            self.release.wait(timeout=120)
            return 200, {}

        self.routes[(method, path)] = wait

    def bodies(self, method: str, path: str) -> list[Any]:
        return [s.body for s in self.seen if s.method == method and s.path == path]


def _handler(hub: CannedHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            path = self.path.split("?", 1)[0]
            seen = Seen(self.command, self.path, dict(self.headers.items()), body)
            hub.seen.append(seen)
            answer = hub.routes.get((self.command, path), (404, {"detail": "Not found."}))
            status, payload = answer(seen) if callable(answer) else answer
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(status)
            kind = "text/html" if isinstance(payload, str) else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            # A broken pipe: the CLI gave up (its timeout), which is what the test wanted.
            with contextlib.suppress(BrokenPipeError):
                self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test asserts on `seen`, not on a log

    return Handler


@contextmanager
def canned_hub() -> Iterator[CannedHub]:
    hub = CannedHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def cli_env(home: Path, hub_url: str, **extra: str) -> dict[str, str]:
    """The CLI's environment: its own home and config, the hub and token by env (never argv)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDGPU_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), CLOUDGPU_HUB=hub_url)
    env["CLOUDGPU_TOKEN"] = TOKEN
    env.update(extra)
    return env


def cloudgpu(
    home: Path, hub_url: str, *args: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLOUDGPU, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=cli_env(home, hub_url, **env),
        timeout=60,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str], code: int, start: str) -> str:
    """The failure was one stderr line with this start and exit code, no traceback, no token."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.startswith(f"cloudgpu: {start}"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert TOKEN not in result.stdout + result.stderr
    return result.stderr


def lease(state: str = "running", **fields: Any) -> dict[str, Any]:
    """A lease as the API shows one (the fields the CLI reads)."""
    body: dict[str, Any] = {
        "id": "1a2b3c4d-0000-4000-8000-000000000001",
        "state": state,
        "image": "busybox",
        "host_id": 7,
        "host_label": "vm · 3fa9c1",
        "hostname": "vm",
        "gpus": [{"gpu_id": 3, "index": 0, "model": "RTX 4090"}],
        "price_per_hour": "$0.50",
        "cost": "$0.01",
        "warmup": None,
        "volumes": [],
        "urls": [],
        "ssh": None,
        "warnings": [],
        "failure_reason": "",
        "end_reason": "",
        "created_at": "2026-01-01T00:00:00Z",
        "running_since": None,
    }
    body.update(fields)
    return body
