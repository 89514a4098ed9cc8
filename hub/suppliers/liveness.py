"""Host liveness in Redis: one sorted-set member per host, scored by its offline deadline.

A heartbeat is a ZADD (batched per web process by heartbeat_batch), not a Postgres row update,
so 10,000 agents cost Redis a few cheap pipelines a second and Postgres nothing. Postgres keeps
a conservative copy of the deadline (written with the stats at most every
HOST_STATS_WRITE_INTERVAL_S, plus that interval), so a Redis restart only makes offline
detection late, never wrong.
"""

from __future__ import annotations

import redis
from django.conf import settings

LIVENESS_KEY = "cloudgpu:host-liveness"

_sync_client: redis.Redis | None = None


def sync_client() -> redis.Redis:
    global _sync_client  # one connection pool per process
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
    return _sync_client


def deadline_of(host_id: int) -> float | None:
    score = sync_client().zscore(LIVENESS_KEY, str(host_id))
    return None if score is None else float(score)


def overdue(now: float, limit: int) -> list[int]:
    members = sync_client().zrangebyscore(LIVENESS_KEY, "-inf", now, start=0, num=limit)
    return [int(member) for member in members]


def forget(host_id: int) -> None:
    sync_client().zrem(LIVENESS_KEY, str(host_id))


# Remove a member only if its deadline is still past: a heartbeat that landed between the
# sweep's read and this call must not be thrown away.
_FORGET_IF_OVERDUE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
    return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""


def forget_if_overdue(host_id: int, now: float) -> bool:
    return bool(sync_client().eval(_FORGET_IF_OVERDUE, 1, LIVENESS_KEY, str(host_id), repr(now)))
