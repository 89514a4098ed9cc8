"""The dashboard's live socket: pushes the signed-in person's lease and host states.

The consumer polls Postgres (the only source of truth) about once a second and sends a
snapshot only when it changed; the page's script then refreshes the fragments that changed
(htmx). Polling keeps the lease and supplier services free of any dashboard hook, and one
indexed query per open page per second is cheap. The route is wrapped in Channels' origin
validator and session auth (hub/routing.py); anonymous sockets are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db.models import Max

from hub.leases.models import Lease
from hub.suppliers.models import Host
from hub.tunnels.models import Tunnel

POLL_INTERVAL_S = 1.0
RECENT_LEASES = 50
CLOSE_UNAUTHENTICATED = 4401


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
        .annotate(stats_at=Max("gpus__stats_updated_at"))
        .values_list("pk", "status", "maintenance", "agent_version", "last_seen_at", "stats_at")
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
                "sig": f"{status}|{maintenance}|{version}|{seen}|{stats_at}",
            }
            for pk, status, maintenance, version, seen, stats_at in hosts
        },
    }


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_id = user.pk
        self.poller: asyncio.Task[None] | None = None
        await self.accept()
        self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code: int) -> None:
        poller = getattr(self, "poller", None)
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The page sends nothing that matters; a ping gets the current picture at once."""
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json(await database_sync_to_async(snapshot)(self.user_id))

    async def _poll(self) -> None:
        last: dict[str, Any] | None = None
        interval = getattr(settings, "DASHBOARD_POLL_INTERVAL_S", POLL_INTERVAL_S)
        while True:
            current = await database_sync_to_async(snapshot)(self.user_id)
            if current != last:
                await self.send_json(current)
                last = current
            await asyncio.sleep(interval)
