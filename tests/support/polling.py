"""Waiting in tests: poll for a condition with a deadline, never sleep a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


async def async_wait_for(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.01,
    what: str = "condition",
) -> T:
    """``wait_for`` on an event loop: the loop runs its other tasks between the probes."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)
