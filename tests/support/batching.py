"""Holding a group-commit batcher (hub/lib/group_commit.py) at its in-flight bound, as a storm's
sockets ahead would: requests made inside the block queue; on leaving it they form the next
batch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from hub.lib.group_commit import Batcher


@asynccontextmanager
async def busy(batcher: Batcher[Any, Any]) -> AsyncIterator[None]:
    assert batcher.in_flight == 0, "a batch of another test is still in flight"
    batcher.in_flight = batcher.in_flight_max
    try:
        yield
    finally:
        batcher.in_flight = 0
        batcher.start()
