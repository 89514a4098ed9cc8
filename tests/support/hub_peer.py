"""A protocol peer on loopback that plays the hub's side of the agent WebSocket, for agent
tests that must not depend on the hub: a real websockets server speaking protocol v1.

It runs its own event loop in a thread, so tests drive real agent subprocesses and talk to
them synchronously: wait for a message, send a command, read the ack.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from supplier_agent.protocol import AGENT_TO_HUB, Message, ProtocolError, encode, parse_message


@dataclass(eq=False)  # identity: tests key dicts by connection
class PeerConnection:
    websocket: ServerConnection
    received: list[Message | str] = field(default_factory=list)
    closed: bool = False


class HubPeer:
    def __init__(
        self,
        token: str,
        *,
        heartbeat_interval_s: int = 1,
        behaviour: str = "welcome",  # welcome | silent | error
    ) -> None:
        self.token = token
        self.heartbeat_interval_s = heartbeat_interval_s
        self.behaviour = behaviour
        self.desired_claims: list[str] | None = None  # None: keep whatever the agent reports
        self.connections: list[PeerConnection] = []
        # Served at /agent/release.json when set, as the hub serves its release (an agent's
        # own upgrade fetches it from its hub's URL).
        self.release_json: str | None = None
        self.rejected_handshakes = 0
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> HubPeer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self._server = await serve(
            self._handle, "127.0.0.1", 0, process_request=self._check_token, compression=None
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def _check_token(self, connection: ServerConnection, request: Any) -> Any:
        if request.path == "/agent/release.json" and self.release_json is not None:
            return connection.respond(200, self.release_json)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            with self._cond:
                self.rejected_handshakes += 1
                self._cond.notify_all()
            return connection.respond(403, "token rejected\n")
        return None

    async def _handle(self, websocket: ServerConnection) -> None:
        conn = PeerConnection(websocket)
        with self._cond:
            self.connections.append(conn)
            self._cond.notify_all()
        try:
            async for frame in websocket:
                try:
                    message: Message | str = parse_message(frame, allowed=AGENT_TO_HUB)
                except ProtocolError as exc:
                    message = f"invalid: {exc}"
                with self._cond:
                    conn.received.append(message)
                    self._cond.notify_all()
                if getattr(message, "TYPE", None) == "register":
                    await self._answer_register(websocket, message)  # type: ignore[arg-type]
        except ConnectionClosed:
            pass
        finally:
            with self._cond:
                conn.closed = True
                self._cond.notify_all()

    async def _answer_register(self, websocket: ServerConnection, register: Any) -> None:
        if self.behaviour == "silent":
            return
        if self.behaviour == "error":
            await websocket.send(json.dumps({"type": "error", "v": 1, "reason": "host banned"}))
            return
        desired = (
            [claim.lease_id for claim in register.claims]
            if self.desired_claims is None
            else self.desired_claims
        )
        welcome = {
            "type": "welcome",
            "v": 1,
            "host_id": f"host-{register.agent_id[:8]}",
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "desired_claims": desired,
        }
        await websocket.send(json.dumps(welcome))

    # --- test-side API (called from the test thread) ----------------------------------------

    def wait(self, predicate: Callable[[], Any], timeout_s: float = 30.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                result = predicate()
                if result:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
                self._cond.wait(remaining)

    def wait_for_connection(self, count: int = 1, timeout_s: float = 30.0) -> PeerConnection:
        return self.wait(
            lambda: len(self.connections) >= count and self.connections[count - 1],
            timeout_s,
            f"connection #{count}",
        )

    def wait_for(
        self,
        conn: PeerConnection,
        kind: str,
        match: Callable[[Any], bool] = lambda m: True,
        timeout_s: float = 30.0,
    ) -> Any:
        def found() -> Any:
            return next(
                (m for m in conn.received if getattr(m, "TYPE", None) == kind and match(m)),
                None,
            )

        return self.wait(found, timeout_s, f"a {kind} message")

    def send(self, conn: PeerConnection, payload: dict[str, Any] | str | Message) -> None:
        if isinstance(payload, Message):
            text = encode(payload)
        elif isinstance(payload, dict):
            text = json.dumps({"v": 1, **payload})
        else:
            text = payload
        asyncio.run_coroutine_threadsafe(conn.websocket.send(text), self._loop).result(timeout=30)

    def command(
        self, conn: PeerConnection, kind: str, lease_id: str, epoch: int, **fields: Any
    ) -> Any:
        """Send a command and wait for its ack."""
        command_id = fields.pop("command_id", None) or str(uuid.uuid4())
        self.send(
            conn,
            {
                "type": kind,
                "command_id": command_id,
                "lease_id": lease_id,
                "epoch": epoch,
                **fields,
            },
        )
        return self.wait_for(conn, "ack", lambda m: m.command_id == command_id, timeout_s=120)

    def drop(self, conn: PeerConnection) -> None:
        asyncio.run_coroutine_threadsafe(conn.websocket.close(), self._loop).result(timeout=30)
