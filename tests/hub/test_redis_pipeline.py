"""hub.lib.redis_pipeline against the real Redis: replies in order, and a connection whose
replies were not all read is never lent again (the next caller would read the last one's)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
from django.conf import settings
from redis.asyncio import BlockingConnectionPool

from hub.lib import redis_pipeline


@pytest.fixture
async def pool() -> AsyncIterator[BlockingConnectionPool]:
    # One connection only: a half-read one handed on would be the one the next send gets.
    pool = BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=1, timeout=5)
    yield pool
    await pool.disconnect()


@pytest.fixture
def key() -> str:
    return f"test:redis-pipeline:{uuid.uuid4().hex}"


async def test_each_command_gets_its_own_reply_in_order(
    pool: BlockingConnectionPool, key: str
) -> None:
    replies = await redis_pipeline.send(
        pool,
        [("ZADD", key, 1.5, "a", 2.25, "b"), ("ZSCORE", key, "b"), ("DEL", key), ("EXISTS", key)],
    )
    assert replies == [2, b"2.25", 1, 0]
    assert await redis_pipeline.send(pool, []) == []


async def test_an_error_reply_raises_and_the_next_send_reads_only_its_own_replies(
    pool: BlockingConnectionPool, key: str
) -> None:
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        # The ZADD fails, the SET and GET after it were sent and answered but never read.
        await redis_pipeline.send(
            pool, [("SET", key, "x"), ("ZADD", key, 1, "a"), ("SET", key, "y"), ("GET", key)]
        )

    assert await redis_pipeline.send(pool, [("GET", key), ("DEL", key)]) == [b"y", 1]


async def test_after_its_connection_is_killed_the_next_send_goes_through(
    pool: BlockingConnectionPool, key: str
) -> None:
    [client_id] = await redis_pipeline.send(pool, [("CLIENT", "ID")])
    killer = redis.Redis.from_url(settings.REDIS_URL)
    try:
        assert killer.client_kill_filter(_id=client_id) == 1
    finally:
        killer.close()

    # Whether this one sees the close depends on when the kernel delivers it: the pool's
    # check may reconnect first. Either way it is a RedisError, never a wrong reply.
    with contextlib.suppress(redis.exceptions.ConnectionError):
        await redis_pipeline.send(pool, [("SET", key, "lost?")])
    replies = await redis_pipeline.send(pool, [("SET", key, "z"), ("GET", key), ("DEL", key)])
    assert replies == [b"OK", b"z", 1]
