"""Registrations, batched per web process: group commit (hub/lib/group_commit.py), as
heartbeat_batch does for Redis.

A reconnect storm brings thousands of registrations at once. One at a time, each is about ten
database round trips and a commit, and on a loaded 2-core machine a round trip is 1-3 ms: a web
process's threads spent their time waiting, and registration ran at 20-70 a second
(docs/benchmarks.md). Here every registration that arrives while a batch is in flight joins
the next one, and a batch is a handful of set-based statements whatever its size
(registration.register_many). Quiet, a registration is a batch of one, as fast as before.
Requests whose client has already gone when their batch's turn comes are dropped there,
unanswered and unwritten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

from hub.agents import registration
from hub.agents.db_threads import in_db_thread
from hub.lib import group_commit, local_channels, metrics

log = logging.getLogger(__name__)

# Registrations in one batch at most: a batch's statements grow with it (one row of VALUES per
# host), and its answer waits for all of it.
BATCH_MAX = 200
# Batches in flight per process at most; the agent sockets' other queries (acks, the token
# checks of new sockets) keep the rest of the database threads.
IN_FLIGHT_MAX = 2


async def _register_batch(
    requests: list[registration.Request],
) -> list[registration.Registered | Exception]:
    result = await in_db_thread(registration.register_many)(requests)
    if result.superseded:
        # Not part of the batch's turn: the next batch need not wait for it.
        asyncio.get_running_loop().create_task(_tell_superseded(result.superseded))
    return result.outcomes


batchers: group_commit.PerLoop[
    group_commit.Batcher[registration.Request, registration.Registered]
] = group_commit.PerLoop(
    lambda: group_commit.Batcher(
        _register_batch,
        batch_max=BATCH_MAX,
        in_flight_max=IN_FLIGHT_MAX,
        on_dropped=metrics.HANDSHAKES_DROPPED.labels("register").inc,
    )
)


async def register(
    request: registration.Request, client_left: Callable[[], bool]
) -> registration.Registered:
    """``register_host`` for one socket, in the next batch; ClientLeft (hub.lib.group_commit)
    if its client goes before the batch starts; RegistrationRefused (or another error) as
    ``register_host``."""
    return await batchers.get().submit(request, client_left)


def dropped() -> int:
    """Registrations of this process skipped because their client had left."""
    return sum(batcher.dropped for batcher in batchers.all())


# Processes whose channel queue was found full: their sockets are gone (the process stopped) or
# hopelessly behind. Further notices to them are skipped for this long: in a storm every old
# channel belongs to the stopped process, and each notice was a Redis round trip.
DEAD_PROCESS_S = 60.0
_full_processes: dict[str, float] = {}


def _process_of(channel: str) -> str:
    # channels_redis names a socket's channel "specific.<process prefix>!<socket>".
    return channel.partition("!")[0]


async def _tell_superseded(channels: list[str]) -> None:
    """Best effort, as registration.tell_old_socket, one at a time (concurrent sends would each
    take a pooled Redis connection)."""
    layer = get_channel_layer()
    skipped = 0
    for channel in channels:
        process = _process_of(channel)
        now = time.monotonic()
        if _full_processes.get(process, 0.0) > now:
            skipped += 1
            continue
        try:
            await local_channels.send(layer, channel, {"type": "agent.superseded"})
        except ChannelFull:
            _full_processes[process] = now + DEAD_PROCESS_S
            skipped += 1
        except Exception as exc:  # Redis down: the old socket closes on its own
            log.info("agent.superseded not delivered to %s: %r", channel, exc)
    if skipped:
        log.info("agent.superseded skipped for %d sockets of stopped processes", skipped)
