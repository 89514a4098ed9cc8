"""The Channels layer the hub uses: channels_redis's, with a receive that waits out Redis.

channels_redis raises from ``receive()`` when Redis cannot be reached, and Channels' consumer
lets that end the consumer: every agent socket of a web process closed with 1011 on a Redis
blip, and the fleet reconnected into a hub whose Redis was still away. Here a consumer's receive
waits with backoff and carries on when Redis is back; the socket stays up meanwhile (heartbeats
fall back to Postgres, see hub.agents.consumer). Only the public ``receive`` is overridden:
channels_redis releases its receive lock and buffers before it raises, so a retry starts clean.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from channels_redis.core import RedisChannelLayer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.5
RETRY_CAP_S = 5.0
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)


# channels_redis ships no type information: to mypy its layer is Any.
class ResilientRedisChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    _outage_logged = False

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
