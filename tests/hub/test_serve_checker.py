"""The web process's Daphne reaps finished connections one slice per second, not all at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from twisted.internet import reactor

from hub.serve import CHECK_SLICES, RedactingServer


@pytest.fixture
def server() -> Iterator[RedactingServer]:
    # Never started: only its checker runs, by hand.
    server = RedactingServer(
        application=lambda *args: None, endpoints=["tcp:port=0:interface=127.0.0.1"]
    )
    yield server
    for call in reactor.getDelayedCalls():  # the checker reschedules itself each time
        if call.func == server.application_checker:
            call.cancel()


class Protocol:
    """Stands for a Daphne protocol object: the checker only uses it as a key."""

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __hash__(self) -> int:
        return self.slot


def _finished() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


def test_each_tick_reaps_one_slice_and_every_connection_is_reaped_within_the_slices(
    server: RedactingServer,
) -> None:
    closed = [Protocol(n) for n in range(CHECK_SLICES * 5)]
    running: Future[None] = Future()
    alive = Protocol(0)
    server.connections = {
        **{p: {"application_instance": _finished(), "disconnected": time.time()} for p in closed},
        alive: {"application_instance": running},
    }

    server.application_checker()
    assert len(server.connections) == len(closed) + 1 - 5  # one slice of ten

    for _ in range(CHECK_SLICES - 1):
        server.application_checker()
    assert server.connections == {alive: {"application_instance": running}}


def test_a_finished_application_of_a_live_connection_is_dropped_but_the_connection_kept(
    server: RedactingServer,
) -> None:
    live = Protocol(3)
    server.connections = {live: {"application_instance": _finished()}}
    for _ in range(CHECK_SLICES):
        server.application_checker()
    assert server.connections == {live: {}}
