"""`cloudgpu terminal LEASE`: an interactive shell in a running lease's container over the
hub's WebSocket /api/v1/leases/{id}/terminal/ (the lease page's protocol,
hub/leases/terminal_socket.py): JSON text frames, `input` and `resize` out, `output` and one
`exit` back.

On a terminal, stdin goes raw (keys, Ctrl-C included, go to the remote shell) and is restored
on every way out: the shell's exit, the hub closing, an error, SIGTERM or SIGHUP. Piped stdin is
sent as typed, then Ctrl-D, so `printf 'ls\\nexit\\n' | cloudgpu terminal L` works too."""

from __future__ import annotations

import codecs
import json
import os
import select
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import click
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection, connect

from cloudgpu_cli import __version__, config
from cloudgpu_cli.api import refusal
from cloudgpu_cli.errors import EXIT_CODES_HELP, FAILED, HUB_ERROR, UNREACHABLE, USAGE, CliError

READ_BYTES = 4096
EOT = "\x04"  # Ctrl-D: the remote pty's end of input, all the protocol has for "stdin closed"
RECV_POLL_S = 0.5


class _Hangup(Exception):
    """SIGTERM or SIGHUP: unwinds the main thread so the terminal is restored."""


def terminal_url(hub: str, lease_id: str, cols: int, rows: int) -> str:
    scheme, sep, rest = hub.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise CliError(f"the hub URL must start with http:// or https://, not {hub!r}", USAGE)
    ws = "wss" if scheme == "https" else "ws"
    return f"{ws}://{rest}/api/v1/leases/{lease_id}/terminal/?cols={cols}&rows={rows}"


def _size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return max(size.columns, 1), max(size.lines, 1)


def open_socket(hub: str, token: str, lease_id: str, timeout_s: float) -> ClientConnection:
    cols, rows = _size()
    try:
        return connect(
            terminal_url(hub, lease_id, cols, rows),
            additional_headers={"Authorization": f"Bearer {token}"},
            user_agent_header=f"cloudgpu-cli/{__version__}",
            open_timeout=timeout_s,
            # Output frames are at most the agent's chunk; the default 1 MiB is plenty, and
            # compression would only cost latency on keystrokes.
            compression=None,
        )
    except InvalidStatus as exc:
        # Channels refuses a socket before accepting it with a bare 403: the token (or its
        # scope); a lease not yours is answered after the handshake, below.
        code = exc.response.status_code
        raise refusal(code, f"the terminal was refused (HTTP {code})") from None
    except InvalidURI as exc:
        raise CliError(f"bad hub URL: {exc}", USAGE) from None
    except (TimeoutError, OSError) as exc:
        reason = str(exc) or exc.__class__.__name__
        raise CliError(f"hub unreachable: {hub}: {reason}", UNREACHABLE) from None
    except InvalidHandshake as exc:
        raise CliError(f"hub error: the terminal handshake failed: {exc}", HUB_ERROR) from None


@contextmanager
def raw_mode(fd: int | None) -> Iterator[None]:
    """The local terminal in raw mode for the block (no-op for ``None``), restored however the
    block ends; SIGTERM and SIGHUP raise in the main thread so that it does end."""
    if fd is None:
        yield
        return
    # POSIX only, imported here: the rest of the CLI works where these modules do not exist.
    import termios
    import tty

    saved = termios.tcgetattr(fd)

    def hang_up(signum: int, frame: FrameType | None) -> None:
        raise _Hangup(signal.Signals(signum).name)

    previous = {s: signal.signal(s, hang_up) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Session:
    """One terminal: a thread sends stdin (and window sizes), the main thread prints output."""

    def __init__(self, socket: ClientConnection, stdin_fd: int, interactive: bool) -> None:
        self.socket = socket
        self.stdin_fd = stdin_fd
        self.interactive = interactive
        self._wake_read, self._wake_write = os.pipe()
        self._resized = threading.Event()
        self._stopping = threading.Event()

    def run(self) -> int:
        sender = threading.Thread(target=self._send_input, name="terminal-input", daemon=True)
        previous = None
        if self.interactive:
            previous = signal.signal(signal.SIGWINCH, self._on_resize)
        sender.start()
        try:
            return self._print_output()
        finally:
            self._stopping.set()
            os.write(self._wake_write, b"x")
            if previous is not None:
                signal.signal(signal.SIGWINCH, previous)
            self.socket.close()
            sender.join(timeout=2)
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _on_resize(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler must not take the socket's lock the main thread may hold: wake the
        # sender thread instead, which sends the new size.
        self._resized.set()
        os.write(self._wake_write, b"r")

    def _send(self, message: dict[str, Any]) -> None:
        self.socket.send(json.dumps(message))

    def _send_input(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        reading = True
        try:
            while not self._stopping.is_set():
                watched = [self._wake_read, self.stdin_fd] if reading else [self._wake_read]
                ready, _, _ = select.select(watched, [], [])
                if self._wake_read in ready:
                    os.read(self._wake_read, 64)
                    if self._resized.is_set():
                        self._resized.clear()
                        cols, rows = _size()
                        self._send({"type": "resize", "cols": cols, "rows": rows})
                if reading and self.stdin_fd in ready:
                    data = os.read(self.stdin_fd, READ_BYTES)
                    text = decoder.decode(data, final=not data)
                    if text:
                        self._send({"type": "input", "data": text})
                    if not data:
                        reading = False
                        self._send({"type": "input", "data": EOT})
        except (ConnectionClosed, OSError):
            return  # the main thread reports how the session ended

    def _print_output(self) -> int:
        out = sys.stdout.buffer
        while True:
            try:
                raw = self.socket.recv(timeout=RECV_POLL_S)
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                reason = exc.rcvd.reason if exc.rcvd else ""
                raise CliError(
                    f"the hub closed the terminal without an exit{': ' + reason if reason else ''}",
                    FAILED,
                ) from None
            try:
                message = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if message.get("type") == "output":
                out.write(str(message.get("data", "")).encode("utf-8", "replace"))
                out.flush()
            elif message.get("type") == "exit":
                code = message.get("exit_code")
                if code is None:
                    raise CliError(f"terminal: {message.get('error') or 'ended'}", FAILED)
                return int(code) & 0xFF


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("lease_id")
def terminal(lease_id: str) -> None:
    """An interactive shell in a running lease's container.

    Exit the shell (or Ctrl-D) to leave; cloudgpu exits with the shell's exit code.
    """
    settings = config.resolve()
    token = config.require_token(settings)
    stdin_fd = sys.stdin.fileno()
    interactive = os.isatty(stdin_fd)
    socket = open_socket(settings.hub, token, lease_id, settings.timeout_s)
    try:
        with raw_mode(stdin_fd if interactive else None):
            code = Session(socket, stdin_fd, interactive).run()
    except _Hangup as exc:
        raise CliError(f"terminal: {exc} received; the session ended", FAILED) from None
    finally:
        socket.close()
    raise SystemExit(code)
