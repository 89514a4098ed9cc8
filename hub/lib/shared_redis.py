"""One Redis pool per process for everything the hub itself does in Redis (issue 18).

The channel layer keeps a pool per event loop (hub.lib.channel_layer bounds it and names its
connections). The hub's own Redis work goes through that same pool:

- async code (heartbeats, the live-log backlog) awaits ``layer_redis(get_channel_layer())``;
- sync code (registration, the offline sweep, the telemetry flush, the Django cache) uses
  :func:`client`, whose commands and pipelines run as coroutines on the process's one loop
  (hub.lib.channel_send: Daphne's in the web process, a thread of its own elsewhere) and block
  the caller until Redis answered.

Before, each of those kept a pool of its own: a web process held the layer's receive loop and
pool, a sync client, and the Django cache's. Now it holds the layer's two (one blocked in the
receive loop's BZPOPMIN, one for the rest) and nothing else.

Responses are what redis-py's sync client returns (bytes; ``decode_responses`` off), so code
written for ``redis.Redis`` works unchanged. Not covered: Pub/Sub, WATCH and blocking commands
(the pool's second connection would be held); the hub uses none of them outside the layer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any

from django.conf import settings
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from redis.exceptions import TimeoutError as RedisTimeoutError

from hub.lib import channel_send
from hub.lib.compat_channels_redis import layer_redis

# A sync Redis call waits at most this long, then raises redis' TimeoutError (a RedisError, as
# the sync client's socket timeout of 5 s did before), instead of hanging the caller.
CALL_TIMEOUT_S = 5.0


def process_role(argv: list[str] | None = None) -> str:
    """web, worker, beat or manage: what this process is, for its Redis connections' names."""
    args = sys.argv if argv is None else argv
    joined = " ".join(args)
    if "hub.serve" in joined or "hub/serve.py" in joined or "daphne" in joined:
        return "web"
    if "celery" in joined:
        for role in ("worker", "beat"):
            if role in args:
                return role
    return "manage"


def client_name() -> str:
    """CLIENT SETNAME of this process's connections: ``<prefix>:<role>:<pid>``, so that
    ``redis-cli CLIENT LIST`` says which process holds which (Redis allows no spaces)."""
    return f"{settings.REDIS_KEY_PREFIX}:{process_role()}:{os.getpid()}"


def _run(what: str, work: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
    async def on_the_loop(layer: Any) -> Any:
        # The layer's client for the loop this runs on: looked up there, not by the caller.
        return await work(layer_redis(layer))

    try:
        return channel_send.call(
            f"redis {what}", on_the_loop, timeout_s=CALL_TIMEOUT_S, from_other_loops=True
        )
    except channel_send.ChannelSendTimeout as exc:
        # Callers catch RedisError for "Redis is away" (heartbeats fall back to Postgres).
        raise RedisTimeoutError(str(exc)) from exc


class SyncPipeline:
    """``redis.Redis.pipeline()`` for the shared pool: commands are recorded, and ``execute``
    sends them all in one round trip on the process's loop."""

    def __init__(self, transaction: bool = True) -> None:
        self.transaction = transaction
        self._commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., SyncPipeline]:
        if name.startswith("_"):
            raise AttributeError(name)

        def queue(*args: Any, **kwargs: Any) -> SyncPipeline:
            self._commands.append((name, args, kwargs))
            return self

        return queue

    def __len__(self) -> int:
        return len(self._commands)

    def execute(self) -> list[Any]:
        commands, self._commands = self._commands, []
        transaction = self.transaction

        async def work(redis: Any) -> list[Any]:
            async with redis.pipeline(transaction=transaction) as pipe:
                for name, args, kwargs in commands:
                    getattr(pipe, name)(*args, **kwargs)
                result: list[Any] = await pipe.execute()
                return result

        result: list[Any] = _run("pipeline", work)
        return result

    def reset(self) -> None:
        self._commands = []

    def __enter__(self) -> SyncPipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.reset()


class SyncRedis:
    """The subset of ``redis.Redis`` the hub's sync code uses, on the shared pool: any command
    method (``get``, ``zadd``, ``eval``, ``info`` ...) and ``pipeline``."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def command(*args: Any, **kwargs: Any) -> Any:
            return _run(name, lambda redis: getattr(redis, name)(*args, **kwargs))

        return command

    def pipeline(self, transaction: bool = True) -> SyncPipeline:
        return SyncPipeline(transaction)

    def scan_iter(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """All matching keys, read in full first (redis.asyncio's is an async iterator)."""

        async def work(redis: Any) -> list[Any]:
            return [key async for key in redis.scan_iter(*args, **kwargs)]

        keys: list[Any] = _run("scan_iter", work)
        return iter(keys)


_client = SyncRedis()


def client() -> SyncRedis:
    """This process's sync Redis client (stateless: the pool is the channel layer's)."""
    return _client


class _SharedCacheClient(RedisCacheClient):  # type: ignore[misc]  # django-stubs not installed
    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        return _client


class SharedRedisCache(RedisCache):  # type: ignore[misc]
    """Django's Redis cache on the shared pool (settings.CACHES). ``LOCATION`` is not used: the
    cache lives in the channel layer's Redis, which is REDIS_URL as well."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _SharedCacheClient
