"""`cloudgpu terminal`: the lease page's terminal protocol over a real WebSocket server on
127.0.0.1 (websockets' own), piped and on a pseudo-terminal: input and output, the shell's exit
code, the first size and resizes, and the local terminal restored however it ends."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import queue
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from hub.lib.ports import free_port
from tests.cli.canned_hub import CLOUDGPU, TOKEN, cli_env, one_line
from tests.support.polling import wait_for

LEASE_ID = "1a2b3c4d-0000-4000-8000-000000000001"


@dataclass
class TerminalHub:
    url: str
    server: Server
    sockets: queue.Queue[ServerConnection] = field(default_factory=queue.Queue)
    paths: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def next_socket(self) -> ServerConnection:
        return self.sockets.get(timeout=30)


def _read(socket: ServerConnection) -> dict[str, Any]:
    return json.loads(socket.recv(timeout=30))


@pytest.fixture
def hub() -> Iterator[TerminalHub]:
    state: dict[str, TerminalHub] = {}

    def check(connection: ServerConnection, request: Request) -> Response | None:
        # The hub's consumer refuses a socket without a live token before accepting it.
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return connection.respond(403, "")
        state["hub"].paths.append(request.path)
        return None

    def handler(connection: ServerConnection) -> None:
        state["hub"].sockets.put(connection)
        state["hub"].done.wait(timeout=120)  # the test talks; closing ends the connection

    with serve(handler, "127.0.0.1", 0, process_request=check, compression=None) as server:
        port = server.socket.getsockname()[1]
        state["hub"] = TerminalHub(f"http://127.0.0.1:{port}", server)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield state["hub"]
        finally:
            state["hub"].done.set()
            server.shutdown()
            thread.join(timeout=10)


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    env = cli_env(tmp_path, url)
    for name in ("COLUMNS", "LINES"):  # the size must come from the terminal itself
        env.pop(name, None)
    return env


def _start(tmp_path: Path, url: str, **io: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([CLOUDGPU, "terminal", LEASE_ID], env=_env(tmp_path, url), **io)


def _piped(tmp_path: Path, url: str, typed: str = "") -> subprocess.Popen[bytes]:
    """The CLI with stdin from a file (piped input, not a terminal), stdout and stderr read."""
    source = tmp_path / "stdin"
    source.write_text(typed)
    with source.open("rb") as stdin:
        return _start(tmp_path, url, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _finished(cli: subprocess.Popen[bytes]) -> subprocess.CompletedProcess[str]:
    out, err = cli.communicate(timeout=30)
    return subprocess.CompletedProcess(cli.args, cli.returncode, out.decode(), err.decode())


def test_piped_input_reaches_the_shell_and_its_exit_code_is_ours(
    hub: TerminalHub, tmp_path: Path
) -> None:
    cli = _piped(tmp_path, hub.url, "echo grüße\nexit 7\n")
    socket = hub.next_socket()
    typed = ""
    # Everything typed, then Ctrl-D for the end of stdin (a pty reads it as end of input).
    while not typed.endswith("\x04"):
        message = _read(socket)
        assert message["type"] == "input"
        typed += message["data"]
    assert typed == "echo grüße\nexit 7\n\x04"
    socket.send(json.dumps({"type": "output", "data": "grüße\r\n"}))
    socket.send(json.dumps({"type": "exit", "exit_code": 7, "error": None}))
    result = _finished(cli)
    assert (result.returncode, result.stdout, result.stderr) == (7, "grüße\r\n", "")
    assert hub.paths == [f"/api/v1/leases/{LEASE_ID}/terminal/?cols=80&rows=24"]


def test_a_refused_session_is_one_line_and_exit_1(hub: TerminalHub, tmp_path: Path) -> None:
    cli = _piped(tmp_path, hub.url)
    socket = hub.next_socket()
    socket.send(json.dumps({"type": "exit", "exit_code": None, "error": "no such rental of yours"}))
    socket.close(4403)
    one_line(_finished(cli), 1, "terminal: no such rental of yours")


def test_the_hub_closing_without_an_exit_is_one_line(hub: TerminalHub, tmp_path: Path) -> None:
    cli = _piped(tmp_path, hub.url)
    hub.next_socket().close(1011, "server going away")
    one_line(_finished(cli), 1, "the hub closed the terminal without an exit: server going away")


def test_a_refused_token_at_the_handshake_exits_3(hub: TerminalHub, tmp_path: Path) -> None:
    env = {**_env(tmp_path, hub.url), "CLOUDGPU_TOKEN": "cgpr_wrong_0123456789abcdefghijklmnopqr"}
    result = subprocess.run(
        [CLOUDGPU, "terminal", LEASE_ID], env=env, capture_output=True, text=True, timeout=60
    )
    one_line(result, 3, "token refused by the hub: the terminal was refused (HTTP 403)")


def test_an_unreachable_hub_exits_4(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [CLOUDGPU, "terminal", LEASE_ID],
        env=_env(tmp_path, url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    one_line(result, 4, f"hub unreachable: {url}")


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal (controller, the CLI's side) 30x100, its output drained meanwhile."""
    controller, side = pty.openpty()
    _set_size(side, 30, 100)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            try:
                if not os.read(controller, 4096):
                    return
            except OSError:
                return

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    yield controller, side
    stop.set()
    os.close(side)
    os.close(controller)
    thread.join(timeout=5)


def _is_raw(fd: int) -> bool:
    return not termios.tcgetattr(fd)[3] & (termios.ICANON | termios.ECHO)


@pytest.mark.parametrize("ending", ["exit", "SIGTERM", "SIGHUP", "closed"])
def test_on_a_terminal_it_goes_raw_resizes_and_restores_it(
    hub: TerminalHub, tmp_path: Path, terminal: tuple[int, int], ending: str
) -> None:
    _, side = terminal
    before = termios.tcgetattr(side)
    cli = _start(tmp_path, hub.url, stdin=side, stdout=side, stderr=side)
    try:
        socket = hub.next_socket()
        assert hub.paths == [f"/api/v1/leases/{LEASE_ID}/terminal/?cols=100&rows=30"]
        wait_for(lambda: _is_raw(side), timeout_s=30, what="the terminal in raw mode")
        _set_size(side, 43, 132)
        cli.send_signal(signal.SIGWINCH)
        assert _read(socket) == {"type": "resize", "cols": 132, "rows": 43}
        if ending == "exit":
            socket.send(json.dumps({"type": "exit", "exit_code": 0, "error": None}))
            expected = 0
        elif ending == "closed":
            socket.close(1011)
            expected = 1
        else:
            cli.send_signal(getattr(signal, ending))
            expected = 1
        assert cli.wait(timeout=30) == expected
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(timeout=10)
    assert termios.tcgetattr(side) == before
