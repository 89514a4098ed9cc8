"""The Channels (``channels==4.3.2``, requirements/hub.txt) behaviour the agent consumer copies.

``AsyncConsumer.dispatch`` (overridden) and ``channels.consumer.get_handler_name``
    Channels' own ``dispatch`` awaits ``aclose_old_connections()`` before every handler: a hop
    to the sync thread for each frame of each socket, measured as the main cost of a
    heartbeat (docs/benchmarks.md). hub.agents.consumer.AgentConsumer reaches the
    database only through ``database_sync_to_async``, whose ``thread_handler`` runs
    ``close_old_connections()`` before and after each call, so :func:`dispatch_without_db_cleanup`
    is upstream's ``dispatch`` minus that hop. It uses ``get_handler_name`` (public in the
    module, not documented) so a frame's type maps to its handler exactly as upstream maps it,
    leading-underscore refusal included. Upstream: the per-message clean-up came from
    https://github.com/django/channels/issues/871 and the before-and-after clean-up in
    ``database_sync_to_async`` from https://github.com/django/channels/issues/1234; no issue or
    PR asks for a consumer that opts out of the per-message hop -- none fits. When the pin
    moves, tests/hub/test_compat_channels.py fails if upstream's ``dispatch`` does anything
    more (or ``database_sync_to_async`` stops cleaning up), and this copy must follow.
"""

from __future__ import annotations

from typing import Any

from channels.consumer import AsyncConsumer, get_handler_name


async def dispatch_without_db_cleanup(consumer: AsyncConsumer, message: dict[str, Any]) -> None:
    """``AsyncConsumer.dispatch`` without its ``aclose_old_connections()`` per message."""
    handler = getattr(consumer, get_handler_name(message), None)
    if handler is None:
        raise ValueError(f"No handler for message type {message['type']}")
    await handler(message)
