"""One renter's terminal as a WebSocket (the lease page's, and the API's): opens the session
(hub/leases/terminals.py), relays keystrokes and window sizes to the host's agent through the
channel layer, and the agent's output back. Subclasses say who the person is.

Client -> hub, JSON text frames: ``{"type": "input", "data": "ls\\r"}``,
``{"type": "resize", "cols": 120, "rows": 40}``, ``{"type": "ping", "nonce": "7"}`` (up to 32
letters, digits, ``-``, ``_``). Hub -> client: ``{"type": "output", "data": ...}`` as the process
writes, ``{"type": "pong", "nonce": "7"}`` once the agent itself answered the ping (the round
trip to the host, the container left out), then one ``{"type": "exit", "exit_code": 0 | null,
"error": null | "why"}`` and the close. Closing the socket ends the session's process.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from hub.leases import terminals
from hub.lib import local_channels
from supplier_agent.protocol import MAX_EXEC_DATA_BYTES, MAX_TERMINAL_COLS, MAX_TERMINAL_ROWS

log = logging.getLogger(__name__)

CLOSE_REFUSED = 4403
CLOSE_TOO_FAST = 4429
# Typing is a few frames a second and a paste one frame; this is far above both.
MAX_FRAMES_PER_WINDOW = 2000
MAX_BYTES_PER_WINDOW = 1024 * 1024
WINDOW_S = 10.0


def _size(query: bytes) -> tuple[int, int]:
    """The terminal's first size from ``?cols=..&rows=..`` (80x24 when absent or odd)."""
    values: dict[str, int] = {}
    for part in query.decode("latin-1").split("&"):
        name, _, value = part.partition("=")
        if name in ("cols", "rows") and value.isdigit() and len(value) <= 4:
            values[name] = int(value)
    cols = min(max(values.get("cols", 80), 1), MAX_TERMINAL_COLS)
    rows = min(max(values.get("rows", 24), 1), MAX_TERMINAL_ROWS)
    return cols, rows


class TerminalSocket(AsyncWebsocketConsumer):
    via = "web"
    opened: terminals.Opened | None = None
    exited = False

    async def person(self) -> int | None:
        """The user id this socket speaks for, or None (refused before the handshake)."""
        raise NotImplementedError

    async def connect(self) -> None:
        user_id = await self.person()
        if user_id is None:
            await self.close()  # before accept: a 403 at the handshake
            return
        await self.accept()
        local_channels.register(self)  # the agent's socket may be in this process too
        lease_id = str(self.scope["url_route"]["kwargs"]["lease_id"])
        try:
            self.opened = await database_sync_to_async(terminals.open_session)(
                user_id, lease_id, self.via
            )
        except terminals.TerminalRefused as exc:
            await self._finish(None, str(exc), code=CLOSE_REFUSED)
            return
        self._window_started = time.monotonic()
        self._frames = self._bytes = 0
        cols, rows = _size(self.scope.get("query_string", b""))
        await local_channels.send(
            self.channel_layer,
            self.opened.host_channel,
            terminals.open_event(self.opened, self.channel_name, tty=True, cols=cols, rows=rows),
        )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        opened = self.opened
        if opened is None or self.exited:
            return
        if self._too_fast(len(text_data or bytes_data or b"")):
            await self._finish(
                None, "too much input too fast; the session ended", code=CLOSE_TOO_FAST, ours=True
            )
            return
        try:
            message = json.loads(text_data or "")
        except ValueError:
            return  # not ours to answer: a terminal ignores what it cannot read
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "input":
            data = terminals.clean_text(message.get("data"), MAX_EXEC_DATA_BYTES)
            if data:
                await self._to_agent(terminals.input_event(opened.session_id, data))
        elif kind == "resize":
            cols, rows = message.get("cols"), message.get("rows")
            if (
                type(cols) is int
                and type(rows) is int
                and 1 <= cols <= MAX_TERMINAL_COLS
                and 1 <= rows <= MAX_TERMINAL_ROWS
            ):
                await self._to_agent(terminals.resize_event(opened.session_id, cols, rows))
        elif kind == "ping":
            nonce = terminals.ping_nonce(message.get("nonce"))
            if nonce is not None:
                await self._to_agent(terminals.ping_event(opened.session_id, nonce))

    def _too_fast(self, size: int) -> bool:
        now = time.monotonic()
        if now - self._window_started > WINDOW_S:
            self._window_started, self._frames, self._bytes = now, 0, 0
        self._frames += 1
        self._bytes += size
        return self._frames > MAX_FRAMES_PER_WINDOW or self._bytes > MAX_BYTES_PER_WINDOW

    async def _to_agent(self, event: dict[str, str]) -> None:
        assert self.opened is not None
        try:
            await local_channels.send(self.channel_layer, self.opened.host_channel, event)
        except Exception as exc:  # Redis away, or the host's queue full: this keystroke is lost
            log.info("terminal %s: not relayed: %r", self.opened.session_id, exc)

    async def disconnect(self, code: int) -> None:
        local_channels.unregister(self)
        opened = self.opened
        if opened is None or self.exited:
            return
        self.exited = True
        # The reason first: the agent's exec_exit for this close may be noted in the meantime.
        await database_sync_to_async(terminals.note_closed)(
            opened.session_id, reason="closed by the renter"
        )
        await self._to_agent(terminals.close_event(opened.session_id))

    # --- channel layer events from the agent's socket -------------------------------------

    async def terminal_output(self, event: dict[str, Any]) -> None:
        if not self.exited:
            await self.send(text_data=json.dumps({"type": "output", "data": event["data"]}))

    async def terminal_pong(self, event: dict[str, Any]) -> None:
        if not self.exited:
            await self.send(text_data=json.dumps({"type": "pong", "nonce": event["nonce"]}))

    async def terminal_exit(self, event: dict[str, Any]) -> None:
        await self._finish(event.get("exit_code"), event.get("error"), code=1000)

    async def _finish(
        self, exit_code: int | None, error: str | None, *, code: int, ours: bool = False
    ) -> None:
        """Tell the client how the session ended and close. ``ours``: this side ends it, so the
        agent must hear it too (when the agent ended it, it knows)."""
        if self.exited:
            return
        self.exited = True
        if ours and self.opened is not None:
            await self._to_agent(terminals.close_event(self.opened.session_id))
            await database_sync_to_async(terminals.note_closed)(
                self.opened.session_id, reason=error or ""
            )
        await self.send(
            text_data=json.dumps({"type": "exit", "exit_code": exit_code, "error": error})
        )
        await self.close(code=code)
