"""Backpressure on WebSockets in the web process (issue 23 item 3): past WS_QUEUE_PAUSE_AT
messages waiting for the consumer, the socket is not read until the queue drains; nothing is
dropped. Daphne's own queue had no bound: a sender faster than its consumer grew the process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from hub import serve
from hub.lib import compat_daphne


class Transport:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")


class Reactor:
    def __init__(self) -> None:
        self.later: list[Callable[[], None]] = []

    def callLater(self, delay: float, call: Callable[[], None]) -> None:
        self.later.append(call)

    def run_due(self) -> None:
        due, self.later = self.later, []
        for call in due:
            call()


@pytest.fixture
def protocol(monkeypatch: pytest.MonkeyPatch) -> Any:
    reactor = Reactor()
    monkeypatch.setattr(serve, "reactor", reactor)
    made = serve.BoundedWebSocketProtocol()
    made.muted = False
    made.client_addr = ("127.0.0.1", 1)
    made.application_queue = asyncio.Queue()
    made.transport = Transport()
    made.test_reactor = reactor
    return made


def test_reading_pauses_at_the_bound_and_resumes_once_drained(protocol: Any) -> None:
    for n in range(serve.WS_QUEUE_PAUSE_AT - 1):
        protocol.onMessage(f"frame {n}".encode(), False)
    assert protocol.transport.calls == []

    protocol.onMessage(b"one more", False)
    protocol.onMessage(b"already read", False)  # what the last read held still queues

    assert protocol.transport.calls == ["pause"]
    assert protocol.application_queue.qsize() == serve.WS_QUEUE_PAUSE_AT + 1  # none dropped
    protocol.test_reactor.run_due()
    assert protocol.transport.calls == ["pause"]  # still too long: looked at again later
    while protocol.application_queue.qsize() > serve.WS_QUEUE_RESUME_AT:
        protocol.application_queue.get_nowait()
    protocol.test_reactor.run_due()
    assert protocol.transport.calls == ["pause", "resume"]
    assert protocol.test_reactor.later == []


def test_a_closed_connection_is_left_alone(protocol: Any) -> None:
    for _ in range(serve.WS_QUEUE_PAUSE_AT):
        protocol.onMessage(b"x", False)
    protocol.transport = None  # Twisted drops it on connectionLost
    protocol.test_reactor.run_due()
    assert protocol.test_reactor.later == []


def test_daphne_builds_the_bounded_protocol() -> None:
    from daphne import server as daphne_server

    assert daphne_server.WebSocketFactory is serve.BoundedWebSocketFactory
    assert serve.BoundedWebSocketFactory.protocol is serve.BoundedWebSocketProtocol
    assert compat_daphne.replace_ws_factory is not None
