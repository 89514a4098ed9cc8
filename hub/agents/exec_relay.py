"""The agent socket's side of renters' terminals (hub/leases/terminals.py): which channel opened
each session on this connection, and where the agent's output for it may go.

Output is routed only to the channel that opened the session through this very socket, so an
agent can reach no browser but those of sessions the hub opened on it, whatever session ids it
makes up. A per-connection budget bounds what a hostile agent can push through the hub.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from hub.leases import terminals
from supplier_agent.protocol import ExecExit, ExecOutput, Pong

log = logging.getLogger(__name__)

MAX_SESSIONS = 64  # more than the agent's own cap (32): the agent refuses first
WINDOW_S = 10.0
# A terminal shows far less; the agent paces each session itself (supplier_agent.terminals).
BYTES_PER_WINDOW = 32 * 1024 * 1024
FRAMES_PER_WINDOW = 20_000


@dataclass(frozen=True)
class Delivery:
    channel: str
    event: dict[str, object]


class ExecRoutes:
    def __init__(self) -> None:
        self._routes: dict[str, str] = {}  # session id -> the channel that opened it
        self._window_started = time.monotonic()
        self._bytes = 0
        self._frames = 0
        self._warned = False

    def __len__(self) -> int:
        return len(self._routes)

    def to_agent(self, event: dict[str, str]) -> str | None:
        """The frame to send the agent for an ``agent.exec`` event, or None: an input for a
        session this connection does not hold (it ended, or the agent reconnected elsewhere)."""
        session_id = event["session_id"]
        reply_to = event.get("reply_to")
        if reply_to is not None:
            if len(self._routes) >= MAX_SESSIONS and session_id not in self._routes:
                return None
            self._routes[session_id] = reply_to
        elif session_id not in self._routes:
            return None
        return event["frame"]

    def refused_open(self, event: dict[str, str]) -> Delivery | None:
        """The answer to an open this connection could not take (too many sessions)."""
        reply_to = event.get("reply_to")
        if reply_to is None or event["session_id"] in self._routes:
            return None
        return Delivery(
            reply_to,
            {
                "type": terminals.EXIT,
                "exit_code": None,
                "error": "this host has too many terminals open; close one and try again",
            },
        )

    def from_agent(self, message: ExecOutput | ExecExit | Pong) -> Delivery | None:
        if isinstance(message, Pong):
            return self._pong(message)
        route = self._routes.get(message.session_id)
        if route is None:
            return None  # not a session of this connection: dropped unread
        if isinstance(message, ExecExit):
            del self._routes[message.session_id]
            return Delivery(
                route,
                {"type": terminals.EXIT, "exit_code": message.exit_code, "error": message.error},
            )
        if not self._within_budget(len(message.data)):
            return None
        return Delivery(route, {"type": terminals.OUTPUT, "data": message.data})

    def _pong(self, message: Pong) -> Delivery | None:
        answered = terminals.pong_session(message.nonce)
        if answered is None:
            return None
        session_id, nonce = answered
        route = self._routes.get(session_id)
        # Counted like output: an agent cannot flood a browser with made-up pongs either.
        if route is None or not self._within_budget(len(nonce)):
            return None
        return Delivery(route, {"type": terminals.PONG, "nonce": nonce})

    def _within_budget(self, size: int) -> bool:
        now = time.monotonic()
        if now - self._window_started > WINDOW_S:
            self._window_started, self._bytes, self._frames, self._warned = now, 0, 0, False
        self._bytes += size
        self._frames += 1
        within = self._bytes <= BYTES_PER_WINDOW and self._frames <= FRAMES_PER_WINDOW
        if not within and not self._warned:
            self._warned = True
            log.warning("an agent's terminal output is over its budget; dropping some")
        return within

    def drop_all(self, reason: str) -> list[tuple[str, Delivery]]:
        """The connection closed: every session ends, each opener hears why."""
        ended = [
            (sid, Delivery(channel, {"type": terminals.EXIT, "exit_code": None, "error": reason}))
            for sid, channel in self._routes.items()
        ]
        self._routes.clear()
        return ended
