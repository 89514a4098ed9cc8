"""Renters' terminals in the agent (supplier_agent.terminals + docker_exec) against the real
Docker engine: a shell with a TTY that echoes, resizes, takes Ctrl-C and UTF-8, a one-shot
command's exit code and both streams, a close that ends a foreground program, refusals, and
the compat pin for the exec stream's socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from supplier_agent.compat_docker import close_exec_stream, exec_stream_socket
from supplier_agent.docker_exec import open_exec
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    ExecClose,
    ExecExit,
    ExecInput,
    ExecOpen,
    ExecOutput,
    ExecResize,
    Message,
    checked_body,
    encode,
    parse_message,
)
from supplier_agent.runtime import CommandFailed
from supplier_agent.terminals import Terminals
from tests.support.loops import run_on_own_loop

pytestmark = pytest.mark.docker

LEASE = str(uuid.uuid4())


@pytest.fixture(scope="module")
def container(docker_client: Any, busybox_image: str) -> Iterator[Any]:
    box = docker_client.containers.run(
        busybox_image, ["sleep", "3600"], detach=True, labels={"cloudgpu.test": "terminals"}
    )
    try:
        yield box
    finally:
        box.remove(force=True)


class Hub:
    """The hub's side of one connection: what the agent sent, as parsed frames."""

    def __init__(self) -> None:
        self.frames: list[Message] = []
        self.changed = asyncio.Event()

    async def send(self, message: Message) -> None:
        # Through the wire format, as the real connection carries it.
        self.frames.append(parse_message(encode(message)))
        self.changed.set()

    def output(self, sid: str) -> str:
        return "".join(
            f.data for f in self.frames if isinstance(f, ExecOutput) and f.session_id == sid
        )

    def exit_of(self, sid: str) -> ExecExit | None:
        exits = [f for f in self.frames if isinstance(f, ExecExit) and f.session_id == sid]
        assert len(exits) <= 1
        return exits[0] if exits else None

    async def until(self, what: str, check: Any, timeout_s: float = 30) -> Any:
        async def poll() -> Any:
            while True:
                found = check()
                if found:
                    return found
                self.changed.clear()
                # Woken by a frame, or every 0.1 s for checks that look elsewhere.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.1)

        try:
            return await asyncio.wait_for(poll(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"no {what}; got {self.frames!r}") from None


def _running(container: Any, command: str) -> bool:
    return any(command in row[-1] for row in container.top()["Processes"])


def _terminals(hub: Hub, container: Any, docker_client: Any) -> Terminals:
    def open_in_container(message: ExecOpen) -> Any:
        if message.lease_id != LEASE:
            raise CommandFailed(f"lease {message.lease_id} has no container on this host")
        return open_exec(
            docker_client.api,
            container.id,
            message.command,
            tty=message.tty,
            cols=message.cols,
            rows=message.rows,
        )

    return Terminals(open_in_container, hub.send)


def test_a_shell_echoes_resizes_takes_ctrl_c_and_utf8_and_exits(
    container: Any, docker_client: Any
) -> None:
    async def scenario() -> None:
        hub = Hub()
        terminals = _terminals(hub, container, docker_client)
        sid = str(uuid.uuid4())
        await terminals.handle(ExecOpen(session_id=sid, lease_id=LEASE, cols=100, rows=30))
        # Typed right after the open, as a fast renter does: nothing is lost.
        await terminals.handle(ExecInput(session_id=sid, data="echo hi-$((40+2))\n"))
        await hub.until("echo", lambda: "hi-42" in hub.output(sid))
        await terminals.handle(ExecInput(session_id=sid, data="stty size\n"))
        await hub.until("the first size", lambda: "30 100" in hub.output(sid))
        await terminals.handle(ExecResize(session_id=sid, cols=132, rows=43))
        await terminals.handle(ExecInput(session_id=sid, data="stty size\n"))
        await hub.until("the new size", lambda: "43 132" in hub.output(sid))
        await terminals.handle(ExecInput(session_id=sid, data="echo 'grüße ✓'\n"))
        await hub.until("UTF-8 back", lambda: hub.output(sid).count("grüße ✓") >= 2)
        await terminals.handle(ExecInput(session_id=sid, data="sleep 601\n"))
        # Ctrl-C goes to the program in the foreground: once it runs (before, the shell's own
        # line editor would take it).
        await hub.until("sleep to run", lambda: _running(container, "sleep 601"))
        await terminals.handle(ExecInput(session_id=sid, data="\x03"))  # Ctrl-C
        await terminals.handle(ExecInput(session_id=sid, data="echo after-$((6*7))\n"))
        await hub.until("the shell after Ctrl-C", lambda: "after-42" in hub.output(sid))
        await terminals.handle(ExecInput(session_id=sid, data="exit 7\n"))
        ended = await hub.until("exec_exit", lambda: hub.exit_of(sid))
        assert ended.exit_code == 7
        assert ended.error is None
        assert terminals.count == 0
        seqs = [f.seq for f in hub.frames if isinstance(f, ExecOutput)]
        assert seqs == list(range(len(seqs)))

    run_on_own_loop(scenario())


def test_a_one_shot_command_gives_both_streams_and_its_exit_code(
    container: Any, docker_client: Any
) -> None:
    async def scenario() -> None:
        hub = Hub()
        terminals = _terminals(hub, container, docker_client)
        sid = str(uuid.uuid4())
        command = ("sh", "-c", "echo to-out; echo to-err >&2; exit 3")
        await terminals.handle(ExecOpen(session_id=sid, lease_id=LEASE, command=command, tty=False))
        ended = await hub.until("exec_exit", lambda: hub.exit_of(sid))
        assert ended.exit_code == 3
        assert "to-out" in hub.output(sid)
        assert "to-err" in hub.output(sid)

    run_on_own_loop(scenario())


def test_closing_ends_a_program_in_the_foreground(container: Any, docker_client: Any) -> None:
    async def scenario() -> None:
        hub = Hub()
        terminals = _terminals(hub, container, docker_client)
        sid = str(uuid.uuid4())
        await terminals.handle(ExecOpen(session_id=sid, lease_id=LEASE))
        await terminals.handle(ExecInput(session_id=sid, data="echo ready; exec sleep 3600\n"))
        await hub.until("the program to start", lambda: "ready" in hub.output(sid))
        await terminals.handle(ExecClose(session_id=sid))
        await hub.until("exec_exit", lambda: hub.exit_of(sid))
        assert terminals.count == 0

        def sleepers() -> list[Any]:
            return [p for p in container.top()["Processes"] if "3600" in p[-1] and "sh" in p[-1]]

        # The container's own `sleep 3600` is its main process (pid 1); no other is left.
        assert all("exec sleep" not in p[-1] for p in sleepers())

    run_on_own_loop(scenario())


def test_another_leases_terminal_and_too_many_are_refused(
    container: Any, docker_client: Any
) -> None:
    async def scenario() -> None:
        hub = Hub()
        terminals = _terminals(hub, container, docker_client)
        sid = str(uuid.uuid4())
        await terminals.handle(ExecOpen(session_id=sid, lease_id=str(uuid.uuid4())))
        ended = await hub.until("a refusal", lambda: hub.exit_of(sid))
        assert ended.exit_code is None
        assert "has no container on this host" in (ended.error or "")

        opened = [str(uuid.uuid4()) for _ in range(9)]
        for each in opened:
            await terminals.handle(ExecOpen(session_id=each, lease_id=LEASE))
        refused = await hub.until("the ninth refused", lambda: hub.exit_of(opened[-1]))
        assert "8 terminals open already" in (refused.error or "")
        assert terminals.count == 8
        terminals.close_all()
        assert terminals.count == 0

    run_on_own_loop(scenario())


def test_exec_frames_are_checked_like_every_other() -> None:
    sid = str(uuid.uuid4())
    body = checked_body(ExecOpen(session_id=sid, lease_id=LEASE), allowed=HUB_TO_AGENT)
    assert body["type"] == "exec_open"
    for bad, reason in (
        ({"type": "exec_open", "v": 1, "session_id": sid, "lease_id": LEASE, "cols": 0}, "cols"),
        (
            {"type": "exec_open", "v": 1, "session_id": sid, "lease_id": LEASE, "command": []},
            "program",
        ),
        ({"type": "exec_input", "v": 1, "session_id": sid, "data": "x" * 20000}, "longer"),
        ({"type": "exec_resize", "v": 1, "session_id": "nope", "cols": 1, "rows": 1}, "session_id"),
    ):
        with pytest.raises(Exception, match=reason):
            parse_message(__import__("json").dumps(bad), allowed=HUB_TO_AGENT)
    # Output and exits go the other way only.
    with pytest.raises(Exception, match="unknown message type"):
        parse_message(encode(ExecExit(session_id=sid, exit_code=0)), allowed=HUB_TO_AGENT)


def test_the_exec_stream_still_has_the_socket_the_compat_module_reads(
    container: Any, docker_client: Any
) -> None:
    api = docker_client.api
    exec_id = api.exec_create(container.id, ["true"], stdin=True, tty=True)["Id"]
    stream = api.exec_start(exec_id, tty=True, socket=True)
    try:
        assert isinstance(exec_stream_socket(stream), socket.socket), (
            "docker-py's exec_start(socket=True) no longer answers a SocketIO over a socket: "
            "re-check supplier_agent.compat_docker.exec_stream_socket"
        )
    finally:
        close_exec_stream(stream)
