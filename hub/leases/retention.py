"""What the lease control plane keeps, and for how long: rows and keys that otherwise only grow.

- ``Command`` rows (three or more per lease) are the outbox, not the record: a lease's own row
  keeps its states, times, end reason, failure and exit tail, and the ledger keeps the money.
  Commands of a lease that ended more than COMMAND_RETENTION_DAYS ago are deleted in batches
  of PRUNE_BATCH, at most PRUNE_BATCHES per run, so one run never holds a lock or the worker
  for long and a backlog of months drains over a few runs. A lease that still holds GPUs keeps
  its commands (the stuck-release flag quotes its last release error).
- A lease's live-log backlog in Redis lives BACKLOG_TTL_S (24 h) after its last chunk; once the
  lease has ended it is dropped LOG_BACKLOG_AFTER_END_S later (the exit-time ``log_tail`` in
  Postgres stays), so a day of chatty leases does not sit in Redis's memory.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from hub.leases import logs as lease_logs
from hub.leases.models import Command, Lease

log = logging.getLogger(__name__)

PRUNE_BATCH = 1000
PRUNE_BATCHES = 50
BACKLOG_BATCH = 500
FINISHED_LEASES = [Lease.State.ENDED, Lease.State.FAILED]
ANSWERED = [Command.State.ACKED, Command.State.FAILED]


def prune_commands(now: datetime | None = None) -> int:
    """Delete the commands of leases that ended before the retention window; how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.COMMAND_RETENTION_DAYS)
    finished = Lease.objects.filter(state__in=FINISHED_LEASES, ended_at__lt=cutoff).exclude(
        lease_gpus__active=True
    )
    deleted = 0
    for _ in range(PRUNE_BATCHES):
        batch = list(
            Command.objects.filter(lease__in=finished.values("pk"), state__in=ANSWERED)
            # No order (the model's default is created_at): any 1,000 will do, and the
            # planner may stop at the first 1,000 instead of sorting every candidate.
            .order_by()
            .values_list("pk", flat=True)[:PRUNE_BATCH]
        )
        if not batch:
            break
        # Each batch its own statement and transaction: short row locks, progress kept.
        count, _ = Command.objects.filter(pk__in=batch).delete()
        deleted += count
        if len(batch) < PRUNE_BATCH:
            break
    if deleted:
        log.info("pruned %d commands of leases ended before %s", deleted, cutoff.isoformat())
    return deleted


def drop_ended_backlogs(now: datetime | None = None) -> int:
    """Delete the live-log backlogs of leases that ended LOG_BACKLOG_AFTER_END_S ago; how many
    leases were looked at. Only those that crossed the mark since about the last run (twice the
    interval, so one late run misses nothing); older ones' keys expire by their TTL anyway."""
    now = now or timezone.now()
    after_end = timedelta(seconds=settings.LOG_BACKLOG_AFTER_END_S)
    window = timedelta(seconds=2 * settings.LEASE_RETENTION_INTERVAL_S)
    ended = Q(ended_at__lt=now - after_end, ended_at__gte=now - after_end - window)
    lease_ids = [
        str(pk)
        for pk in Lease.objects.filter(ended, state__in=FINISHED_LEASES).values_list(
            "pk", flat=True
        )
    ]
    for start in range(0, len(lease_ids), BACKLOG_BATCH):
        lease_logs.drop_backlogs(lease_ids[start : start + BACKLOG_BATCH])
    return len(lease_ids)


@shared_task(name="leases.prune_commands")
def prune_commands_task() -> int:
    """The beat entry: bounded work, idempotent, nothing lost if a run is skipped."""
    drop_ended_backlogs()
    return prune_commands()
