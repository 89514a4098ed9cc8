"""Full garbage collections of the web process on a bounded schedule (issue 23 item 3).

hub/serve.py made CPython's own full collections about 100 times rarer (a full collection
over a few million objects paused the event loop 1.5-2 s), and since issue 18 turns them off;
at the soak's allocation rate they came about every 4 hours, and big strings do not count
towards them at all. Whatever a cycle holds (a response body, before hub/asgi.py's fix) would
then wait that long. So a full collection runs when ``interval_s`` has passed since the last
one (any other full collection counts as well), or sooner, though never closer than
``min_gap_s``, once ``large_bytes`` of large responses (each at least
``large_response_bytes``) went out since. After it, glibc's ``malloc_trim`` gives freed heap
pages back: MB-sized bodies built in several threads leave them in arenas.

A due collection waits while the process is busy accepting connections (issue 18): during a
reconnect storm a full collection over the returning sockets' objects paused the web process for
5.8-6.8 s on a loaded VM, longer than Daphne's 5 s handshake timeout, so every handshake in
flight failed and came back later. A tick that follows ``busy_connects`` or more new
connections since the one before defers it, for at most ``max_defer_s`` past due (a storm
of 10,000 agents is meant to be over within 60 s; a process that never stops accepting is
still collected). CPython's own full collections are off in the web process for the same
reason (hub/serve.py's GC_THRESHOLDS): the schedule is what runs them.

Django-free: the web process drives ``tick`` from its reactor, counts responses with
``note_response`` and connections with ``note_connection``, and registers ``on_gc`` in
``gc.callbacks``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

INTERVAL_S = 600.0
MIN_GAP_S = 30.0
LARGE_RESPONSE_BYTES = 1024 * 1024
LARGE_BYTES = 1024 * 1024 * 1024
# New connections between two ticks (5 s apart in the web process) that make it a storm: 20/s.
BUSY_CONNECTS = 100
MAX_DEFER_S = 120.0


@dataclass(frozen=True)
class Collection:
    reason: str  # "interval" or "large responses"
    unreachable: int  # what gc.collect() found
    paused_s: float  # the collection and the trim, the event loop's pause
    deferred_s: float = 0.0  # how long it waited for a storm of connections to pass


def _glibc_malloc_trim() -> Callable[[], object] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl and others have none
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class FullCollections:
    def __init__(
        self,
        *,
        interval_s: float = INTERVAL_S,
        min_gap_s: float = MIN_GAP_S,
        large_response_bytes: int = LARGE_RESPONSE_BYTES,
        large_bytes: int = LARGE_BYTES,
        busy_connects: int = BUSY_CONNECTS,
        max_defer_s: float = MAX_DEFER_S,
        clock: Callable[[], float] = time.monotonic,
        collect: Callable[[int], int] = gc.collect,
        trim: Callable[[], object] | None = None,
    ) -> None:
        if interval_s <= 0 or min_gap_s < 0 or min_gap_s > interval_s:
            raise ValueError("need 0 <= min_gap_s <= interval_s and interval_s > 0")
        self.interval_s = interval_s
        self.min_gap_s = min_gap_s
        self.large_response_bytes = large_response_bytes
        self.large_bytes = large_bytes
        self._clock = clock
        self._collect = collect
        self._trim = trim if trim is not None else _glibc_malloc_trim()
        self.last_full_at = clock()
        self.large_since = 0  # bytes of large responses since the last full collection
        self.busy_connects = busy_connects
        self.max_defer_s = max_defer_s
        self.connects = 0  # new connections since the last tick
        self.due_since: float | None = None  # when a deferred collection became due

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        """For ``gc.callbacks``: any full collection, CPython's own too, restarts the clock."""
        if phase == "stop" and info.get("generation") == 2:
            self.last_full_at = self._clock()
            self.large_since = 0

    def note_response(self, size: int) -> None:
        if size >= self.large_response_bytes:
            self.large_since += size

    def note_connection(self) -> None:
        self.connects += 1

    def due(self) -> str | None:
        """Why a full collection is due now, or None."""
        waited = self._clock() - self.last_full_at
        if waited >= self.interval_s:
            return "interval"
        if self.large_since >= self.large_bytes and waited >= self.min_gap_s:
            return "large responses"
        return None

    def tick(self) -> Collection | None:
        """Collect if due (call every few seconds); what it did, or None."""
        busy = self.connects >= self.busy_connects
        self.connects = 0
        reason = self.due()
        if reason is None:
            self.due_since = None
            return None
        now = self._clock()
        if self.due_since is None:
            self.due_since = now
        deferred_s = now - self.due_since
        if busy and deferred_s < self.max_defer_s:
            return None  # a storm of connections: after it, or at the bound
        self.due_since = None
        started = time.perf_counter()
        unreachable = self._collect(2)
        if self._trim is not None:
            self._trim()
        paused_s = time.perf_counter() - started
        # Also when gc.callbacks does not hold on_gc (tests, or the collector disabled).
        self.last_full_at = self._clock()
        self.large_since = 0
        return Collection(
            reason=reason, unreachable=unreachable, paused_s=paused_s, deferred_s=deferred_s
        )
