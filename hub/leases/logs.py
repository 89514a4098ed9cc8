"""Live container logs on the hub: a group per lease on the channel layer, and a short backlog
in Redis for whoever opens the page later.

Chunks come from the agent's socket (``log_chunk``), are sent to the group
``lease-logs.<lease id>`` (every renter page that follows the lease is a member) and appended
to a capped Redis list. Redis holds nothing that cannot be lost: the backlog is a convenience,
the exit-time ``log_tail`` in Postgres stays the record.
"""

from __future__ import annotations

import json
from typing import Any

from channels.layers import get_channel_layer

from hub.leases.models import Lease
from hub.lib import redis_keys
from hub.lib.compat_channels_redis import layer_redis
from hub.suppliers import liveness
from supplier_agent.protocol import LogChunk

BACKLOG_CHUNKS = 200
BACKLOG_TTL_S = 24 * 3600
# The renter's page asks the agent for this many earlier lines when nothing is kept yet.
FIRST_TAIL_LINES = 100


def group_name(lease_id: str) -> str:
    return f"lease-logs.{lease_id}"


def backlog_key(lease_id: str) -> str:
    return redis_keys.key("lease-logs", str(lease_id))


def lease_on_host(lease_id: str, host_id: int) -> bool:
    return Lease.objects.filter(pk=lease_id, host_id=host_id).exists()


async def publish(chunk: LogChunk) -> None:
    """Send a chunk to the lease's followers and keep it in the backlog."""
    layer = get_channel_layer()
    entry = {"seq": chunk.seq, "data": chunk.data}
    # The channel layer's own per-event-loop pool on the same Redis (as liveness.touch).
    connection = layer_redis(layer)
    key = backlog_key(chunk.lease_id)
    async with connection.pipeline(transaction=False) as pipe:
        pipe.rpush(key, json.dumps(entry, ensure_ascii=False))
        pipe.ltrim(key, -BACKLOG_CHUNKS, -1)
        pipe.expire(key, BACKLOG_TTL_S)
        await pipe.execute()
    await layer.group_send(
        group_name(chunk.lease_id), {"type": "lease.log", "lease_id": chunk.lease_id, **entry}
    )


def _entries(raw: list[Any]) -> list[dict[str, Any]]:
    entries = []
    for item in raw:
        try:
            entry = json.loads(item)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("data"), str):
            entries.append(entry)
    return entries


async def backlog(lease_id: str) -> list[dict[str, Any]]:
    """The kept chunks, oldest first: ``{"seq": int, "data": str}``."""
    connection = layer_redis(get_channel_layer())
    return _entries(await connection.lrange(backlog_key(lease_id), 0, -1))


def backlog_text(lease_id: str) -> str:
    """The kept output as one text (synchronous, for the API)."""
    raw = liveness.sync_client().lrange(backlog_key(lease_id), 0, -1)
    return "".join(entry["data"] for entry in _entries(raw))  # type: ignore[arg-type]
