"""Waiting in tests: poll for a condition with a deadline, never sleep a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _polls(probe: Callable[[], T | None], timeout_s: float, what: str) -> Iterator[T | None]:
    """``probe``'s answers, one per poll, until the deadline fails the test; the caller stops
    at the first truthy one and waits between the others in its own way."""
    deadline = time.monotonic() + timeout_s
    while True:
        yield probe()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns something truthy; fail the test at the deadline."""
    for result in _polls(probe, timeout_s, what):
        if result:
            return result
        time.sleep(interval_s)
    raise AssertionError("unreachable")


async def async_wait_for(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.01,
    what: str = "condition",
) -> T:
    """``wait_for`` on an event loop: the loop runs its other tasks between the probes."""
    for result in _polls(probe, timeout_s, what):
        if result:
            return result
        await asyncio.sleep(interval_s)
    raise AssertionError("unreachable")
