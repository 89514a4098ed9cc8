"""The process's one Redis pool (hub.lib.shared_redis, hub.lib.channel_layer): the channel
layer's pool is bounded and waits instead of opening more; sync code's commands, pipelines and
the Django cache run on it and answer as redis-py's sync client does. Real Redis."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
import redis
from django.conf import settings
from django.core.cache import caches
from redis.exceptions import TimeoutError as RedisTimeoutError

from hub.lib import shared_redis
from hub.lib.channel_layer import ResilientRedisChannelLayer
from hub.lib.compat_channels_redis import layer_redis
from tests.support.polling import wait_for


def _plain() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def _named(client: redis.Redis, name: str) -> list[dict[str, str]]:
    return [c for c in client.client_list() if c.get("name") == name]


def test_process_roles_name_the_connections() -> None:
    assert shared_redis.process_role(["/x/hub/serve.py", "-p", "8000"]) == "web"
    assert shared_redis.process_role(["/x/celery/__main__.py", "-A", "hub", "worker"]) == "worker"
    assert shared_redis.process_role(["/x/celery/__main__.py", "-A", "hub", "beat"]) == "beat"
    assert shared_redis.process_role(["manage.py", "hub", "lease", "show", "x"]) == "manage"


async def test_a_burst_waits_for_the_pools_two_connections_instead_of_opening_more() -> None:
    layer = ResilientRedisChannelLayer(hosts=[settings.REDIS_URL], prefix=uuid.uuid4().hex)
    client = layer_redis(layer)
    pool = client.connection_pool
    assert pool.max_connections == 2
    name = shared_redis.client_name()
    key = f"test-shared-redis:{uuid.uuid4().hex}"
    empty = f"{key}:empty"
    plain = _plain()
    try:
        before = len(await asyncio.to_thread(_named, plain, name))
        # Both connections held (as the receive loop holds one in BZPOPMIN) ...
        held = [asyncio.create_task(client.blpop([empty], timeout=2)) for _ in range(2)]

        def both_held() -> bool:
            blocked = [c for c in _named(plain, name) if c["cmd"] == "blpop"]
            return len(blocked) == 2

        await asyncio.to_thread(wait_for, both_held, timeout_s=10, what="two BLPOPs held")
        # ... twenty more commands wait for one to come back instead of connecting.
        burst = [asyncio.create_task(client.incr(key)) for _ in range(20)]
        during = len(await asyncio.to_thread(_named, plain, name))
        assert during <= before + 2
        assert not any(task.done() for task in burst)
        await asyncio.gather(*held)
        assert sorted(await asyncio.gather(*burst)) == list(range(1, 21))
        assert len(await asyncio.to_thread(_named, plain, name)) <= before + 2
    finally:
        await asyncio.to_thread(plain.delete, key)
        plain.close()
        await client.aclose()


def test_sync_commands_and_pipelines_answer_as_the_sync_client_does() -> None:
    client = shared_redis.client()
    plain = _plain()
    key = f"test-shared-redis:{uuid.uuid4().hex}"
    try:
        assert client.zadd(key, {"7": 12.5}) == 1
        assert client.zscore(key, "7") == plain.zscore(key, "7") == 12.5
        assert client.zrangebyscore(key, "-inf", 20, start=0, num=5) == [b"7"]
        with client.pipeline(transaction=False) as pipe:
            pipe.zcard(key)
            pipe.zcount(key, "-inf", 10)
            assert pipe.execute() == [1, 0]
        pipe = client.pipeline(transaction=True)
        pipe.incr(f"{key}:n")
        pipe.expire(f"{key}:n", 60)
        assert pipe.execute() == [1, True]
        assert client.getset(f"{key}:s", "a b") is None
        assert client.get(f"{key}:s") == b"a b"
        assert client.eval("return redis.call('ZCARD', KEYS[1])", 1, key) == 1
        assert client.info("server")["run_id"] == plain.info("server")["run_id"]
        assert sorted(client.scan_iter(match=f"{key}*")) == sorted(plain.scan_iter(match=f"{key}*"))
    finally:
        plain.delete(key, f"{key}:n", f"{key}:s")
        plain.close()


def test_a_call_that_outlasts_its_timeout_raises_redis_timeout_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Callers catch RedisError for "Redis is away", as they did with the sync client's timeout.
    monkeypatch.setattr(shared_redis, "CALL_TIMEOUT_S", 0.2)
    with pytest.raises(RedisTimeoutError):
        shared_redis.client().blpop([f"test-shared-redis:{uuid.uuid4().hex}"], timeout=2)


def test_the_django_cache_runs_on_the_shared_pool() -> None:
    cache = caches["default"]
    assert isinstance(cache, shared_redis.SharedRedisCache)
    assert cache._cache.get_client(write=True) is shared_redis.client()
    key = f"test-shared-redis-{uuid.uuid4().hex}"
    assert cache.add(key, 1, timeout=60)
    assert not cache.add(key, 5, timeout=60)
    assert cache.incr(key) == 2
    cache.set_many({f"{key}-a": {"x": 1}, f"{key}-b": "y"}, timeout=60)
    assert cache.get_many([f"{key}-a", f"{key}-b"]) == {f"{key}-a": {"x": 1}, f"{key}-b": "y"}
    assert cache.touch(key, 30)
    cache.delete_many([key, f"{key}-a", f"{key}-b"])
    assert cache.get(key) is None


def test_sync_calls_from_threads_share_one_connection_per_loop() -> None:
    # The web process's views and database threads all submit to one loop: its pool (here
    # channel_send's own loop) serves them without a connection per thread.
    client = shared_redis.client()
    key = f"test-shared-redis:{uuid.uuid4().hex}"
    plain = _plain()
    try:
        client.incr(key)  # the loop's pool is made
        before = len(_named(plain, shared_redis.client_name()))
        threads = [threading.Thread(target=lambda: client.incr(key)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert plain.get(key) == b"9"
        assert len(_named(plain, shared_redis.client_name())) <= before + 1
    finally:
        plain.delete(key)
        plain.close()
