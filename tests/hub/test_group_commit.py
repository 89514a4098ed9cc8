"""hub/lib/group_commit.py: requests that arrive while a batch is in flight join the next one,
batches stay within their bounds, each request gets its own answer or error, and a request
whose client left is dropped when its batch's turn comes."""

from __future__ import annotations

import asyncio

import pytest

from hub.lib import group_commit
from tests.support.loops import run_on_own_loop
from tests.support.polling import async_wait_for


class _Database:
    """A batch function whose batches wait until released, so a test decides what is in
    flight; it records every batch it was sent."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail_with: Exception | None = None

    async def run(self, requests: list[int]) -> list[int | Exception]:
        self.batches.append(list(requests))
        await self.release.wait()
        if self.fail_with is not None:
            raise self.fail_with
        return [ValueError(f"odd {r}") if r % 2 else r * 10 for r in requests]


def _batcher(db: _Database, batch_max: int = 100, in_flight_max: int = 1) -> group_commit.Batcher:
    return group_commit.Batcher(db.run, batch_max=batch_max, in_flight_max=in_flight_max)


def _stays() -> bool:
    return False


async def _first_batch_in_flight() -> tuple[_Database, group_commit.Batcher, asyncio.Future[int]]:
    """A batcher whose one batch in flight ([0]) waits for ``db.release``: what is submitted
    next queues for the following batch."""
    db = _Database()
    batcher = _batcher(db)
    first = asyncio.ensure_future(batcher.submit(0, _stays))
    await async_wait_for(lambda: db.batches, timeout_s=5, what="the first batch")
    return db, batcher, first


async def test_requests_that_arrive_while_one_batch_is_in_flight_share_the_next() -> None:
    db, batcher, first = await _first_batch_in_flight()
    later = [asyncio.ensure_future(batcher.submit(r, _stays)) for r in (2, 4, 6)]
    db.release.set()
    assert await first == 0
    assert await asyncio.gather(*later) == [20, 40, 60]
    assert db.batches == [[0], [2, 4, 6]]
    assert batcher.batches == 2
    assert batcher.in_flight == 0


async def test_batches_stay_within_their_size_and_the_in_flight_bound() -> None:
    db = _Database()
    batcher = _batcher(db, batch_max=3, in_flight_max=2)
    busy = [asyncio.ensure_future(batcher.submit(r, _stays)) for r in (0, 2)]
    await async_wait_for(lambda: len(db.batches) == 2, timeout_s=5, what="two batches")
    queued = [asyncio.ensure_future(batcher.submit(r * 2, _stays)) for r in range(2, 8)]
    await async_wait_for(lambda: batcher.waiting == 6, timeout_s=5, what="six waiting")
    assert batcher.in_flight == 2  # the bound: they wait
    assert len(db.batches) == 2
    db.release.set()
    assert await asyncio.gather(*busy, *queued) == [r * 20 for r in range(8)]
    assert db.batches == [[0], [2], [4, 6, 8], [10, 12, 14]]


async def test_each_request_gets_its_own_error_and_the_others_their_results() -> None:
    db = _Database()
    db.release.set()
    batcher = _batcher(db)
    results = await asyncio.gather(
        *(batcher.submit(r, _stays) for r in (2, 3, 4)), return_exceptions=True
    )
    assert results[0] == 20
    assert results[2] == 40
    assert isinstance(results[1], ValueError)
    assert str(results[1]) == "odd 3"


async def test_a_failed_batch_fails_each_of_its_requests_and_the_next_batch_still_runs() -> None:
    db = _Database()
    db.fail_with = ConnectionError("database down")
    db.release.set()
    batcher = _batcher(db)
    results = await asyncio.gather(
        *(batcher.submit(r, _stays) for r in (2, 4)), return_exceptions=True
    )
    assert all(isinstance(r, ConnectionError) for r in results)
    db.fail_with = None
    assert await batcher.submit(6, _stays) == 60
    assert batcher.in_flight == 0


async def test_a_request_whose_client_left_is_dropped_when_its_batch_forms() -> None:
    db, batcher, first = await _first_batch_in_flight()
    gone = {"left": False}
    leaving = asyncio.ensure_future(batcher.submit(2, lambda: gone["left"]))
    staying = asyncio.ensure_future(batcher.submit(4, _stays))
    gone["left"] = True  # it leaves while it waits
    db.release.set()
    await first
    with pytest.raises(group_commit.ClientLeft):
        await leaving
    assert await staying == 40
    assert db.batches == [[0], [4]]  # never sent
    assert batcher.dropped == 1


async def test_a_cancelled_waiter_is_skipped_and_its_batch_still_answers_the_others() -> None:
    db, batcher, first = await _first_batch_in_flight()
    cancelled = asyncio.ensure_future(batcher.submit(2, _stays))
    staying = asyncio.ensure_future(batcher.submit(4, _stays))
    await async_wait_for(lambda: batcher.waiting == 2, timeout_s=5, what="two waiting")
    cancelled.cancel()
    db.release.set()
    await first
    assert await staying == 40
    assert cancelled.cancelled()
    assert db.batches == [[0], [4]]


async def test_one_object_per_event_loop() -> None:
    per_loop = group_commit.PerLoop(object)
    here = per_loop.get()
    assert per_loop.get() is here

    def elsewhere() -> object:
        async def get() -> object:
            return per_loop.get()

        return run_on_own_loop(get())

    other = await asyncio.get_running_loop().run_in_executor(None, elsewhere)
    assert other is not here
