"""`docker exec` in a lease's container for a renter's terminal (supplier_agent.terminals).

The process runs with the container's own user, capabilities and limits (an exec inherits
them: it is never privileged), so a terminal can do nothing the renter's own container could
not. With ``tty`` its output is the terminal's raw stream; without, Docker multiplexes stdout
and stderr with 8-byte headers, which ``read`` takes apart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct

from docker import APIClient

from supplier_agent.compat_docker import close_exec_stream, exec_stream_socket

# Bash where the image has it (a login shell, as ssh gives), else the POSIX shell.
DEFAULT_SHELL = ("/bin/sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash -l; exec sh -l")


class DockerExec:
    def __init__(self, api: APIClient, exec_id: str, stream: object, *, tty: bool) -> None:
        self._api = api
        self._exec_id = exec_id
        self._stream = stream  # keeps docker-py's response (and so the socket) alive
        self._sock = exec_stream_socket(stream)
        # docker-py's client timeout (the agent's API calls) would end a quiet terminal after
        # it: a shell may wait for its renter for hours.
        self._sock.settimeout(None)
        self._tty = tty
        self._pending = b""

    def read(self, size: int) -> bytes:
        if self._tty:
            return self._sock.recv(size)
        return self._read_frame(size)

    def _read_frame(self, size: int) -> bytes:
        # Multiplexed: [stream, 0, 0, 0, length (big-endian u32)] then the payload.
        while not self._pending:
            header = self._recv_exactly(8)
            if len(header) < 8:
                return b""
            length = struct.unpack(">xxxxL", header)[0]
            self._pending = self._recv_exactly(length)
            if len(self._pending) < length and not self._pending:
                return b""
        data, self._pending = self._pending[:size], self._pending[size:]
        return data

    def _recv_exactly(self, size: int) -> bytes:
        parts: list[bytes] = []
        left = size
        while left:
            part = self._sock.recv(left)
            if not part:
                break
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def stream_socket(self) -> socket.socket | None:
        # A TTY's stream is raw bytes: the agent's loop reads it directly. Without a TTY it is
        # multiplexed, and read() above takes its frames apart in a thread.
        return self._sock if self._tty else None

    def write(self, data: bytes) -> None:
        self._sock.sendall(data)

    def resize(self, cols: int, rows: int) -> None:
        if self._tty:
            self._api.exec_resize(self._exec_id, height=rows, width=cols)

    def exit_code(self) -> int | None:
        code = self._api.exec_inspect(self._exec_id).get("ExitCode")
        return int(code) if code is not None else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        close_exec_stream(self._stream)
        # A program in the foreground (top, a training run started by hand) would outlive its
        # stream: hang up on it, as closing an ssh session does. Needs the agent's rights
        # over the container's processes (root); without them it stays, as under `docker exec`.
        with contextlib.suppress(Exception):
            info = self._api.exec_inspect(self._exec_id)
            pid = int(info.get("Pid") or 0)
            if info.get("Running") and pid > 1:
                os.kill(pid, signal.SIGHUP)


def open_exec(
    api: APIClient,
    container_id: str,
    command: tuple[str, ...] | None,
    *,
    tty: bool,
    cols: int,
    rows: int,
) -> DockerExec:
    env = {"TERM": "xterm-256color"} if tty else {}
    created = api.exec_create(
        container_id,
        list(command or DEFAULT_SHELL),
        stdin=True,
        tty=tty,
        environment=env,
    )
    exec_id = created["Id"]
    stream = api.exec_start(exec_id, tty=tty, socket=True)
    process = DockerExec(api, exec_id, stream, tty=tty)
    if tty:
        with contextlib.suppress(Exception):  # sized once the process runs; a race is harmless
            process.resize(cols, rows)
    return process
