"""Every Daphne (and Twisted-under-Daphne) internal the web process (hub/serve.py) relies on.

Pins: ``daphne==4.2.3`` (requirements/hub.txt) and the Twisted it brings (26.10.0 when this
was written; Twisted is not pinned by name). A release that changes one of these breaks this
module and tests/hub/test_compat_daphne.py, whose failures name the internal to re-check.
Django-free, like the rest of ``hub.lib``.

``daphne.server.HTTPFactory`` (a module global, replaced)
    ``Server.run()`` builds its HTTP factory by looking this name up in ``daphne.server`` at
    run time, and Daphne has no option to pass another. hub.serve swaps in a factory that
    gives every connection a deadline for its request headers: Twisted's own timeout is an
    idle one that each byte resets, so a client dripping header bytes held a Daphne slot
    forever. Upstream: no Daphne issue or PR asks for a header deadline or a pluggable
    factory (searched django/daphne); none fits.

``twisted.web.http._GenericHTTPChannelProtocol._channel``
    The factory's protocol is a proxy that forwards only ``IProtocol``; the ``HTTPChannel``
    that parses headers (``allHeadersReceived``) is its private ``_channel``. Introduced with
    Twisted's HTTP/2 groundwork, https://github.com/twisted/twisted/issues/8193 (closed); no
    open issue offers a public way to reach the channel.

``Server.connections`` and ``Server.application_checker`` (public names, undocumented)
    ``application_checker`` walks every connection once a second and reschedules itself;
    hub.serve's override hands it one slice of ``connections`` per tick (10,000 agent sockets
    made the full walk 16 % of the process's CPU). It relies on the method reading
    ``self.connections`` afresh each call and deleting reaped entries from that dict.
    Upstream: https://github.com/django/daphne/issues/192 (very high load with many idle
    websockets, open) is the closest; none is about the checker itself.

``receive`` is ``asyncio.Queue.get`` of the connection's input queue (public names; the queue's
``_queue`` deque is private)
    Daphne's ``Server.create_application`` passes ``input_queue.get`` as the ASGI ``receive``
    (asgiref's test communicator does the same), and its WebSocket protocol puts
    ``websocket.disconnect`` there when the client leaves or the handshake times out
    (``onClose``). Channels hands a consumer the next message only after the one before is
    handled, so a registration queued behind a reconnect storm cannot see that its client has
    gone; ``client_left`` looks into the queue instead. Upstream: ASGI has no "is the client
    still there" call (django/asgiref discussions of ``http.disconnect`` polling are the
    closest); none fits.
``daphne.server.WebSocketFactory`` (a module global, replaced) and ``WebSocketProtocol``'s
``application_queue`` and ``transport``
    Daphne puts every incoming WebSocket message on the connection's ``application_queue``,
    an unbounded asyncio.Queue, however far behind its consumer is; hub.serve swaps in a
    factory whose protocol stops reading the socket (``transport.pauseProducing()``) while
    the queue is long, so a sender faster than its consumer waits in TCP instead of in the
    web process's memory (issue 23's soak: the agent socket's unprocessed log_chunk frames).
    Daphne 4.2.3 has no option for it; upstream issues were not searched for this change.

``daphne.server.twisted_loop`` (a module global)
    The asyncio loop Daphne installs Twisted's reactor on, created when ``daphne.server`` is
    imported: the loop every ASGI application of the process runs on. hub.serve hands it to
    hub.lib.channel_send, so that sync code (views, database threads) sends and talks to Redis
    on it, through the channel layer's one pool, instead of a loop and pool of its own.
    Upstream: Daphne documents no way to reach its loop; none was searched for.

``autobahn.websocket.protocol.pformat`` (a module global, replaced; autobahn comes with Daphne)
    ``WebSocketProtocol._connectionMade`` pretty-prints the connection's whole configuration
    for a debug line, ``log.debug("\n{attrs}", attrs=pformat(...))``, on every connection,
    logged or not: 15 % of the web process's event loop during a reconnect storm (py-spy,
    docs/benchmarks.md). ``lazy_pformat`` formats only if the line is emitted. Upstream: no
    autobahn issue asks for it to be lazy (searched crossbario/autobahn-python); none fits.
"""

from __future__ import annotations

import asyncio
import pprint
from collections.abc import Callable
from typing import Any

from daphne import server as daphne_server
from twisted.web.http import HTTPChannel


def replace_http_factory(factory: type) -> None:
    """Make ``Server.run()`` build ``factory`` (a subclass of Daphne's HTTPFactory)."""
    daphne_server.HTTPFactory = factory


def http_channel_of(protocol: Any) -> HTTPChannel:
    """The ``HTTPChannel`` inside the protocol Twisted's HTTPFactory built."""
    return protocol._channel  # type: ignore[no-any-return]


def client_left(receive: Callable[[], Any]) -> bool:
    """Whether a ``websocket.disconnect`` waits in the connection's input queue, unread. False
    where ``receive`` is not a queue's ``get`` (another server): then nothing is skipped. Call
    it on the event loop's thread only (the deque is not thread-safe)."""
    queue = getattr(receive, "__self__", None)
    if not isinstance(queue, asyncio.Queue):
        return False
    waiting = getattr(queue, "_queue", ())
    return any(
        isinstance(message, dict) and message.get("type") == "websocket.disconnect"
        for message in waiting
    )


def replace_ws_factory(factory: type) -> None:
    """Make ``Server.run()`` build ``factory`` (a subclass of Daphne's WebSocketFactory)."""
    daphne_server.WebSocketFactory = factory


class LazyPformat:
    """``pprint.pformat(value)``, computed only when the log line is formatted."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return pprint.pformat(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def lazy_pformat(value: object) -> LazyPformat:
    return LazyPformat(value)


def make_autobahn_debug_lines_lazy() -> None:
    """Replace the ``pformat`` autobahn's WebSocket protocol calls for its debug lines."""
    from autobahn.websocket import protocol

    setattr(protocol, "pformat", lazy_pformat)  # noqa: B010 (a module global, replaced)


def serving_loop() -> asyncio.AbstractEventLoop:
    """The asyncio loop Daphne runs the reactor, and so every application, on."""
    loop: asyncio.AbstractEventLoop = daphne_server.twisted_loop
    return loop
