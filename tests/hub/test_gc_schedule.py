"""The web process's full collections on a bounded schedule (issue 23 item 3): however rare
CPython's own thresholds make them, one runs within GC_FULL_INTERVAL_S, and sooner after many
large responses. The clock is the test's; only the collector is real where it says so."""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref
from typing import Any

import pytest

from hub import serve
from hub.lib.gc_schedule import FullCollections
from tests.support.loops import run_on_own_loop


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Collector:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, generation: int) -> int:
        self.calls.append(generation)
        return 0


def _schedule(clock: Clock, collector: Collector, **kwargs: Any) -> FullCollections:
    return FullCollections(
        interval_s=600, min_gap_s=30, clock=clock, collect=collector, trim=lambda: 0, **kwargs
    )


def test_a_full_collection_runs_once_the_interval_has_passed_and_not_before() -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector)
    ticks_before = []
    for _ in range(119):  # a tick every 5 s, as hub/serve.py drives it: 595 s
        clock.now += 5
        ticks_before.append(schedule.tick())
    assert ticks_before == [None] * 119
    assert collector.calls == []

    clock.now += 5
    done = schedule.tick()

    assert done is not None
    assert done.reason == "interval"
    assert collector.calls == [2]  # the oldest generation: a full collection
    clock.now += 5
    assert schedule.tick() is None  # the clock starts again


def test_over_a_day_no_gap_between_full_collections_passes_the_interval() -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector)
    collected_at = [clock.now]
    for _ in range(24 * 3600 // 5):
        clock.now += 5
        if schedule.tick() is not None:
            collected_at.append(clock.now)
    gaps = [b - a for a, b in itertools.pairwise(collected_at)]
    assert len(gaps) == 144
    assert max(gaps) <= 600 + 5  # the interval, plus at most one tick


def test_cpythons_own_full_collection_restarts_the_clock() -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector)
    clock.now += 500
    schedule.on_gc("start", {"generation": 2})
    schedule.on_gc("stop", {"generation": 2, "collected": 0})
    schedule.on_gc("stop", {"generation": 0, "collected": 0})  # young ones do not count
    clock.now += 500
    assert schedule.tick() is None
    clock.now += 100
    assert schedule.tick() is not None


def test_large_responses_bring_it_forward_but_never_closer_than_the_gap() -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector, large_response_bytes=1 << 20, large_bytes=8 << 20)
    for _ in range(100):
        schedule.note_response(64 * 1024)  # small ones do not count
    clock.now += 10
    for _ in range(8):
        schedule.note_response(1 << 20)
    assert schedule.tick() is None  # 10 s after the last one: inside the gap
    clock.now += 20
    done = schedule.tick()
    assert done is not None
    assert done.reason == "large responses"
    assert schedule.large_since == 0


def test_settings_that_break_the_bound_are_refused() -> None:
    with pytest.raises(ValueError, match="min_gap_s"):
        FullCollections(interval_s=10, min_gap_s=30)
    with pytest.raises(ValueError, match="interval_s"):
        FullCollections(interval_s=0, min_gap_s=0)


def test_the_due_collection_frees_a_cycle_the_tuned_thresholds_left() -> None:
    # The real collector: a cycle holding a big body survives young collections under the web
    # process's thresholds, and goes with the scheduled full one.
    class Body:
        def __init__(self) -> None:
            self.data = bytearray(8 << 20)
            self.me = self

    before = gc.get_threshold()
    gc.collect()
    gc.set_threshold(*serve.GC_THRESHOLDS)
    try:
        held = [Body()]  # a response in flight: it lives through young collections...
        gone = weakref.ref(held[0])
        gc.collect(1)  # ... which move it to the oldest generation
        held.clear()  # the response is out: only its cycle keeps it
        gc.collect(0)
        gc.collect(1)
        assert gone() is not None  # young collections never look at it again
        clock = Clock()
        schedule = FullCollections(interval_s=600, min_gap_s=30, clock=clock)
        clock.now += 600
        done = schedule.tick()
        assert done is not None
        assert done.unreachable >= 1
        assert gone() is None
    finally:
        gc.set_threshold(*before)


def test_the_web_process_counts_each_responses_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector, large_response_bytes=1000, large_bytes=10_000)
    monkeypatch.setattr(serve, "full_collections", schedule)
    sent: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * 600, "more_body": True})
        await send({"type": "http.response.body", "body": b"x" * 600})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"type": "http.disconnect"}

    run_on_own_loop(serve.ResponseSizes(app)({"type": "http"}, receive, send))

    assert schedule.large_since == 1200  # one response of 1,200 bytes, in two messages
    assert [m["type"] for m in sent] == ["http.response.start", *["http.response.body"] * 2]


def test_serve_schedules_collections_from_the_reactor(settings: Any) -> None:
    settings.GC_FULL_INTERVAL_S = 120
    call = serve.schedule_full_collections()
    try:
        assert call.running
        assert call.interval == serve.GC_TICK_S
        assert serve.full_collections is not None
        assert serve.full_collections.interval_s == 120
        assert serve.full_collections.on_gc in gc.callbacks
    finally:
        call.stop()
        assert serve.full_collections is not None
        gc.callbacks.remove(serve.full_collections.on_gc)
        serve.full_collections = None


def test_a_due_collection_waits_for_a_storm_of_connections_to_pass() -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector, busy_connects=100, max_defer_s=120)
    clock.now += 600
    for _ in range(5):  # 25 s of a storm: 100 connections per 5 s tick
        for _ in range(100):
            schedule.note_connection()
        assert schedule.tick() is None
        clock.now += 5
    assert collector.calls == []
    for _ in range(99):  # the storm is over: fewer than busy_connects since the last tick
        schedule.note_connection()
    done = schedule.tick()
    assert done is not None
    assert done.deferred_s == 25
    assert collector.calls == [2]


def test_a_storm_that_never_ends_defers_it_only_up_to_the_bound() -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector, busy_connects=100, max_defer_s=120)
    clock.now += 600
    collected_at = None
    for tick in range(40):
        for _ in range(500):
            schedule.note_connection()
        if schedule.tick() is not None:
            collected_at = tick * 5
            break
        clock.now += 5
    assert collected_at == 120
    assert collector.calls == [2]


def test_new_connections_reach_the_schedule_and_cpython_runs_no_full_collection_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, collector = Clock(), Collector()
    schedule = _schedule(clock, collector)
    monkeypatch.setattr(serve, "full_collections", schedule)
    serve.HeaderDeadlineFactory(server=None).buildProtocol(None)
    assert schedule.connects == 1
    # Only the schedule runs full collections in the web process (a storm can defer those).
    assert serve.GC_THRESHOLDS[2] >= 2**31 - 1
