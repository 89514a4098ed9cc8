"""One asyncio lock per lease, kept only while someone holds or waits for it.

Commands of one lease run one at a time (a release must not overtake its docker_run), but a
lock per lease ever seen is a dict that grows for as long as the agent runs: a supplier's
agent sees tens of thousands of leases in months. The entry goes when its last user leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holding or waiting


class LeaseLocks:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.asynccontextmanager
    async def hold(self, lease_id: str) -> AsyncIterator[None]:
        entry = self._entries.setdefault(lease_id, _Entry())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            # One event loop: nobody can join between the decrement and the removal.
            entry.users -= 1
            if entry.users == 0:
                del self._entries[lease_id]
