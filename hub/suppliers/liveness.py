"""Host liveness in Redis: one sorted-set member per host, scored by its offline deadline.

A heartbeat is a ZADD (batched per web process by heartbeat_batch), not a Postgres row update,
so 10,000 agents cost Redis a few cheap pipelines a second and Postgres nothing. Postgres keeps
a conservative copy of the deadline (written with the stats at most every
HOST_STATS_WRITE_INTERVAL_S, plus that interval), so a Redis restart only makes offline
detection late, never wrong.

That promise needs the sweep to know when Redis' deadlines cannot be trusted alone: after Redis
restarted (from an old snapshot, or empty), and after any gap in the sweep's own runs (Redis or
beat was down, so heartbeats went to Postgres only). Each sweep leaves a mark (Redis' run id and
the time); a sweep that finds no mark, another run id or a stale one holds for
HOST_OFFLINE_AFTER_S, during which a host goes offline only when Postgres' conservative deadline
has passed too (the later of the two), the pattern of Kubernetes' node controller, which stops
evicting when it cannot tell its own partition from the nodes' failure.
"""

from __future__ import annotations

from django.conf import settings

from hub.lib import redis_keys, shared_redis


def liveness_key() -> str:
    return redis_keys.key("host-liveness")


def sweep_mark_key() -> str:
    return redis_keys.key("sweep-mark")


def sweep_hold_key() -> str:
    return redis_keys.key("sweep-hold-until")


def sync_client() -> shared_redis.SyncRedis:
    """The process's one Redis pool, the channel layer's (hub.lib.shared_redis), for sync code."""
    return shared_redis.client()


def deadline_of(host_id: int) -> float | None:
    score = sync_client().zscore(liveness_key(), str(host_id))
    return None if score is None else float(score)


def overdue(now: float, limit: int) -> list[int]:
    members = sync_client().zrangebyscore(liveness_key(), "-inf", now, start=0, num=limit)
    return [int(member) for member in members]


def forget(host_id: int) -> None:
    sync_client().zrem(liveness_key(), str(host_id))


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
    return bool(sync_client().eval(_FORGET_IF_OVERDUE, 1, liveness_key(), str(host_id), repr(now)))


def redis_trusted(now: float) -> bool:
    """Whether this sweep may take Redis' deadlines alone (see the module's docstring)."""
    client = sync_client()
    run_id = str(client.info("server").get("run_id", ""))
    previous = client.getset(sweep_mark_key(), f"{run_id} {now!r}")
    gap_s = 3 * settings.SWEEP_INTERVAL_S
    continuous = False
    if previous is not None:
        previous_run, _, previous_at = previous.decode().partition(" ")
        try:
            continuous = previous_run == run_id and abs(now - float(previous_at)) <= gap_s
        except ValueError:
            continuous = False
    if not continuous:
        client.set(sweep_hold_key(), repr(now + settings.HOST_OFFLINE_AFTER_S))
        return False
    hold = client.get(sweep_hold_key())
    return hold is None or now >= float(hold)
