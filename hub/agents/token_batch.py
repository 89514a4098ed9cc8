"""New sockets' token checks, batched per web process (group commit, hub/lib/group_commit.py).

In a storm of one-host suppliers no socket shares its token with another, so neither the cache
of accepted tokens (token_cache.py) nor sharing a check in flight helps: each socket's check was
a query of its own, four at a time on the database threads, and thousands queued behind those
four until Daphne's 5 s handshake timeout cut them and they came back to queue again (23,018
cut handshakes in the 10,000 storm, docs/benchmarks.md). Here the checks that arrive while a
batch is in flight join the next one: one ``digest IN (...)`` query (and at most one
``last_used_at`` update) per batch of up to BATCH_MAX tokens, whatever their number.
"""

from __future__ import annotations

from collections.abc import Callable

from hub.agents.db_threads import in_db_thread
from hub.lib import group_commit, metrics, tokens
from hub.suppliers.services import authenticate_agent_tokens

# Checks in one batch at most: one row of the IN list each, and its answer waits for all.
BATCH_MAX = 500
# Batches in flight per process at most: the sockets' other queries (registration batches,
# acks) keep the rest of the database threads (AGENT_DB_THREADS, 4 by default).
IN_FLIGHT_MAX = 2


async def _check_batch(plaintexts: list[str]) -> list[int | None | Exception]:
    accepted: dict[str, int] = await in_db_thread(authenticate_agent_tokens)(plaintexts)
    return [accepted.get(tokens.digest(plaintext)) for plaintext in plaintexts]


batchers: group_commit.PerLoop[group_commit.Batcher[str, int | None]] = group_commit.PerLoop(
    lambda: group_commit.Batcher(
        _check_batch,
        batch_max=BATCH_MAX,
        in_flight_max=IN_FLIGHT_MAX,
        on_dropped=metrics.HANDSHAKES_DROPPED.labels("token").inc,
    )
)


async def check(plaintext: str, client_left: Callable[[], bool]) -> int | None:
    """The token's id if the database accepts it, else None, from the next batch; ClientLeft
    (hub.lib.group_commit) if the client goes before the batch starts."""
    return await batchers.get().submit(plaintext, client_left)


def dropped() -> int:
    """Checks of this process skipped because their client had left."""
    return sum(batcher.dropped for batcher in batchers.all())
