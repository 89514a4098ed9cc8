"""The channels_redis (``channels-redis==4.3.0``, requirements/hub.txt) internals the hub uses.

``RedisChannelLayer.connection(index)`` (public name, undocumented)
    The heartbeat group commit (hub.agents.heartbeat_batch) and the live-log backlog
    (hub.leases.logs) write plain Redis keys through the channel layer's own client for the
    running event loop: no second pool per process, and it is closed with its loop.
    :func:`layer_redis` is the one call of it. Upstream: "There's no public API for it"
    (maintainer's answer on https://github.com/django/channels/issues/1993, also asked as
    https://github.com/django/channels_redis/issues/360, both closed); no open issue or PR
    proposes one.

``RedisChannelLayer.create_pool(index)`` (public name, undocumented)
    ``RedisLoopLayer.get_connection`` calls it for each event loop's pool; hub.lib.channel_layer
    overrides it to bound the pool (a ``BlockingConnectionPool`` of ``max_connections``) and
    name its connections. tests/hub/test_shared_redis.py fails if the layer's client stops
    coming from it (its pool would be unbounded again).

``RedisChannelLayer._layers`` and ``channels_redis.utils._wrap_close`` (private)
    hub.lib.channel_send keeps one long-lived event loop per process because the layer keeps
    its Redis pools per loop: ``connection()`` looks the loop up in ``_layers`` and, the first
    time, wraps ``loop.close()`` (``_wrap_close``) to flush that loop's pools. A fresh loop per
    ``async_to_sync`` call therefore meant a fresh Redis connection per send. Nothing here
    calls either name; the tests pin the behaviour channel_send is built on. Upstream:
    https://github.com/django/channels_redis/issues/125 (a connection per ``async_to_sync``
    send, closed by https://github.com/django/channels_redis/pull/130, which added the loop
    close wrapper) and the discussion on https://github.com/django/channels_redis/issues/266.
    If a release shares pools across loops, channel_send's loop thread is no longer needed.

``RedisChannelLayer.receive_count`` and ``receive_lock`` (private; the tests only)
    A ``receive()`` counts itself in and out and makes the layer's receive lock for the event
    loop it runs on. If that loop ends with the receive still waiting (a test's loop closed
    under a consumer), the count stays up and the lock stays bound to the dead loop: the next
    receive on another loop fails ("Two event loops are trying to receive()", or the lock "is
    bound to a different event loop"). The hub's loops live as long as their process; only
    tests end loops this way, and tests/conftest.py gives the next test a fresh layer when
    :func:`receive_left_waiting` says so.

tests/hub/test_compat_channels_redis.py fails, naming what to re-check, if a release changes
any of these.
"""

from __future__ import annotations

from typing import Any

from channels_redis.core import RedisChannelLayer


def layer_redis(layer: RedisChannelLayer) -> Any:
    """The layer's ``redis.asyncio.Redis`` client for the running loop (first host only)."""
    return layer.connection(0)


def receive_left_waiting(layer: RedisChannelLayer) -> bool:
    """Whether ``layer`` still counts a ``receive()`` as waiting (on whatever loop it began)."""
    return (
        bool(getattr(layer, "receive_count", 0)) or getattr(layer, "receive_lock", None) is not None
    )
