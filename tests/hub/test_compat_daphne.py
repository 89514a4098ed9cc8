"""The Daphne and Twisted internals hub.lib.compat_daphne relies on still exist with their shape.

Each failure names the internal and what to re-check when the daphne pin (requirements/hub.txt)
or the Twisted it brings moves.
"""

from __future__ import annotations

import asyncio
import inspect
import pprint
from collections import deque

import daphne
import twisted
from daphne import server as daphne_server
from daphne.http_protocol import HTTPFactory
from daphne.server import Server
from daphne.ws_protocol import WebSocketProtocol
from twisted.web.http import HTTPChannel

from hub import serve
from hub.lib.compat_daphne import client_left, http_channel_of, lazy_pformat


def _recheck(what: str) -> str:
    return (
        f"daphne {daphne.__version__} / Twisted {twisted.__version__}: {what} changed; re-check "
        "hub/lib/compat_daphne.py and hub/serve.py (the docstring says why and what to watch)"
    )


def test_daphne_still_builds_its_http_factory_by_the_name_the_hub_replaces() -> None:
    # If a Daphne release builds the factory elsewhere, the header deadline silently stops
    # applying: this says so.
    assert daphne_server.HTTPFactory is serve.HeaderDeadlineFactory, _recheck(
        "daphne.server.HTTPFactory"
    )
    assert "self.http_factory = HTTPFactory(self)" in inspect.getsource(Server.run), _recheck(
        "Server.run's factory construction"
    )
    assert issubclass(serve.HeaderDeadlineFactory, HTTPFactory)


def test_twisted_still_wraps_the_http_channel_in_a_protocol_with_a_private_channel() -> None:
    built = serve.HeaderDeadlineFactory(server=None).buildProtocol(None)
    assert isinstance(getattr(built, "_channel", None), HTTPChannel), _recheck(
        "twisted.web.http._GenericHTTPChannelProtocol._channel"
    )
    channel = http_channel_of(built)
    for hook in ("connectionMade", "allHeadersReceived"):
        assert callable(getattr(HTTPChannel, hook, None)), _recheck(f"HTTPChannel.{hook}")
        assert hook in channel.__dict__, _recheck(f"our {hook} hook is not on the channel")


def test_daphne_application_checker_still_walks_and_edits_server_connections() -> None:
    # hub.serve hands the checker one slice of `connections` per tick and merges back what it
    # reaped: that holds only while the checker reads self.connections afresh, deletes reaped
    # protocols from it and reschedules itself.
    assert list(inspect.signature(Server.application_checker).parameters) == ["self"], _recheck(
        "Server.application_checker's signature"
    )
    source = inspect.getsource(Server.application_checker)
    for fragment in (
        "for protocol, details in list(self.connections.items()):",
        'del self.connections[protocol]["application_instance"]',
        "del self.connections[protocol]",
        "reactor.callLater(1, self.application_checker)",
    ):
        assert fragment in source, _recheck(f"Server.application_checker no longer does {fragment}")
    # hub.serve reassigns the attribute each tick; Server.run() creates it as a plain dict.
    assert "self.connections = {}" in inspect.getsource(Server.run), _recheck("Server.connections")


def test_daphne_still_hands_the_application_a_queues_get_and_queues_the_disconnect() -> None:
    # client_left looks into that queue: a registration queued behind a reconnect storm is
    # skipped when its client has gone. Another shape would make it skip nothing, silently.
    source = inspect.getsource(Server.create_application)
    for fragment in ("input_queue = asyncio.Queue()", "receive=input_queue.get"):
        assert fragment in source, _recheck(f"Server.create_application no longer does {fragment}")
    assert '"type": "websocket.disconnect"' in inspect.getsource(WebSocketProtocol.onClose), (
        _recheck("WebSocketProtocol.onClose's websocket.disconnect")
    )
    assert isinstance(getattr(asyncio.Queue(), "_queue", None), deque), _recheck(
        "asyncio.Queue._queue"
    )


def test_client_left_sees_an_unread_disconnect_and_nothing_else() -> None:
    inbox: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    assert not client_left(inbox.get)
    inbox.put_nowait({"type": "websocket.receive", "text": "{}"})
    assert not client_left(inbox.get)
    inbox.put_nowait({"type": "websocket.disconnect", "code": 1006})
    assert client_left(inbox.get)
    # Not a queue's get (another server): it never claims the client left.
    assert not client_left(lambda: None)


def test_daphne_cli_still_hands_the_server_its_endpoints_by_keyword() -> None:
    # hub.serve gives TCP endpoints a deep accept queue in RedactingServer.__init__'s kwargs:
    # were they passed another way, a reconnect storm would meet Twisted's backlog of 50 again.
    from daphne.cli import CommandLineInterface

    assert "endpoints=endpoints," in inspect.getsource(CommandLineInterface.run), _recheck(
        "CommandLineInterface.run's server_class(endpoints=...)"
    )


def test_tcp_endpoints_get_a_deep_accept_queue_and_others_are_left_alone() -> None:
    assert serve.with_backlog(
        ["tcp:port=8000:interface=127.0.0.1", "tcp:port=1:backlog=7", "unix:/run/hub.sock"]
    ) == [
        f"tcp:port=8000:interface=127.0.0.1:backlog={serve.LISTEN_BACKLOG}",
        "tcp:port=1:backlog=7",
        "unix:/run/hub.sock",
    ]


def test_autobahn_still_pretty_prints_each_connections_config_through_its_pformat_global() -> None:
    # hub.serve makes that pformat lazy: were it called another way, every connection would
    # pay for a debug line again (15 % of the loop in a reconnect storm).
    from autobahn.websocket import protocol

    assert "attrs=pformat(configAttrLog)" in inspect.getsource(
        protocol.WebSocketProtocol._connectionMade
    ), _recheck("autobahn WebSocketProtocol._connectionMade's pformat")
    assert protocol.pformat is lazy_pformat, _recheck("autobahn.websocket.protocol.pformat")


def test_lazy_pformat_formats_only_when_asked() -> None:
    value = [("openHandshakeTimeout", 5, "Factory")]
    lazy = lazy_pformat(value)
    assert lazy.value is value
    assert f"\n{lazy}" == "\n" + pprint.pformat(value)
    assert format(lazy, "") == pprint.pformat(value)
