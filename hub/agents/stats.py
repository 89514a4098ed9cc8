"""Heartbeat telemetry into Postgres, many hosts per statement.

A heartbeat's liveness lives in Redis; its telemetry reaches Postgres on change or every
HOST_STATS_WRITE_INTERVAL_S, through the pending hash of ``heartbeat_batch`` and the flush task
here. One flush of up to ``BATCH`` hosts costs four statements (hosts, GPUs, sparkline inserts,
sparkline pruning) instead of about six per host, which is what lets one hub hold 10,000 agents
(docs/benchmarks.md). The same code writes a single host when Redis is down.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, connection, transaction

from hub.agents import heartbeat_batch
from hub.leases import host_status
from hub.suppliers.models import GpuSample, Host
from supplier_agent.protocol import Heartbeat, ProtocolError, parse_message

log = logging.getLogger(__name__)

BATCH = 500


@dataclass(frozen=True)
class HostStats:
    host_id: int
    at: datetime
    message: Heartbeat


def pg_offline_after(now: datetime) -> datetime:
    # Conservative: Postgres is refreshed only every stats interval, so its deadline must
    # outlast that interval too; Redis holds the precise one.
    return now + timedelta(
        seconds=settings.HOST_OFFLINE_AFTER_S + settings.HOST_STATS_WRITE_INTERVAL_S
    )


# Never backwards: an entry given back after a failed flush may be older than what a later
# one wrote. unnest() keeps the statement text fixed whatever the batch size, so Postgres
# plans it once and pg_stat_statements counts it as one statement.
_HOSTS_SQL = """
UPDATE suppliers_host AS h
SET last_seen_at = v.at, offline_after = v.offline_after
FROM unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[]) AS v(id, at, offline_after)
WHERE h.id = v.id AND (h.last_seen_at IS NULL OR h.last_seen_at <= v.at)
RETURNING h.id, h.status
"""

_GPUS_SQL = """
UPDATE suppliers_gpu AS g
SET memory_total_bytes = v.total, memory_used_bytes = v.used, utilization_pct = v.util,
    processes = v.processes::jsonb, stats_updated_at = v.at
FROM unnest(%s::bigint[], %s::int[], %s::bigint[], %s::bigint[], %s::int[], %s::text[],
            %s::timestamptz[]) AS v(host_id, idx, total, used, util, processes, at)
WHERE g.host_id = v.host_id AND g."index" = v.idx
  AND (g.stats_updated_at IS NULL OR g.stats_updated_at <= v.at)
RETURNING g.id, v.at, v.util, v.used, v.total
"""


# The hub's round trip to each agent (heartbeat_batch.record_rtt), many hosts at once; only rows
# whose figure changed are touched.
_RTTS_SQL = """
UPDATE suppliers_host AS h
SET rtt_ms = v.rtt
FROM unnest(%s::bigint[], %s::int[]) AS v(id, rtt)
WHERE h.id = v.id AND h.rtt_ms IS DISTINCT FROM v.rtt
"""
RTT_MAX_MS = 2**31 - 1  # the column's int


def write_rtts(rtts: Mapping[int, int]) -> None:
    if not rtts:
        return
    hosts = sorted(rtts)  # the same row order as the telemetry writes: no deadlock between them
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_RTTS_SQL, [hosts, [max(0, min(rtts[host], RTT_MAX_MS)) for host in hosts]])


def write(items: Iterable[HostStats]) -> None:
    """Write the telemetry of many hosts: the newest per host, a GPU the host never registered
    ignored (its next register adds it), an offline host brought back online."""
    for batch in _batches(items):
        _write_isolating(batch)


def _batches(items: Iterable[HostStats]) -> list[list[HostStats]]:
    newest: dict[int, HostStats] = {}
    for item in items:
        if item.host_id not in newest or newest[item.host_id].at <= item.at:
            newest[item.host_id] = item
    # In host order: two writers lock the rows they share in the same order.
    ordered = [newest[host_id] for host_id in sorted(newest)]
    return [ordered[start : start + BATCH] for start in range(0, len(ordered), BATCH)]


def _write_batch(batch: Sequence[HostStats]) -> None:
    gpus = [(item, state) for item in batch for state in item.message.gpus]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _HOSTS_SQL,
            [
                [item.host_id for item in batch],
                [item.at for item in batch],
                [pg_offline_after(item.at) for item in batch],
            ],
        )
        returned = cursor.fetchall()
        back = sorted(host_id for host_id, status in returned if status != Host.Status.ONLINE)
        if not gpus:
            written = []
        else:
            cursor.execute(
                _GPUS_SQL,
                [
                    [item.host_id for item, _ in gpus],
                    [state.index for _, state in gpus],
                    [state.memory_total_bytes for _, state in gpus],
                    [state.memory_used_bytes for _, state in gpus],
                    [state.utilization_pct for _, state in gpus],
                    [_processes_json(state.processes) for _, state in gpus],
                    [item.at for item, _ in gpus],
                ],
            )
            written = cursor.fetchall()
        _record_samples(written)
    for host_id in back:
        host_status.host_back(host_id, "heartbeat (telemetry flush)")


def _processes_json(processes: Iterable[object]) -> str:
    return json.dumps(
        [
            {"pid": p.pid, "name": p.name, "memory_bytes": p.memory_bytes}  # type: ignore[attr-defined]
            for p in processes
        ]
    )


def _record_samples(written: Sequence[tuple[int, datetime, int, int, int]]) -> None:
    """One sparkline point per GPU per telemetry write; older than a day is dropped."""
    if not written:
        return
    GpuSample.objects.bulk_create(
        GpuSample(
            gpu_id=gpu_id,
            at=at,
            utilization_pct=util,
            memory_used_bytes=used,
            memory_total_bytes=total,
        )
        for gpu_id, at, util, used, total in written
    )
    oldest = min(at for _, at, *_ in written) - timedelta(hours=GpuSample.RETENTION_HOURS)
    GpuSample.objects.filter(gpu_id__in=[row[0] for row in written], at__lt=oldest).delete()


# --- the flush task ---------------------------------------------------------------------------


def flush_pending() -> int:
    """Move every host's pending telemetry from Redis to Postgres; returns the hosts written.
    What a failed write took from Redis goes back for the next flush."""
    entries = heartbeat_batch.take_pending()
    items = []
    for host_id, value in entries.items():
        try:
            entry = json.loads(value)
            message = parse_message(entry["frame"])
            at = datetime.fromtimestamp(float(entry["at"]), tz=UTC)
        except (ValueError, KeyError, TypeError, ProtocolError) as exc:
            log.warning("pending telemetry of host %s is unreadable, dropped: %s", host_id, exc)
            continue
        if isinstance(message, Heartbeat):
            items.append(HostStats(host_id=host_id, at=at, message=message))
    batches = _batches(items)
    for done, batch in enumerate(batches):
        try:
            _write_isolating(batch)
        except DatabaseError:
            # Postgres itself failed (not one entry): this batch and the ones after it go back;
            # the ones before are in Postgres.
            left = {item.host_id for later in batches[done:] for item in later}
            heartbeat_batch.give_back({h: v for h, v in entries.items() if h in left})
            raise
    rtts = heartbeat_batch.take_rtts()
    try:
        write_rtts(rtts)
    except DatabaseError:
        heartbeat_batch.give_back_rtts(rtts)
        raise
    return len(items)


# Errors of the data, not of the database: retrying the same entry can only fail again.
_POISON = (DataError, IntegrityError)


def _write_isolating(batch: Sequence[HostStats]) -> None:
    """Write a batch; if some entry cannot be stored, find it by halving and drop it alone
    (logged once, with its host), so one host's bad telemetry never stops the others'."""
    try:
        _write_batch(batch)
    except _POISON as exc:
        if len(batch) == 1:
            log.warning(
                "telemetry of host %s cannot be stored, dropped: %s",
                batch[0].host_id,
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
            return
        middle = len(batch) // 2
        _write_isolating(batch[:middle])
        _write_isolating(batch[middle:])
