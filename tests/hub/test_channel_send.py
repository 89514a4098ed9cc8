from __future__ import annotations

import asyncio
import os
import sys
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings as django_settings

from hub.lib import channel_send
from tests.support.polling import wait_for

RECEIVE_TIMEOUT_S = 10


@pytest.fixture(autouse=True)
def fresh_loop() -> Iterator[None]:
    # Each test starts without the process's send loop, and leaves none (nor its connections).
    channel_send.close()
    yield
    channel_send.close()


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def named_layer(settings: Any) -> str:
    """The default layer, but its Redis connections carry a name of this test's own
    (CLIENT SETNAME), so the server can say how many it holds."""
    name = f"channel-send-test-{uuid.uuid4().hex}"
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": django_settings.REDIS_URL, "client_name": name}],
                "prefix": name,
            },
        }
    }
    return name


def _connection_ids(client: redis.Redis, name: str) -> list[str]:
    return [entry["id"] for entry in client.client_list() if entry.get("name") == name]


async def _receive(channel: str) -> dict[str, Any]:
    layer = get_channel_layer()
    return await asyncio.wait_for(layer.receive(channel), timeout=RECEIVE_TIMEOUT_S)


async def test_send_from_sync_code_reaches_an_async_receiver() -> None:
    layer = get_channel_layer()
    channel = await layer.new_channel()

    # A worker thread is sync code with no loop of its own, like a Celery task.
    await asyncio.to_thread(channel_send.send, channel, {"type": "test.hello", "n": 1})

    assert await _receive(channel) == {"type": "test.hello", "n": 1}


async def test_group_send_from_sync_code_reaches_every_member() -> None:
    layer = get_channel_layer()
    group = f"channel-send-test-{uuid.uuid4().hex}"
    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.group_add(group, first)
    await layer.group_add(group, second)
    try:
        await asyncio.to_thread(channel_send.group_send, group, {"type": "test.all"})

        assert await _receive(first) == {"type": "test.all"}
        assert await _receive(second) == {"type": "test.all"}
    finally:
        await layer.group_discard(group, first)
        await layer.group_discard(group, second)


def test_many_sends_reuse_one_redis_connection(named_layer: str, redis_client: redis.Redis) -> None:
    channel = f"channel-send-test.{uuid.uuid4().hex}"
    channel_send.send(channel, {"type": "test.first"})
    # A loop per call (async_to_sync) would have hung up by now: no connection left at all.
    first_ids = _connection_ids(redis_client, named_layer)
    assert len(first_ids) == 1

    for n in range(50):
        channel_send.send(channel, {"type": "test.more", "n": n})

    assert _connection_ids(redis_client, named_layer) == first_ids


def test_close_hangs_up_and_the_next_send_connects_again(
    named_layer: str, redis_client: redis.Redis
) -> None:
    channel = f"channel-send-test.{uuid.uuid4().hex}"
    channel_send.send(channel, {"type": "test.before"})
    [before] = _connection_ids(redis_client, named_layer)

    channel_send.close()

    # The server drops the client when it reads the closed socket, a moment after close().
    wait_for(
        lambda: not _connection_ids(redis_client, named_layer),
        timeout_s=5,
        interval_s=0.01,
        what="Redis to drop the layer's connection",
    )
    channel_send.send(channel, {"type": "test.after"})
    [after] = _connection_ids(redis_client, named_layer)
    assert after != before


async def test_send_inside_a_running_loop_raises_instead_of_blocking_it() -> None:
    with pytest.raises(channel_send.CalledFromEventLoop, match="await get_channel_layer"):
        channel_send.send("channel-send-test.never", {"type": "test.never"})
    with pytest.raises(channel_send.CalledFromEventLoop, match="group_send"):
        channel_send.group_send("channel-send-test-never", {"type": "test.never"})


# Python 3.12+ warns on fork() with threads running; Celery's prefork pool does exactly that.
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_sends_on_a_loop_of_its_own() -> None:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    # The parent's loop now exists; the child inherits it, but not the thread that runs it.
    channel_send.send(channel, {"type": "test.from", "who": "parent"})

    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            channel_send.send(channel, {"type": "test.from", "who": "child"}, timeout_s=5)
            status = 0
        except BaseException:
            traceback.print_exc(file=sys.stderr)
        finally:
            os._exit(status)
    # The child's send is bounded by its timeout, so this wait is too.
    _, wait_status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(wait_status) == 0
    received = [async_to_sync(_receive)(channel) for _ in range(2)]
    assert sorted(message["who"] for message in received) == ["child", "parent"]
