"""The gateway's ssh port: accept here, set TCP_NODELAY, hand the socket to ``sshd -i``.

Why not sshd's own listener: sshd turns Nagle off on a connection only when it opens a session
(a shell, a pty), and tunnel logins never open one (-N, MaxSessions 0). With Nagle on, every new
connection through a tunnel waits ~40 ms for a delayed ACK whenever the previous one has just
closed: measured 44 ms -> 4 ms per new connection (see docs/benchmarks.md). This is inetd /
systemd socket activation (``Accept=yes``, ``NoDelay=true``): sshd still does all of ssh, one
process per connection, as it does anyway after its fork.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

import psutil

log = logging.getLogger(__name__)


class SshListener:
    def __init__(
        self,
        sshd: str,
        config: Path,
        host: str,
        port: int,
        *,
        max_connections: int = 20_000,
        stderr: IO[bytes] | None = None,
    ) -> None:
        self.argv = [sshd, "-i", "-e", "-f", str(config)]
        self.max_connections = max_connections
        self.stderr = stderr
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(1024)
        self.socket.settimeout(0.5)  # the accept loop checks for stop this often
        self._children: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ssh-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def connections(self) -> int:
        self._children = [child for child in self._children if child.poll() is None]
        return len(self._children)

    def cut_older_than(self, user: str, max_age_s: float) -> int:
        """End every connection logged in as ``user`` (sshd's child for the session runs as
        that user) that has lasted ``max_age_s`` or more; how many were ended."""
        cut = 0
        now = time.time()
        for child in list(self._children):
            try:
                monitor = psutil.Process(child.pid)
                if now - monitor.create_time() < max_age_s:
                    continue
                if not any(p.username() == user for p in monitor.children(recursive=True)):
                    continue
                monitor.terminate()
                cut += 1
            except psutil.Error:  # it ended meanwhile
                continue
        return cut

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.socket.accept()
            except TimeoutError:
                self.connections()  # reap the finished
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("ssh listener: accept failed: %s", exc)
                continue
            with conn:
                if self.connections() >= self.max_connections:
                    continue  # closed unanswered, as sshd's MaxStartups would
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                conn.setblocking(True)
                try:
                    child = subprocess.Popen(
                        self.argv, stdin=conn, stdout=conn, stderr=self.stderr, close_fds=True
                    )
                except OSError as exc:
                    log.error("ssh listener: cannot start sshd: %s", exc)
                    continue
                self._children.append(child)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting and end every connection (an orderly gateway stop)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        with contextlib.suppress(OSError):
            self.socket.close()
        for child in self._children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        for child in self._children:
            try:
                child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self._children.clear()
