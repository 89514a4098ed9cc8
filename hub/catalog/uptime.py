"""Hosts' share of the last 7 days online, from their transition history: exact for one page
(a host's own page, a rental's), and written to ``Host.uptime_7d`` for every host by the beat
every UPTIME_REFRESH_S, which the offers read (filtering on a column, not on every host's
history, at 10,000 hosts)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import OuterRef, Subquery
from django.utils import timezone

from hub.suppliers.models import Host, HostTransition

UPTIME_WINDOW = timedelta(days=7)
REFRESH_BATCH = 1000


def uptime(host_ids: list[int], now: datetime | None = None) -> dict[int, float]:
    """Each host's fraction of the window spent online, from its transition history."""
    now = now or timezone.now()
    start = now - UPTIME_WINDOW
    before = HostTransition.objects.filter(host=OuterRef("pk"), at__lt=start).order_by("-at")
    hosts = {
        h.pk: h
        for h in Host.objects.filter(pk__in=host_ids).annotate(
            status_before=Subquery(before.values("to_status")[:1])
        )
    }
    result: dict[int, float] = {}
    history: dict[int, list[tuple[str, datetime]]] = {}
    rows = (
        HostTransition.objects.filter(host_id__in=host_ids, at__gte=start)
        .order_by("host_id", "at")
        .values_list("host_id", "to_status", "at")
    )
    for host_id, status, at in rows:
        history.setdefault(host_id, []).append((status, at))
    for host_id, host in hosts.items():
        # Before its first transition the host did not exist for us: not counted as downtime.
        begin = max(start, host.created_at)
        if host.status_before is None and history.get(host_id):
            begin = max(begin, history[host_id][0][1])
        if begin >= now:
            result[host_id] = 1.0 if host.status == Host.Status.ONLINE else 0.0
            continue
        status, online = host.status_before or Host.Status.OFFLINE, 0.0
        cursor = begin
        for to_status, at in history.get(host_id, []):
            if at <= begin:
                status = to_status
                continue
            if status == Host.Status.ONLINE:
                online += (min(at, now) - cursor).total_seconds()
            cursor, status = at, to_status
        if status == Host.Status.ONLINE:
            online += (now - cursor).total_seconds()
        result[host_id] = max(0.0, min(1.0, online / (now - begin).total_seconds()))
    return result


def refresh_uptimes(now: datetime | None = None) -> int:
    """Write every host's uptime to ``Host.uptime_7d``, a batch at a time; how many changed."""
    now = now or timezone.now()
    changed, last = 0, 0
    while True:
        batch = list(
            Host.objects.filter(pk__gt=last)
            .order_by("pk")
            .values_list("pk", "uptime_7d")[:REFRESH_BATCH]
        )
        if not batch:
            return changed
        last = batch[-1][0]
        fresh = uptime([pk for pk, _ in batch], now)
        stale = [
            Host(pk=pk, uptime_7d=round(fresh[pk], 4))
            for pk, old in batch
            if pk in fresh and abs(fresh[pk] - old) >= 0.0001
        ]
        Host.objects.bulk_update(stale, ["uptime_7d"])
        changed += len(stale)
