"""The Channels layer the hub uses: channels_redis's, with a receive that waits out Redis.

channels_redis raises from ``receive()`` when Redis cannot be reached, and Channels' consumer
lets that end the consumer: every agent socket of a web process closed with 1011 on a Redis
blip, and the fleet reconnected into a hub whose Redis was still away. Here a consumer's receive
waits with backoff and carries on when Redis is back; the socket stays up meanwhile (heartbeats
fall back to Postgres, see hub.agents.consumer). Only the public ``receive`` is overridden:
channels_redis releases its receive lock and buffers before it raises, so a retry starts clean.

Its pool per event loop is bounded here (issue 18): ``max_connections`` (CONFIG, default 2)
connections at most, waited for rather than opened beyond that. redis-py's own pool opens one
more for every concurrent command and keeps them all; in the web process one is held by the
receive loop's BZPOPMIN and the other serves everything else (sends, groups, heartbeats, the
hub's own commands through hub.lib.shared_redis) one command or pipeline at a time. Each
connection is named ``<prefix>:<web|worker|beat|manage>:<pid>`` (CLIENT SETNAME).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from hub.lib.shared_redis import client_name

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.5
RETRY_CAP_S = 5.0
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


# channels_redis ships no type information: to mypy its layer is Any.
class ResilientRedisChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    _outage_logged = False

    def __init__(
        self, *args: Any, max_connections: int = 2, pool_timeout_s: float = 20.0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if max_connections < 2:
            # One is the receive loop's while it waits for a message: with one, nothing else
            # could be sent until a message came.
            raise ValueError("the channel layer's pool needs at least 2 connections")
        self.max_connections = max_connections
        self.pool_timeout_s = pool_timeout_s

    def create_pool(self, index: int) -> ConnectionPool:
        host = dict(self.hosts[index])
        address = host.pop("address", None)
        if address is None:  # a Sentinel or keyword configuration: channels_redis's own pool
            pool: ConnectionPool = super().create_pool(index)
            return pool
        # Waits up to pool_timeout_s for a free connection, then raises ConnectionError (which
        # receive() above waits out).
        return BlockingConnectionPool.from_url(
            address,
            max_connections=self.max_connections,
            timeout=self.pool_timeout_s,
            client_name=client_name(),
            **host,
        )

    async def receive(self, channel: str) -> dict[str, Any]:
        delay = RETRY_FIRST_S
        while True:
            try:
                message: dict[str, Any] = await super().receive(channel)
            except _UNREACHABLE as exc:
                if not ResilientRedisChannelLayer._outage_logged:
                    # One line per outage per process, not one per socket.
                    ResilientRedisChannelLayer._outage_logged = True
                    log.warning("Redis unreachable for the channel layer, waiting: %s", exc)
                await asyncio.sleep(delay)
                delay = min(RETRY_CAP_S, delay * 2)
                continue
            if ResilientRedisChannelLayer._outage_logged:
                ResilientRedisChannelLayer._outage_logged = False
                log.warning("Redis reachable again for the channel layer")
            return message
