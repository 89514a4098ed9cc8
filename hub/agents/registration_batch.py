"""Registrations, batched per web process: group commit, as heartbeat_batch does for Redis.

A reconnect storm brings thousands of registrations at once. One at a time, each is about ten
database round trips and a commit, and on a loaded 2-core machine a round trip is 1-3 ms: a web
process's threads spent their time waiting, and registration ran at 20-70 a second
(docs/benchmarks.md). Here every registration that arrives while a batch is in flight joins
the next one, and a batch is a handful of set-based statements whatever its size
(registration.register_many). Quiet, a registration is a batch of one, as fast as before.

When a batch's turn comes, the requests whose client has already gone (it gave up waiting,
or Daphne's handshake timeout closed it) are dropped there, unanswered and unwritten.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

from hub.agents import registration
from hub.lib import local_channels

log = logging.getLogger(__name__)

# Registrations in one batch at most: a batch's statements grow with it (one row of VALUES per
# host), and its answer waits for all of it.
BATCH_MAX = 200
# Batches in flight per process at most; the agent sockets' other queries (acks, the token
# checks of new sockets) keep the rest of the database threads.
IN_FLIGHT_MAX = 2


class ClientLeft(Exception):
    """The client closed its socket while its registration waited for a batch."""


# Registrations skipped because their client had left (per process; the bench reads it).
dropped = 0

RunInThread = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]


class _Batcher:
    """One per event loop: the registrations waiting for the next batch."""

    def __init__(self) -> None:
        self._waiting: list[
            tuple[registration.Request, Callable[[], bool], asyncio.Future[Any]]
        ] = []
        self._in_flight = 0

    async def register(
        self,
        request: registration.Request,
        client_left: Callable[[], bool],
        run_in_thread: RunInThread,
    ) -> registration.Registered:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, client_left, future))
        self._start(run_in_thread)
        result: registration.Registered = await future
        return result

    def _start(self, run_in_thread: RunInThread) -> None:
        while self._waiting and self._in_flight < IN_FLIGHT_MAX:
            batch, self._waiting = self._waiting[:BATCH_MAX], self._waiting[BATCH_MAX:]
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._run(batch, run_in_thread))

    async def _run(
        self,
        batch: list[tuple[registration.Request, Callable[[], bool], asyncio.Future[Any]]],
        run_in_thread: RunInThread,
    ) -> None:
        global dropped
        try:
            wanted = []
            for request, client_left, future in batch:
                if client_left():
                    dropped += 1
                    future.set_exception(ClientLeft())
                else:
                    wanted.append((request, future))
            if wanted:
                result = await run_in_thread(registration.register_many)(
                    [request for request, _ in wanted]
                )
                for (_, future), outcome in zip(wanted, result.outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
                if result.superseded:
                    # Not part of the batch's turn: the next batch need not wait for it.
                    asyncio.get_running_loop().create_task(_tell_superseded(result.superseded))
        except Exception as exc:  # every waiter learns it; each socket answers for itself
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self._in_flight -= 1
            self._start(run_in_thread)


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


_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Batcher] = (
    weakref.WeakKeyDictionary()
)


async def register(
    request: registration.Request, client_left: Callable[[], bool], run_in_thread: RunInThread
) -> registration.Registered:
    """``register_host`` for one socket, in the next batch; ClientLeft if its client goes
    before the batch starts; RegistrationRefused (or another error) as ``register_host``."""
    loop = asyncio.get_running_loop()
    batcher = _batchers.get(loop)
    if batcher is None:
        batcher = _batchers[loop] = _Batcher()
    return await batcher.register(request, client_left, run_in_thread)
