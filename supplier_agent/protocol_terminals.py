"""Terminals: the messages of an exec session in a lease's container, both directions.

A renter's terminal (the lease page, the API) is a process the agent starts with `docker exec`
in the lease's own container. The hub opens it with ``exec_open`` (a session id of its own
choosing), relays keystrokes (``exec_input``) and window sizes (``exec_resize``), and ends it
with ``exec_close``; the agent streams ``exec_output`` and ends with one ``exec_exit``. The agent
opens sessions only for leases it runs, and the hub relays output only for sessions it opened
on that same connection. Not Commands: nothing changes state, nothing is re-sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from supplier_agent.protocol_schema import (
    MAX_LOG_SEQ,
    Message,
    ProtocolError,
    _expect,
    _int,
    _known,
    _optional,
    _str,
    _str_list,
    _uuid,
)

MAX_EXEC_DATA_BYTES = 16 * 1024
MAX_TERMINAL_COLS = 1000
MAX_TERMINAL_ROWS = 500


def _exec_data(data: dict[str, Any], where: str) -> str:
    text = _str(data.get("data"), where, max_len=MAX_EXEC_DATA_BYTES, allow_empty=True)
    if len(text.encode("utf-8", errors="surrogatepass")) > MAX_EXEC_DATA_BYTES:
        raise ProtocolError(f"{where} is larger than {MAX_EXEC_DATA_BYTES} bytes")
    return text


@dataclass(frozen=True)
class ExecOpen(Message):
    """Start ``command`` (None: the image's login shell) in the lease's container, with a
    terminal of ``cols`` x ``rows`` when ``tty``; its output comes back as ``exec_output``."""

    TYPE: ClassVar[str] = "exec_open"
    session_id: str
    lease_id: str
    command: tuple[str, ...] | None = None
    tty: bool = True
    cols: int = 80
    rows: int = 24

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecOpen:
        _known(data, {"session_id", "lease_id", "command", "tty", "cols", "rows"}, "exec_open")
        command = _optional(
            data.get("command"), lambda v, w: _str_list(v, w, max_items=256), "exec_open.command"
        )
        if command is not None and not command:
            raise ProtocolError("exec_open.command: give at least the program to run")
        return cls(
            session_id=_uuid(data.get("session_id"), "exec_open.session_id"),
            lease_id=_uuid(data.get("lease_id"), "exec_open.lease_id"),
            command=command,
            tty=_expect(data.get("tty", True), bool, "exec_open.tty"),
            cols=_int(data.get("cols", 80), "exec_open.cols", lo=1, hi=MAX_TERMINAL_COLS),
            rows=_int(data.get("rows", 24), "exec_open.rows", lo=1, hi=MAX_TERMINAL_ROWS),
        )


@dataclass(frozen=True)
class ExecInput(Message):
    """Keystrokes (or pasted text) for a session's terminal, as UTF-8 text."""

    TYPE: ClassVar[str] = "exec_input"
    session_id: str
    data: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecInput:
        _known(data, {"session_id", "data"}, "exec_input")
        return cls(
            session_id=_uuid(data.get("session_id"), "exec_input.session_id"),
            data=_exec_data(data, "exec_input.data"),
        )


@dataclass(frozen=True)
class ExecResize(Message):
    TYPE: ClassVar[str] = "exec_resize"
    session_id: str
    cols: int
    rows: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecResize:
        _known(data, {"session_id", "cols", "rows"}, "exec_resize")
        return cls(
            session_id=_uuid(data.get("session_id"), "exec_resize.session_id"),
            cols=_int(data.get("cols"), "exec_resize.cols", lo=1, hi=MAX_TERMINAL_COLS),
            rows=_int(data.get("rows"), "exec_resize.rows", lo=1, hi=MAX_TERMINAL_ROWS),
        )


@dataclass(frozen=True)
class ExecClose(Message):
    """The renter left: end the session's process (the agent answers with ``exec_exit``)."""

    TYPE: ClassVar[str] = "exec_close"
    session_id: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecClose:
        _known(data, {"session_id"}, "exec_close")
        return cls(session_id=_uuid(data.get("session_id"), "exec_close.session_id"))


@dataclass(frozen=True)
class ExecOutput(Message):
    """What a session's process wrote (stdout and stderr as the terminal shows them), UTF-8
    text with undecodable bytes replaced; ``seq`` counts a session's chunks from 0."""

    TYPE: ClassVar[str] = "exec_output"
    session_id: str
    seq: int
    data: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecOutput:
        _known(data, {"session_id", "seq", "data"}, "exec_output")
        return cls(
            session_id=_uuid(data.get("session_id"), "exec_output.session_id"),
            seq=_int(data.get("seq"), "exec_output.seq", lo=0, hi=MAX_LOG_SEQ),
            data=_exec_data(data, "exec_output.data"),
        )


@dataclass(frozen=True)
class ExecExit(Message):
    """A session ended: its process exited (``exit_code``), or it could not start or was cut
    off (``error`` says why, fit to show the renter)."""

    TYPE: ClassVar[str] = "exec_exit"
    session_id: str
    exit_code: int | None = None
    error: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecExit:
        _known(data, {"session_id", "exit_code", "error"}, "exec_exit")
        return cls(
            session_id=_uuid(data.get("session_id"), "exec_exit.session_id"),
            exit_code=_optional(
                data.get("exit_code"),
                lambda v, w: _int(v, w, lo=-(2**31), hi=2**31),
                "exec_exit.exit_code",
            ),
            error=_optional(
                data.get("error"), lambda v, w: _str(v, w, max_len=1024), "exec_exit.error"
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_dict().items() if v is not None}
