"""The web process's Daphne: connections reaped one slice per second, garbage collection tuned."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from twisted.internet import reactor

from hub import serve
from hub.serve import (
    CHECK_SLICES,
    GC_THRESHOLDS,
    RedactingServer,
    _time_collections,
    tune_garbage_collection,
)


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


def test_the_web_process_freezes_start_up_objects_and_collects_rarely() -> None:
    before = (gc.get_threshold(), gc.get_freeze_count())
    try:
        tune_garbage_collection()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        assert _time_collections in gc.callbacks
    finally:
        gc.callbacks.remove(_time_collections)
        gc.unfreeze()
        gc.set_threshold(*before[0])


def test_a_slow_collection_is_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve, "GC_SLOW_PAUSE_S", 0.0)  # every collection counts as slow
    gc.callbacks.append(_time_collections)
    try:
        with caplog.at_level("WARNING", logger="hub.serve"):
            gc.collect()
    finally:
        gc.callbacks.remove(_time_collections)
    assert any(
        "garbage collection (generation 2) paused the web process" in r.getMessage()
        for r in caplog.records
    )
