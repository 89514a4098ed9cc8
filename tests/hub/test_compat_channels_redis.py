"""The channels_redis internals hub.lib.compat_channels_redis and hub.lib.channel_send rely on.

A failure names what changed; re-check hub/lib/compat_channels_redis.py (and channel_send's
loop thread) when the channels-redis pin (requirements/hub.txt) moves. No Redis is needed:
the layer's clients connect lazily.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import channels_redis
import pytest
import redis.asyncio
from channels_redis import utils as channels_redis_utils
from channels_redis.core import RedisChannelLayer

from hub.lib.compat_channels_redis import layer_redis, receive_left_waiting

# Nothing listens here: nothing in these tests sends a command.
UNUSED_REDIS = "redis://127.0.0.1:1/0"


def _recheck(what: str) -> str:
    return (
        f"channels-redis {channels_redis.__version__}: {what} changed; re-check "
        "hub/lib/compat_channels_redis.py and hub/lib/channel_send.py"
    )


def _client_on_new_loop(layer: RedisChannelLayer) -> tuple[asyncio.AbstractEventLoop, Any, Any]:
    loop = asyncio.new_event_loop()

    async def twice() -> tuple[Any, Any]:
        return layer_redis(layer), layer_redis(layer)

    first, second = loop.run_until_complete(twice())
    return loop, first, second


def test_connection_still_takes_a_host_index_and_gives_an_asyncio_redis_client() -> None:
    assert list(inspect.signature(RedisChannelLayer.connection).parameters) == [
        "self",
        "index",
    ], _recheck("RedisChannelLayer.connection's signature")
    layer = RedisChannelLayer(hosts=[UNUSED_REDIS])
    loop, client, _ = _client_on_new_loop(layer)
    try:
        assert isinstance(client, redis.asyncio.Redis), _recheck("RedisChannelLayer.connection")
    finally:
        loop.close()


def test_the_layer_keeps_one_client_per_event_loop_and_drops_it_when_the_loop_closes() -> None:
    # hub.lib.channel_send exists because of this: a new loop per send meant a new client.
    assert callable(getattr(channels_redis_utils, "_wrap_close", None)), _recheck(
        "channels_redis.utils._wrap_close"
    )
    layer = RedisChannelLayer(hosts=[UNUSED_REDIS])
    assert isinstance(getattr(layer, "_layers", None), dict), _recheck("RedisChannelLayer._layers")
    loop_a, first, again = _client_on_new_loop(layer)
    loop_b, other, _ = _client_on_new_loop(layer)
    try:
        assert first is again, _recheck("one client per loop (reuse within a loop)")
        assert first is not other, _recheck("one client per loop (none shared across loops)")
        assert set(layer._layers) == {loop_a, loop_b}, _recheck("RedisChannelLayer._layers keys")
    finally:
        loop_a.close()
    # channel_send relies on loop.close() flushing that loop's pools (channels_redis wraps it).
    assert set(layer._layers) == {loop_b}, _recheck("loop.close() no longer drops the loop's pools")
    loop_b.close()
    assert layer._layers == {}


def test_a_receive_left_waiting_when_its_loop_stops_is_still_counted() -> None:
    # tests/conftest.py resets the layer after a test that leaves this state behind.
    layer = RedisChannelLayer(hosts=[UNUSED_REDIS])
    assert not receive_left_waiting(layer)

    async def never() -> Any:
        await asyncio.Event().wait()

    layer.receive_single = lambda channel: never()  # a Redis that never answers
    channel = f"specific.{layer.client_prefix}!abc"
    first, other = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        task = first.create_task(layer.receive(channel))
        first.run_until_complete(asyncio.sleep(0.01))
        # The loop stops under the waiting receive, as a test's may.
        assert not task.done()
        assert receive_left_waiting(layer), _recheck("RedisChannelLayer.receive_count")
        with pytest.raises(RuntimeError, match="event loop"):
            other.run_until_complete(asyncio.wait_for(layer.receive(channel), timeout=5))
        task.cancel()
        first.run_until_complete(asyncio.gather(task, return_exceptions=True))
        assert not receive_left_waiting(layer), _recheck("a cancelled receive's clean-up")
    finally:
        first.close()
        other.close()
