"""Group commit on one event loop: requests that arrive while a batch is in flight join the next
batch, and a batch is one trip to the database whatever its size.

A reconnect storm brings thousands of sockets at once, each with a token to check and a host to
register. One at a time, each is a thread hop and a few round trips, and a web process's
threads spend the storm waiting (docs/benchmarks.md). Batched, a storm costs one trip per batch
of up to ``batch_max``; quiet, a request is a batch of one, as fast as before. Used by the
agents' token checks (hub/agents/token_batch.py) and registrations (registration_batch.py).

When a batch's turn comes, the requests whose client has already gone (it gave up waiting, or
Daphne's handshake timeout closed it) are dropped there, answered ``ClientLeft``, never sent.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Request = TypeVar("Request")
Result = TypeVar("Result")
Item = TypeVar("Item")


class ClientLeft(Exception):
    """The client closed its socket while its request waited for a batch."""


class Batcher(Generic[Request, Result]):
    """One event loop's waiting requests. Not thread-safe: the loop's thread only."""

    def __init__(
        self,
        # The batch's answers in its requests' order: a result, or the exception that request
        # raises.
        run_batch: Callable[[list[Request]], Awaitable[Sequence[Result | Exception]]],
        *,
        batch_max: int,
        in_flight_max: int,
        on_dropped: Callable[[], object] = lambda: None,  # e.g. a metric's inc
    ) -> None:
        self._run_batch = run_batch
        self._on_dropped = on_dropped
        self.batch_max = batch_max
        self.in_flight_max = in_flight_max
        self._waiting: list[tuple[Request, Callable[[], bool], asyncio.Future[Result]]] = []
        self.in_flight = 0
        self.dropped = 0  # requests skipped because their client had left
        self.batches = 0  # batches sent (the tests and the bench read it)
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, request: Request, client_left: Callable[[], bool]) -> Result:
        """The request's result from the next batch; ClientLeft if its client goes before the
        batch starts; or the exception the batch gave for it."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((request, client_left, future))
        self.start()
        return await future

    @property
    def waiting(self) -> int:
        """Requests waiting for a batch."""
        return len(self._waiting)

    def start(self) -> None:
        """Send the waiting requests, as many batches as the in-flight bound allows."""
        while self._waiting and self.in_flight < self.in_flight_max:
            batch = self._waiting[: self.batch_max]
            self._waiting = self._waiting[self.batch_max :]
            self.in_flight += 1
            # A context of its own: a batch serves many sockets, so it must not run in (and
            # log with the bindings of, hub.lib.logjson) whichever one started it. Held here
            # until done: the loop keeps only a weak reference to a task.
            task = asyncio.get_running_loop().create_task(
                self._run(batch), context=contextvars.Context()
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(
        self, batch: list[tuple[Request, Callable[[], bool], asyncio.Future[Result]]]
    ) -> None:
        try:
            wanted: list[tuple[Request, asyncio.Future[Result]]] = []
            for request, client_left, future in batch:
                if future.done():  # its waiter was cancelled (its socket's task ended)
                    continue
                if client_left():
                    self.dropped += 1
                    self._on_dropped()
                    future.set_exception(ClientLeft())
                else:
                    wanted.append((request, future))
            if wanted:
                self.batches += 1
                outcomes = await self._run_batch([request for request, _ in wanted])
                for (_, future), outcome in zip(wanted, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        except Exception as exc:  # every waiter learns it; each socket answers for itself
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self.in_flight -= 1
            self.start()


class PerLoop(Generic[Item]):
    """One object per running event loop, made on first use (tests run several loops in one
    process; a batch's futures belong to one loop)."""

    def __init__(self, factory: Callable[[], Item]) -> None:
        self._factory = factory
        self._items: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Item] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> Item:
        loop = asyncio.get_running_loop()
        item = self._items.get(loop)
        if item is None:
            item = self._items[loop] = self._factory()
        return item

    def all(self) -> list[Item]:
        """Every loop's object (the process's counters are their sum)."""
        return list(self._items.values())
