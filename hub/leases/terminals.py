"""Terminals and commands in a lease's container (issue 17): who may open one, its record, and
the frames that carry it.

A session is opened here (``open_session``: only the lease's own renter, only while it runs
on a connected host), then relayed by two consumers through the channel layer: the renter's
socket (hub/web/terminal.py, or the API's) sends ``agent.exec`` events to the host's channel,
and the agent's socket (hub/agents/consumer.py) forwards them to the agent and routes the
agent's ``exec_output`` / ``exec_exit`` back to the channel that opened the session, and only
there. ``ExecSession`` rows keep who, when, how long and how it ended; never keystrokes or
output.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import datetime

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from hub.leases.models import ExecSession, Lease
from hub.suppliers.models import Host
from supplier_agent.protocol import (
    ExecClose,
    ExecInput,
    ExecOpen,
    ExecResize,
    Ping,
    encode,
)

# A one-shot command's output kept for its answer: the last this many characters.
MAX_COMMAND_OUTPUT = 1024 * 1024
MAX_COMMAND_TIMEOUT_S = 3600

# Channel-layer event types (the consumers' handler names: "agent.exec" -> agent_exec).
TO_AGENT = "agent.exec"
OUTPUT = "terminal.output"
EXIT = "terminal.exit"
PONG = "terminal.pong"

# A renter's ping rides the agent protocol's ping with this nonce: "exec:<session id>:<theirs>".
# The agent answers every ping the same way; the prefix tells the hub's socket whose it is.
PING_PREFIX = "exec:"
MAX_PING_NONCE = 32


class TerminalRefused(Exception):
    """No session; the message is fit to show the person who asked."""


@dataclass(frozen=True)
class Opened:
    session_id: str
    lease_id: str
    host_channel: str


def open_session(user_id: int, lease_id: str, via: str, command: tuple[str, ...] = ()) -> Opened:
    """Record a new session of ``user_id`` in their own running lease. Staff get no way in
    here: a renter's container is theirs (admins use `manage.py hub lease exec`, which records
    the admin as the user)."""
    row = (
        Lease.objects.filter(pk=lease_id, renter_id=user_id)
        .values_list("state", "host__status", "host__channel_name")
        .first()
    )
    if row is None:
        # The same answer for another renter's lease as for none at all.
        raise TerminalRefused("no such rental of yours")
    state, host_status, channel = row
    if state != Lease.State.RUNNING:
        raise TerminalRefused(f"the rental is {state}: a terminal needs it running")
    if host_status != Host.Status.ONLINE or not channel:
        raise TerminalRefused(
            "the rental's host is not connected to the hub right now; try again in a minute"
        )
    session = ExecSession.objects.create(
        lease_id=lease_id, user_id=user_id, via=via, command=list(command)
    )
    return Opened(session_id=str(session.id), lease_id=str(lease_id), host_channel=channel)


def open_as_admin(admin_id: int, lease_id: str, command: tuple[str, ...]) -> Opened:
    """The admin CLI's way in (any running lease), recorded under the admin's name."""
    lease = Lease.objects.select_related("host").filter(pk=lease_id).first()
    if lease is None:
        raise TerminalRefused(f"no lease {lease_id}")
    if lease.state != Lease.State.RUNNING:
        raise TerminalRefused(f"the lease is {lease.state}, not running")
    if lease.host.status != Host.Status.ONLINE or not lease.host.channel_name:
        raise TerminalRefused("the lease's host is not connected to this hub")
    session = ExecSession.objects.create(
        lease=lease, user_id=admin_id, via=ExecSession.Via.CLI, command=list(command)
    )
    return Opened(str(session.id), str(lease.pk), lease.host.channel_name)


def note_closed(session_id: str, *, exit_code: int | None = None, reason: str = "") -> None:
    """The end of a session, from whichever side saw it first: the renter leaving, the agent's
    ``exec_exit``, the host's connection closing. The first end time and reason stay; an exit
    code is kept whenever it comes."""
    now: datetime = timezone.now()
    ExecSession.objects.filter(pk=session_id).update(
        closed_at=Coalesce(F("closed_at"), Value(now)),
        exit_code=Coalesce(F("exit_code"), Value(exit_code)),
    )
    if reason:
        ExecSession.objects.filter(pk=session_id, end_reason="").update(end_reason=reason[:300])


def new_session_id() -> str:
    return str(uuid.uuid4())


# --- frames and events -------------------------------------------------------------------------


def open_event(
    opened: Opened, reply_to: str, *, command: tuple[str, ...] = (), tty: bool, cols: int, rows: int
) -> dict[str, str]:
    frame = ExecOpen(
        session_id=opened.session_id,
        lease_id=opened.lease_id,
        command=command or None,
        tty=tty,
        cols=cols,
        rows=rows,
    )
    return {
        "type": TO_AGENT,
        "session_id": opened.session_id,
        "reply_to": reply_to,
        "frame": encode(frame),
    }


def input_event(session_id: str, data: str) -> dict[str, str]:
    frame = encode(ExecInput(session_id=session_id, data=data))
    return {"type": TO_AGENT, "session_id": session_id, "frame": frame}


def resize_event(session_id: str, cols: int, rows: int) -> dict[str, str]:
    frame = encode(ExecResize(session_id=session_id, cols=cols, rows=rows))
    return {"type": TO_AGENT, "session_id": session_id, "frame": frame}


def ping_event(session_id: str, nonce: str) -> dict[str, str]:
    """A round trip to the agent through the session's own path (the keystrokes' sockets and
    the agent's receive loop), without the container: the terminal shows it as its latency."""
    frame = encode(Ping(nonce=f"{PING_PREFIX}{session_id}:{nonce}"))
    return {"type": TO_AGENT, "session_id": session_id, "frame": frame}


def ping_nonce(value: object) -> str | None:
    """A client's ping nonce, if it is one: short, printable ASCII letters, digits, - and _."""
    if (
        isinstance(value, str)
        and 0 < len(value) <= MAX_PING_NONCE
        and value.isascii()
        and value.replace("-", "").replace("_", "").isalnum()
    ):
        return value
    return None


def pong_session(nonce: str) -> tuple[str, str] | None:
    """(session id, the client's nonce) of a pong answering ``ping_event``, else None."""
    if not nonce.startswith(PING_PREFIX):
        return None
    session_id, sep, theirs = nonce[len(PING_PREFIX) :].partition(":")
    return (session_id, theirs) if sep else None


def close_event(session_id: str) -> dict[str, str]:
    frame = encode(ExecClose(session_id=session_id))
    return {"type": TO_AGENT, "session_id": session_id, "frame": frame}


def clean_text(value: object, limit: int) -> str | None:
    """Text from a browser or API client as the protocol carries it: a string of at most
    ``limit`` UTF-8 bytes, lone surrogates (valid in JSON, not in UTF-8) replaced."""
    if not isinstance(value, str):
        return None
    text = value.encode("utf-8", "replace").decode("utf-8")
    if len(text.encode("utf-8")) > limit:
        return None
    return text


# --- one-shot commands (the API's exec, the admin CLI) ----------------------------------------


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None
    output: str  # stdout and stderr as they came, the tail if longer than MAX_COMMAND_OUTPUT
    truncated: bool
    error: str | None  # why there is no exit code (refused on the host, timed out, cut off)
    timed_out: bool = False


async def run_command(
    opened: Opened, command: tuple[str, ...], *, timeout_s: float
) -> CommandResult:
    """Run ``command`` (no TTY) in the session's lease and wait for its end; past ``timeout_s``
    the process is ended and the answer says so. Async: the wait holds no thread."""
    layer = get_channel_layer()
    reply = await layer.new_channel()
    await layer.send(
        opened.host_channel,
        open_event(opened, reply, command=command, tty=False, cols=80, rows=24),
    )
    parts: list[str] = []
    kept = 0
    truncated = False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        left = deadline - loop.time()
        try:
            if left <= 0:
                raise TimeoutError
            event = await asyncio.wait_for(layer.receive(reply), left)
        except TimeoutError:
            await layer.send(opened.host_channel, close_event(opened.session_id))
            why = f"the command was still running after {timeout_s:g} s and was ended"
            await sync_to_async(note_closed)(opened.session_id, reason=why)
            return CommandResult(None, "".join(parts), truncated, why, timed_out=True)
        if event.get("type") == OUTPUT:
            parts.append(event["data"])
            kept += len(event["data"])
            while kept > MAX_COMMAND_OUTPUT and len(parts) > 1:
                kept -= len(parts.pop(0))
                truncated = True
            if kept > MAX_COMMAND_OUTPUT:
                parts[0] = parts[0][kept - MAX_COMMAND_OUTPUT :]
                kept, truncated = MAX_COMMAND_OUTPUT, True
        elif event.get("type") == EXIT:
            return CommandResult(
                event.get("exit_code"), "".join(parts), truncated, event.get("error")
            )
