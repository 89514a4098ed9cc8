"""A same-process shortcut for channel-layer sends between consumers that opt in.

A renter's terminal crosses the channel layer twice per keystroke (their socket to the host's
agent socket, and the echo back); through Redis each crossing is a push and a blocking pop,
about a millisecond on a quiet machine and more under load. When both sockets live in the same
web process (one web process, or the agent and the renter on the same one), ``send`` hands the
event straight to the receiving consumer's handler instead; otherwise it is an ordinary
``channel_layer.send``. Same event, same handler, same order per sender: only the hop differs.

Opted in: the agents' sockets and renters' terminal sockets (``register`` in ``connect``,
``unregister`` in ``disconnect``).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Protocol

from channels.consumer import get_handler_name

log = logging.getLogger(__name__)


class _Consumer(Protocol):
    channel_name: str


# Weak: a consumer that goes away without its disconnect (a crashed handshake) leaves nothing.
_local: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def register(consumer: _Consumer) -> None:
    _local[consumer.channel_name] = consumer


def unregister(consumer: _Consumer) -> None:
    if _local.get(consumer.channel_name) is consumer:
        del _local[consumer.channel_name]


async def send(layer: Any, channel: str, event: dict[str, Any]) -> None:
    """``layer.send(channel, event)``, or the handler itself when the channel's consumer is
        here. A handler's failure is the receiver's: logged, never raised into the sender. Only for
    handlers that need no database clean-up (they query nothing, or through
    database_sync_to_async, which tidies for itself)."""
    consumer = _local.get(channel)
    if consumer is None:
        await layer.send(channel, event)
        return
    # The handler Channels would pick (get_handler_name: "terminal.output" -> terminal_output),
    # called directly: Channels' own dispatch first hops to a thread to tidy database
    # connections, a cost per keystroke these handlers, which query nothing, do not need.
    handler = getattr(consumer, get_handler_name(event), None)
    if handler is None:
        log.warning("no handler for %s on %s", event.get("type"), channel)
        return
    try:
        await handler(event)
    except Exception:
        log.exception("local delivery of %s to %s failed", event.get("type"), channel)
