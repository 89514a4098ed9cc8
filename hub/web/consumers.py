"""The dashboard's live socket: pushes the signed-in person's lease and host states.

The consumer polls Postgres (the only source of truth) about once a second and sends a
snapshot only when it changed; the page's script then refreshes the fragments that changed
(htmx). Polling keeps the lease and supplier services free of any dashboard hook, and one
indexed query per open page per second is cheap. The route is wrapped in Channels' origin
validator and session auth (hub/routing.py); anonymous sockets are refused.

A page may also follow a lease's live output (``{"type": "logs.subscribe", "lease_id": ...}``):
the socket joins the lease's log group (hub/leases/logs.py), sends the kept backlog's tail in
bounded frames, and asks
the lease's agent to follow, renewing that every LOG_RENEW_S while subscribed. Unsubscribing
or closing the page just stops renewing: another page may follow the same lease, and the agent
stops on its own when nobody renews.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.sessions.models import Session
from django.db.models import Count, Max, Q
from django.utils import timezone

from hub.leases import logs as lease_logs
from hub.leases.models import Lease
from hub.suppliers.models import Host
from hub.tunnels.models import Tunnel
from supplier_agent.protocol import Logs, encode

POLL_INTERVAL_S = 1.0
RECENT_LEASES = 50
CLOSE_UNAUTHENTICATED = 4401
# Well inside the agent's LOG_FOLLOW_TTL_S (60 s): one lost renewal does not stop the stream.
LOG_RENEW_S = 30.0
MAX_LOG_SUBSCRIPTIONS = 4


def snapshot(user_id: int) -> dict[str, Any]:
    """A small, comparable picture of what this person's open pages show."""
    leases = list(
        Lease.objects.filter(renter_id=user_id)
        .order_by("-created_at")
        .values_list("pk", "state")[:RECENT_LEASES]
    )
    tunnel_states: dict[str, list[str]] = {}
    for lease_id, state in Tunnel.objects.filter(lease_id__in=[pk for pk, _ in leases]).values_list(
        "lease_id", "state"
    ):
        tunnel_states.setdefault(str(lease_id), []).append(state)
    hosts = (
        Host.objects.filter(owner_id=user_id)
        .annotate(
            stats_at=Max("gpus__stats_updated_at"),
            # A GPU rented or handed back changes what the hosts page says of it.
            rented=Count(
                "gpus__lease_gpus", filter=Q(gpus__lease_gpus__active=True), distinct=True
            ),
        )
        .values_list(
            "pk",
            "status",
            "maintenance",
            "agent_version",
            "last_seen_at",
            "stats_at",
            "rented",
            "release_stuck_since",
        )
    )
    return {
        "type": "snapshot",
        "leases": {
            str(pk): {
                "state": state,
                "sig": f"{state}|{','.join(sorted(tunnel_states.get(str(pk), [])))}",
            }
            for pk, state in leases
        },
        "hosts": {
            str(pk): {
                "status": status,
                "sig": f"{status}|{maintenance}|{version}|{seen}|{stats_at}|{rented}|{stuck}",
            }
            for pk, status, maintenance, version, seen, stats_at, rented, stuck in hosts
        },
    }


def session_is_live(session_key: str | None, user_id: int) -> bool:
    """Whether the socket's session still exists, unexpired, for the same person."""
    if not session_key:
        return False
    row = Session.objects.filter(session_key=session_key, expire_date__gt=timezone.now()).first()
    return row is not None and str(row.get_decoded().get(SESSION_KEY)) == str(user_id)


def followed_lease(user_id: int, lease_id: str) -> tuple[str, str] | None:
    """(state, agent channel) of the person's own lease; None for anyone else's."""
    row = (
        Lease.objects.filter(pk=lease_id, renter_id=user_id)
        .values_list("state", "host__channel_name")
        .first()
    )
    return None if row is None else (row[0], row[1])


def _lease_id(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_id = user.pk
        self.poller: asyncio.Task[None] | None = None
        self.log_renewers: dict[str, asyncio.Task[None]] = {}
        self.log_seen: dict[str, int] = {}  # lease id -> newest seq sent to the page
        await self.accept()
        self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code: int) -> None:
        poller = getattr(self, "poller", None)
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        for lease_id in list(getattr(self, "log_renewers", {})):
            await self._unsubscribe(lease_id)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """A ping gets the current picture at once; logs.subscribe / logs.unsubscribe follow
        a lease's output or stop."""
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        if kind == "ping":
            await self.send_json(await database_sync_to_async(snapshot)(self.user_id))
        elif kind in {"logs.subscribe", "logs.unsubscribe"}:
            lease_id = _lease_id(content.get("lease_id"))
            if lease_id is None:
                await self.send_json({"type": "error", "reason": "lease_id must be a lease id"})
            elif kind == "logs.subscribe":
                await self._subscribe(lease_id)
            else:
                await self._unsubscribe(lease_id)

    async def _subscribe(self, lease_id: str) -> None:
        found = await database_sync_to_async(followed_lease)(self.user_id, lease_id)
        if found is None:
            await self.send_json({"type": "error", "lease_id": lease_id, "reason": "no such lease"})
            return
        if lease_id in self.log_renewers:
            # Asked again (the page saw the lease start running): ask the agent now.
            await self._ask_agent(lease_id, *found, tail=0)
            return
        if len(self.log_renewers) >= MAX_LOG_SUBSCRIPTIONS:
            await self.send_json(
                {"type": "error", "lease_id": lease_id, "reason": "too many logs followed"}
            )
            return
        # Join first, then read the backlog: a chunk published in between arrives twice at
        # worst, and the seq check in lease_log drops the second copy.
        await self.channel_layer.group_add(lease_logs.group_name(lease_id), self.channel_name)
        kept = await lease_logs.backlog(lease_id)
        self.log_seen[lease_id] = max((entry.get("seq", 0) for entry in kept), default=0)
        # The first frame replaces what the page shows (it may be a reload), the rest append.
        frames = lease_logs.page_frames(kept) or [(0, "")]
        for n, (seq, data) in enumerate(frames):
            await self.send_json(
                {"type": "log", "lease_id": lease_id, "seq": seq, "data": data, "backlog": n == 0}
            )
        tail = 0 if kept else lease_logs.FIRST_TAIL_LINES
        await self._ask_agent(lease_id, *found, tail=tail)
        self.log_renewers[lease_id] = asyncio.create_task(self._renew(lease_id))

    async def _unsubscribe(self, lease_id: str) -> None:
        renewer = self.log_renewers.pop(lease_id, None)
        if renewer is None:
            return
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
        self.log_seen.pop(lease_id, None)
        await self.channel_layer.group_discard(lease_logs.group_name(lease_id), self.channel_name)

    async def _ask_agent(self, lease_id: str, state: str, channel: str, *, tail: int) -> None:
        if state != Lease.State.RUNNING or not channel:
            return  # nothing runs yet (or any more); the page asks again when it starts
        frame = encode(Logs(lease_id=lease_id, follow=True, tail=tail))
        # The agent's socket forwards agent.command frames as they are (hub/suppliers).
        await self.channel_layer.send(channel, {"type": "agent.command", "frame": frame})

    async def _renew(self, lease_id: str) -> None:
        while True:
            await asyncio.sleep(LOG_RENEW_S)
            found = await database_sync_to_async(followed_lease)(self.user_id, lease_id)
            if found is not None:
                await self._ask_agent(lease_id, *found, tail=0)

    async def lease_log(self, event: dict[str, Any]) -> None:
        lease_id = event.get("lease_id")
        seen = self.log_seen.get(lease_id)  # type: ignore[arg-type]
        if seen is None or event["seq"] <= seen:
            return
        self.log_seen[lease_id] = event["seq"]  # type: ignore[index]
        await self.send_json(
            {"type": "log", "lease_id": lease_id, "seq": event["seq"], "data": event["data"]}
        )

    async def _poll(self) -> None:
        last: dict[str, Any] | None = None
        interval = getattr(settings, "DASHBOARD_POLL_INTERVAL_S", POLL_INTERVAL_S)
        session_key = getattr(self.scope.get("session"), "session_key", None)
        while True:
            # Logging out (here or in any other tab) ends the session: the socket closes
            # within a poll instead of streaming to a signed-out page.
            if not await database_sync_to_async(session_is_live)(session_key, self.user_id):
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return
            current = await database_sync_to_async(snapshot)(self.user_id)
            if current != last:
                await self.send_json(current)
                last = current
            await asyncio.sleep(interval)
