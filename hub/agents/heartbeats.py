"""A heartbeat arrived: everything the hub does about it, in one place.

Per connection (``Connection``, kept by the agent socket): liveness always goes to Redis, in one
group-committed write with other hosts' (heartbeat_batch.py); telemetry only when it changed or
HOST_STATS_WRITE_INTERVAL_S passed, never more often than half a heartbeat interval, and to
Postgres directly while Redis is down; newly seen foreign compute processes are flagged; and a
host the offline sweep marked offline while this socket stayed open (a stalled agent, a slow
network) is brought back on this very heartbeat (hub/leases/host_status.py), not on the next flush.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from hub.agents import heartbeat_batch, stats
from hub.leases import host_status
from hub.leases.models import Lease
from hub.lib import metrics
from hub.suppliers.models import Gpu
from supplier_agent.protocol import Heartbeat, encode

log = logging.getLogger(__name__)

# How the socket runs a database call (its own thread pool, see consumers.py).
DbCall = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]


@dataclass(slots=True)
class Connection:
    """What one agent socket remembers between heartbeats. Slots and a shared empty frozenset:
    ten thousand of these live in one web process (docs/benchmarks.md, memory per socket)."""

    signature: tuple[object, ...] | None = None
    written_at: float = 0.0
    flagged: frozenset[str] = frozenset()  # leases flagged for foreign processes
    # Set by the sweep's "agent.marked_offline" event: the next heartbeat brings the host back.
    marked_offline: bool = False


async def arrived(conn: Connection, host_id: int, message: Heartbeat, db: DbCall) -> None:
    now = time.time()
    if conn.marked_offline:
        conn.marked_offline = False
        await db(host_status.host_back)(host_id, "heartbeat")
    signature = telemetry_signature(message)
    since_write = now - conn.written_at
    # A floor between writes whatever changed: a chatty agent cannot hammer Postgres.
    due = since_write >= settings.AGENT_HEARTBEAT_INTERVAL_S / 2 and (
        signature != conn.signature or since_write >= settings.HOST_STATS_WRITE_INTERVAL_S
    )
    try:
        await heartbeat_batch.record(
            host_id,
            now + settings.HOST_OFFLINE_AFTER_S,
            heartbeat_batch.pending_entry(encode(message), now) if due else None,
        )
    except RedisError as exc:
        metrics.STORE_ERRORS.labels("redis").inc()
        log.warning("heartbeat not recorded in Redis (%s); writing to Postgres", exc)
        due = since_write >= settings.AGENT_HEARTBEAT_INTERVAL_S / 2
        if due:
            await db(write_heartbeat_stats)(host_id, message)
    if due:
        conn.signature = signature
        conn.written_at = now
    # Two in-process writes to memory-mapped values (hub/lib/metrics.py): no I/O, no syscall.
    metrics.HEARTBEATS.inc()
    metrics.HEARTBEAT_SECONDS.observe(time.time() - now)
    found = foreign_processes(message)
    if found and not conn.flagged.issuperset(found):
        await db(flag_foreign_processes)(host_id, found)
        conn.flagged = conn.flagged.union(found)


def telemetry_signature(message: Heartbeat) -> tuple[object, ...]:
    """What counts as a change worth an immediate Postgres write: a new compute process or
    claim, utilisation crossing a quarter (idle, light, busy, full), memory in 4 GiB steps.
    Finer changes wait for the periodic write, so a busy GPU whose load jitters every second
    does not cost a row update per heartbeat."""
    return (
        tuple(
            (
                g.index,
                min(g.utilization_pct // 25, 3),
                g.memory_used_bytes >> 32,
                tuple(sorted(p.pid for p in g.processes)),
            )
            for g in message.gpus
        ),
        tuple(sorted(c.lease_id for c in message.claims)),
    )


def write_heartbeat_stats(host_id: int, message: Heartbeat) -> None:
    """One host's full telemetry, now (the agent socket's path when Redis is down; otherwise
    telemetry goes through Redis and the flush task, many hosts at a time)."""
    stats.write([stats.HostStats(host_id=host_id, at=timezone.now(), message=message)])


@dataclass(frozen=True)
class ForeignProcess:
    gpu_index: int
    pid: int
    name: str


def foreign_processes(message: Heartbeat) -> dict[str, list[ForeignProcess]]:
    """Per lease, the compute processes on its GPUs that are not in its container. Pure and
    cheap: it runs on every heartbeat, in the consumer, without a query."""
    by_gpu = {gpu.index: gpu.processes for gpu in message.gpus}
    found: dict[str, list[ForeignProcess]] = {}
    for claim in message.claims:
        ours = set(claim.pids)
        for index in claim.gpu_indices:
            for process in by_gpu.get(index, ()):
                if process.pid not in ours:
                    found.setdefault(claim.lease_id, []).append(
                        ForeignProcess(index, process.pid, process.name or "unknown")
                    )
    return found


def flag_foreign_processes(host_id: int, found: dict[str, list[ForeignProcess]]) -> None:
    """Mark the leases and GPUs where another platform's processes showed up (renter and admin
    see it); the first sighting is kept. One transaction: nobody reads the lease flagged and
    its GPU not yet (the admin's GPU list and the renter's lease page agree)."""
    now = timezone.now()
    indices = {p.gpu_index for processes in found.values() for p in processes}
    with transaction.atomic():
        Lease.objects.filter(
            host_id=host_id, pk__in=list(found), foreign_process_seen_at__isnull=True
        ).update(foreign_process_seen_at=now)
        Gpu.objects.filter(
            host_id=host_id, index__in=indices, foreign_process_seen_at__isnull=True
        ).update(foreign_process_seen_at=now)
    for lease_id, processes in found.items():
        names = ", ".join(f"GPU {p.gpu_index}: {p.name} (pid {p.pid})" for p in processes)
        log.warning("host %s, lease %s: foreign compute processes: %s", host_id, lease_id, names)
