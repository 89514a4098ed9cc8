"""Renters' terminals: processes started with `docker exec` in their lease's container, relayed
to the hub as ``exec_output`` frames (supplier_agent/protocol_terminals.py).

Each session has a thread of its own that blocks on the exec's stream (a read there can take
hours: it must not hold one of the event loop's few default executor threads) and hands what
it read to the loop. Sessions belong to the hub connection that opened them: when it closes,
they all end, since nobody is left to see their output.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from supplier_agent.host_paths import redact_host_paths
from supplier_agent.protocol import (
    MAX_EXEC_DATA_BYTES,
    ExecClose,
    ExecExit,
    ExecInput,
    ExecOpen,
    ExecOutput,
    ExecResize,
    Message,
)

log = logging.getLogger(__name__)

MAX_SESSIONS = 32
MAX_SESSIONS_PER_LEASE = 8
# Read size: at most one frame's worth, so a burst becomes several frames, never a refused one
# (UTF-8 text of 4 KiB of bytes is at most 4 KiB plus replacement characters: 3 bytes each).
READ_BYTES = MAX_EXEC_DATA_BYTES // 4
# A session's output is paced to this: a terminal shows far less, and `cat` of a huge file must
# not flood the hub (which relays every byte to the renter's browser).
OUTPUT_BYTES_PER_S = 1024 * 1024
SEND_TIMEOUT_S = 60


class ExecProcess(Protocol):
    """One exec'd process with its stream (a runtime's ``open_exec``). Blocking calls."""

    def read(self, size: int) -> bytes: ...

    def write(self, data: bytes) -> None: ...

    def resize(self, cols: int, rows: int) -> None: ...

    def close(self) -> None: ...

    def exit_code(self) -> int | None: ...

    def stream_socket(self) -> socket.socket | None:
        """The stream's socket when the event loop may read and write it itself (a TTY's raw
        stream), else None (read() in a thread: a multiplexed stream needs parsing)."""
        ...


class ExecRefused(Exception):
    """The session cannot start; the message is fit to show the renter."""


OpenExec = Callable[[ExecOpen], ExecProcess]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class _Session:
    lease_id: str
    process: ExecProcess | None = None  # None while it starts
    # Set once started (or failed): keystrokes sent right after the open wait for it.
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Input, resizes and the close of one session run in the order they came (each message
    # is handled in a task of its own, and asyncio.Lock wakes waiters first come, first served).
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reader: threading.Thread | asyncio.Task[None] | None = None
    sock: socket.socket | None = None  # set: the loop reads and writes it, no thread
    closed: bool = False
    seq: int = 0
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )


class Terminals:
    """The sessions of one hub connection. ``open_exec`` runs in a worker thread and raises
    ExecRefused (or the runtime's CommandFailed) with the reason; ``send`` puts a frame on the
    connection."""

    def __init__(self, open_exec: OpenExec, send: Send) -> None:
        self._open_exec = open_exec
        self._send = send
        self._sessions: dict[str, _Session] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def count(self) -> int:
        return len(self._sessions)

    async def handle(self, message: Message) -> None:
        if isinstance(message, ExecOpen):
            await self._open(message)
        elif isinstance(message, ExecInput):
            await self._input(message)
        elif isinstance(message, ExecResize):
            await self._resize(message)
        elif isinstance(message, ExecClose):
            await self._close(message.session_id)

    async def _open(self, message: ExecOpen) -> None:
        sid = message.session_id
        if sid in self._sessions:
            return  # a repeated open: the session runs already
        if len(self._sessions) >= MAX_SESSIONS:
            await self._exit(sid, error=f"this host has {MAX_SESSIONS} terminals open already")
            return
        if sum(s.lease_id == message.lease_id for s in self._sessions.values()) >= (
            MAX_SESSIONS_PER_LEASE
        ):
            await self._exit(
                sid, error=f"this rental has {MAX_SESSIONS_PER_LEASE} terminals open already"
            )
            return
        self._loop = asyncio.get_running_loop()
        session = _Session(lease_id=message.lease_id)
        self._sessions[sid] = session
        try:
            session.process = await asyncio.to_thread(self._open_exec, message)
        except Exception as exc:  # the runtime's refusal, or Docker's error, is the reason
            self._sessions.pop(sid, None)
            session.closed = True
            session.ready.set()
            # Docker's words reach the renter's terminal: no host paths in them.
            await self._exit(sid, error=redact_host_paths(str(exc)) or type(exc).__name__)
            return
        session.ready.set()
        if session.closed:  # closed while it started
            await asyncio.to_thread(_quietly_close, session.process)
        session.sock = session.process.stream_socket()
        if session.sock is not None:
            # In the loop: a keystroke's echo costs no hop to and from a thread.
            session.sock.setblocking(False)
            session.reader = asyncio.create_task(self._read_async(sid, session, session.sock))
            return
        session.reader = threading.Thread(
            target=self._read_loop, args=(sid, session), name=f"exec-{sid[:8]}", daemon=True
        )
        session.reader.start()

    def _read_loop(self, sid: str, session: _Session) -> None:
        """In the session's own thread: read until the stream ends, and wait for each piece to
        be sent before reading on. That keeps the pieces in order, ahead of the exec_exit, and
        is the backpressure: a process printing faster than the hub takes it blocks on its
        terminal, as under a slow ssh, instead of filling the agent's memory."""
        loop = self._loop
        process = session.process
        assert loop is not None
        assert process is not None
        budget = _Budget(OUTPUT_BYTES_PER_S)
        try:
            while True:
                data = process.read(READ_BYTES)
                if not data:
                    break
                budget.spend(len(data))
                sent = asyncio.run_coroutine_threadsafe(self._output(sid, session, data), loop)
                sent.result(timeout=SEND_TIMEOUT_S)
        except Exception as exc:
            if not session.closed:
                log.info("terminal %s: stream ended: %r", sid, exc)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the agent is stopping
                asyncio.run_coroutine_threadsafe(self._finished(sid, session), loop)

    async def _read_async(self, sid: str, session: _Session, sock: socket.socket) -> None:
        """``_read_loop`` for a stream the loop reads itself, with the same order and
        backpressure (each piece is sent before the next read)."""
        loop = asyncio.get_running_loop()
        budget = _Budget(OUTPUT_BYTES_PER_S)
        try:
            while True:
                data = await loop.sock_recv(sock, READ_BYTES)
                if not data:
                    break
                pause = budget.take(len(data))
                if pause:
                    await asyncio.sleep(pause)  # pacing, as a slow link would
                await self._output(sid, session, data)
        except OSError as exc:
            if not session.closed:
                log.info("terminal %s: stream ended: %r", sid, exc)
        await self._finished(sid, session)

    async def _output(self, sid: str, session: _Session, data: bytes, final: bool = False) -> None:
        text = session.decoder.decode(data, final=final)
        if not text:
            return  # the start of a character whose rest comes next
        seq, session.seq = session.seq, session.seq + 1
        with contextlib.suppress(Exception):  # the connection is closing: nobody to tell
            await self._send(ExecOutput(session_id=sid, seq=seq, data=text))

    async def _finished(self, sid: str, session: _Session) -> None:
        if self._sessions.get(sid) is not session:
            return
        del self._sessions[sid]
        await self._output(sid, session, b"", final=True)  # a character cut at the very end
        assert session.process is not None
        code = await asyncio.to_thread(_exit_code_and_close, session.process)
        await self._exit(sid, exit_code=code)

    @staticmethod
    async def _started(session: _Session) -> ExecProcess | None:
        """The session's process once it started, or None if it failed or was closed."""
        await session.ready.wait()
        if session.closed:
            return None
        return session.process

    async def _input(self, message: ExecInput) -> None:
        session = self._sessions.get(message.session_id)
        if session is None:
            return
        async with session.lock:
            process = await self._started(session)
            if process is None:
                return
            try:
                data = message.data.encode("utf-8", "replace")
                if session.sock is not None:
                    await asyncio.get_running_loop().sock_sendall(session.sock, data)
                else:
                    await asyncio.to_thread(process.write, data)
            except OSError as exc:
                log.info("terminal %s: input not delivered: %r", message.session_id, exc)

    async def _resize(self, message: ExecResize) -> None:
        session = self._sessions.get(message.session_id)
        if session is None:
            return
        async with session.lock:
            process = await self._started(session)
            if process is None:
                return
            try:
                await asyncio.to_thread(process.resize, message.cols, message.rows)
            except Exception as exc:  # a process that just exited cannot be resized
                log.info("terminal %s: resize failed: %r", message.session_id, exc)

    async def _close(self, sid: str) -> None:
        session = self._sessions.get(sid)
        if session is None:
            return
        async with session.lock:
            if session.closed:
                return
            session.closed = True
            if session.sock is not None:
                # The loop's reader wakes with the end of the stream and reports exec_exit
                # (closing the process, in a thread, after that).
                with contextlib.suppress(OSError):
                    session.sock.shutdown(socket.SHUT_RDWR)
            elif session.process is not None:
                # Closing the stream ends the reader thread, whose end reports exec_exit.
                await asyncio.to_thread(_quietly_close, session.process)

    async def _exit(
        self, sid: str, *, exit_code: int | None = None, error: str | None = None
    ) -> None:
        with contextlib.suppress(Exception):
            await self._send(ExecExit(session_id=sid, exit_code=exit_code, error=error))

    def close_all(self) -> None:
        """The hub connection is gone: end every session without telling anyone."""
        for session in self._sessions.values():
            session.closed = True
            if isinstance(session.reader, asyncio.Task):
                session.reader.cancel()  # before the socket goes, so no read waits on it
            if session.process is not None:
                process = session.process
                threading.Thread(target=_quietly_close, args=(process,), daemon=True).start()
        self._sessions.clear()

    async def close_lease(self, lease_id: str) -> None:
        """The lease ended: its terminals end with it."""
        for sid in [sid for sid, s in self._sessions.items() if s.lease_id == lease_id]:
            await self._close(sid)


class _Budget:
    """Pacing for one reader thread: past ``per_s`` bytes a second it sleeps the difference
    (a rate limit on a worker thread, the way a slow link paces a terminal)."""

    def __init__(self, per_s: int) -> None:
        self._per_s = per_s
        self._started = time.monotonic()
        self._spent = 0

    def take(self, size: int) -> float:
        """Count ``size`` bytes; how long to wait before sending them (0: at once)."""
        self._spent += size
        ahead = self._spent / self._per_s - (time.monotonic() - self._started)
        if ahead < -1:  # idle a while: no credit for the past
            self._started, self._spent = time.monotonic(), size
            return 0.0
        return max(0.0, ahead)

    def spend(self, size: int) -> None:
        """``take`` for a reader thread: it sleeps the wait itself."""
        pause = self.take(size)
        if pause:
            time.sleep(pause)


def _quietly_close(process: ExecProcess) -> None:
    try:
        process.close()
    except Exception as exc:
        log.info("closing a terminal: %r", exc)


def _exit_code_and_close(process: ExecProcess) -> int | None:
    try:
        return process.exit_code()
    except Exception as exc:
        log.info("terminal exit code unknown: %r", exc)
        return None
    finally:
        _quietly_close(process)
