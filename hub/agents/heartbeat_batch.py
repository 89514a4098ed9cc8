"""Heartbeats' Redis writes, batched: group commit per web process, and the pending telemetry
that a beat task moves to Postgres in bulk.

Each heartbeat needs its host's liveness deadline in Redis before the hub answers the next frame
on that socket. Instead of one round trip (and, under load, one pooled connection) per
heartbeat, every heartbeat of a process that arrives while a write is in flight joins the next
one: a single pipeline with one ZADD for all their deadlines and one HSET for their telemetry.
Quiet, that is the same one round trip as before; under load it is one connection and a few
pipelines a second instead of thousands of commands (docs/benchmarks.md).

Telemetry due for Postgres (on change, or every HOST_STATS_WRITE_INTERVAL_S) waits in the hash
``pending_key()``, newest per host, until ``take_pending`` hands it to the flush task. The
hub's ping-to-pong round trip to each agent (issue 20) rides the same pipelines into the hash
``rtt_key()`` and the same flush: at 10,000 agents the first round trips after a restart were
~30 row writes a second from the web process, each its own database thread hop and commit,
which cost the held heartbeat p99 (docs/benchmarks.md, issue 15).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Iterable, Mapping

from channels.layers import get_channel_layer

from hub.lib import redis_keys, redis_pipeline
from hub.lib.compat_channels_redis import layer_redis
from hub.suppliers import liveness


def pending_key() -> str:
    return redis_keys.key("host-telemetry-pending")


def rtt_key() -> str:
    return redis_keys.key("host-rtt-pending")


def pending_entry(frame: str, at: float) -> str:
    """What waits in Redis for one host: its last heartbeat frame as the agent's protocol
    encodes it, and when it arrived."""
    return json.dumps({"at": at, "frame": frame}, separators=(",", ":"))


class _GroupCommit:
    """One per event loop: the heartbeats waiting for the next pipeline."""

    def __init__(self) -> None:
        self._deadlines: dict[str, float] = {}
        self._pending: dict[str, str] = {}
        self._rtts: dict[str, int] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, host_id: int, deadline: float, pending: str | None) -> None:
        self._deadlines[str(host_id)] = deadline
        if pending is not None:
            self._pending[str(host_id)] = pending
        await self._next_write()

    async def record_rtt(self, host_id: int, rtt_ms: int) -> None:
        self._rtts[str(host_id)] = rtt_ms
        await self._next_write()

    async def _next_write(self) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write())
        await waiter

    async def _write(self) -> None:
        while self._waiters:
            deadlines, pending, rtts = self._deadlines, self._pending, self._rtts
            waiters = self._waiters
            self._deadlines, self._pending, self._rtts, self._waiters = {}, {}, {}, []
            commands: list[redis_pipeline.Command] = []
            if deadlines:
                scored = _flat((score, host) for host, score in deadlines.items())
                commands.append(("ZADD", liveness.liveness_key(), *scored))
            if pending:
                commands.append(("HSET", pending_key(), *_flat(pending.items())))
            if rtts:
                commands.append(("HSET", rtt_key(), *_flat(rtts.items())))
            try:
                # The channel layer's own pool on the same Redis: no second pool per process,
                # and it is closed with its loop. One writer at a time: one connection.
                # redis_pipeline: without redis-py's Pipeline object, 10 % less CPU per write
                # (docs/benchmarks.md, issue 15).
                await redis_pipeline.send(
                    layer_redis(get_channel_layer()).connection_pool, commands
                )
            except Exception as exc:  # every waiter learns it; the caller decides
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
            else:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)


def _flat(pairs: Iterable[tuple[str | float, str | float]]) -> list[str | float]:
    """Pairs as one argument list: ZADD's score member ..., HSET's field value ..."""
    return [item for pair in pairs for item in pair]


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _GroupCommit] = (
    weakref.WeakKeyDictionary()
)


async def record(host_id: int, deadline: float, pending: str | None = None) -> None:
    """Store the host's new liveness deadline (and its telemetry, if due for Postgres); returns
    once Redis has both. Raises RedisError when Redis cannot be written."""
    await _group_commit().record(host_id, deadline, pending)


def _group_commit() -> _GroupCommit:
    loop = asyncio.get_running_loop()
    batch = _per_loop.get(loop)
    if batch is None:
        batch = _per_loop[loop] = _GroupCommit()
    return batch


async def record_rtt(host_id: int, rtt_ms: int) -> None:
    """Store the host's round trip for the flush task (which writes it to Postgres, many hosts
    per statement); returns once Redis has it. Raises RedisError when Redis cannot be written."""
    await _group_commit().record_rtt(host_id, rtt_ms)


# --- the flush side (sync: the beat task) -----------------------------------------------------


def _take(key: str) -> dict[bytes, bytes]:
    """A hash's every field, removed from Redis atomically: what arrives meanwhile waits for
    the next flush."""
    pipe = liveness.sync_client().pipeline(transaction=True)
    pipe.hgetall(key)
    pipe.delete(key)
    entries, _ = pipe.execute()
    return entries  # type: ignore[no-any-return]


def _give_back(key: str, entries: Mapping[int, str | int]) -> None:
    """What a flush could not write goes back, unless a newer value for the host came in."""
    if not entries:
        return
    pipe = liveness.sync_client().pipeline(transaction=False)
    for host_id, value in entries.items():
        pipe.hsetnx(key, str(host_id), value)
    pipe.execute()


def take_pending() -> dict[int, str]:
    """Every host's pending telemetry."""
    return {int(host): value.decode() for host, value in _take(pending_key()).items()}


def give_back(entries: Mapping[int, str]) -> None:
    _give_back(pending_key(), entries)


def take_rtts() -> dict[int, int]:
    """Every host's pending round trip."""
    taken: dict[int, int] = {}
    for host, value in _take(rtt_key()).items():
        try:
            taken[int(host)] = int(value)
        except ValueError:
            continue  # not one of ours: nothing to write
    return taken


def give_back_rtts(rtts: Mapping[int, int]) -> None:
    _give_back(rtt_key(), rtts)
