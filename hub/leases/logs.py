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
# What a page is sent of the backlog when it subscribes: the newest chunks up to what the page
# shows at most (live.js MAX_LOG_CHARS), in frames far below Daphne's 1 MiB message limit (a
# bigger one closes the socket with 1011). 200 chunks of 16 KiB could be 3.2 MiB, and up to six
# times that JSON-escaped.
BACKLOG_PAGE_CHARS = 200_000
BACKLOG_FRAME_BYTES = 256 * 1024
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


def _escaped_size(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", errors="surrogatepass"))


def page_frames(entries: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(seq of its newest chunk, text) of the frames that carry the backlog's tail to a page,
    oldest first; whole chunks only (each at most 16 KiB, the protocol's bound)."""
    tail: list[dict[str, Any]] = []
    chars = 0
    for entry in reversed(entries):
        if tail and chars + len(entry["data"]) > BACKLOG_PAGE_CHARS:
            break
        tail.append(entry)
        chars += len(entry["data"])
    frames: list[tuple[int, str]] = []
    parts: list[str] = []
    size = seq = 0
    for entry in reversed(tail):
        cost = _escaped_size(entry["data"])
        if parts and size + cost > BACKLOG_FRAME_BYTES:
            frames.append((seq, "".join(parts)))
            parts, size = [], 0
        parts.append(entry["data"])
        size += cost
        seq = int(entry.get("seq", 0))
    if parts:
        frames.append((seq, "".join(parts)))
    return frames


async def backlog(lease_id: str) -> list[dict[str, Any]]:
    """The kept chunks, oldest first: ``{"seq": int, "data": str}``."""
    connection = layer_redis(get_channel_layer())
    return _entries(await connection.lrange(backlog_key(lease_id), 0, -1))


def backlog_text(lease_id: str) -> str:
    """The kept output as one text (synchronous, for the API)."""
    raw = liveness.sync_client().lrange(backlog_key(lease_id), 0, -1)
    return "".join(entry["data"] for entry in _entries(raw))  # type: ignore[arg-type]


def drop_backlogs(lease_ids: list[str]) -> None:
    """Delete these leases' backlogs now (synchronous, for the retention task)."""
    if lease_ids:
        liveness.sync_client().delete(*(backlog_key(pk) for pk in lease_ids))
