"""Which due webhook deliveries a run posts.

A run posts its batch at once and waits for the slowest answer, so who gets a batch's places
decides who waits on whom:

- Fair between accounts: each account takes at most ``per_account`` places, and every
  account's first delivery comes before any account's second, so one account's backlog (ten
  endpoints down for an hour) never pushes another account's delivery past the next run.
- Each endpoint takes at most ``per_endpoint`` places (a test event first: it is waited for).
- Two lanes: an endpoint whose last SLOW_AFTER_FAILURES attempts failed in a row is served
  by the slow lane, in small batches by one run at a time, so endpoints that answer are never
  held in a batch behind ones that time out. One success moves it back.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from hub.notifications import delivery
from hub.notifications.kinds import TEST_KIND
from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint

HEALTHY = "healthy"
SLOW = "slow"
SLOW_AFTER_FAILURES = 3
# pg_try_advisory_lock key held by the one slow-lane run (any number no other lock uses).
_SLOW_LANE_LOCK = 0x5F1A4E01


@dataclass(frozen=True)
class Lane:
    batch: int
    per_endpoint: int
    per_account: int


LANES = {
    HEALTHY: Lane(batch=delivery.CONCURRENCY, per_endpoint=10, per_account=16),
    SLOW: Lane(batch=16, per_endpoint=2, per_account=4),
}

_DUE = """
WITH due AS (
    SELECT d.id, d.next_attempt_at, w.account_id, e.kind = %(test_kind)s AS test,
        row_number() OVER (
            PARTITION BY d.endpoint_id
            ORDER BY e.kind = %(test_kind)s DESC, d.next_attempt_at, d.id
        ) AS in_endpoint
    FROM {delivery} d
    JOIN {endpoint} w ON w.id = d.endpoint_id
    JOIN {event} e ON e.id = d.event_id
    WHERE d.state = %(pending)s AND d.next_attempt_at <= %(now)s
        AND (w.consecutive_failures >= %(slow_after)s) = %(slow)s
), kept AS (
    SELECT id, next_attempt_at,
        row_number() OVER (
            PARTITION BY account_id ORDER BY test DESC, next_attempt_at, id
        ) AS in_account
    FROM due
    WHERE in_endpoint <= %(per_endpoint)s
)
SELECT id FROM kept
WHERE in_account <= %(per_account)s
ORDER BY in_account, next_attempt_at, id
LIMIT %(batch)s
"""


def due(lane: str, now: datetime) -> list[int]:
    """The ids of the due deliveries of ``lane`` the next batch takes, in order. (Picked
    without a lock, as Postgres takes no row locks with a window function: the caller locks.)"""
    spec = LANES[lane]
    sql = _DUE.format(
        delivery=WebhookDelivery._meta.db_table,
        endpoint=WebhookEndpoint._meta.db_table,
        event=Event._meta.db_table,
    )
    params = {
        "test_kind": TEST_KIND,
        "pending": WebhookDelivery.State.PENDING,
        "now": now,
        "slow_after": SLOW_AFTER_FAILURES,
        "slow": lane == SLOW,
        "per_endpoint": spec.per_endpoint,
        "per_account": spec.per_account,
        "batch": spec.batch,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def slow_lane_due(now: datetime) -> bool:
    return WebhookDelivery.objects.filter(
        state=WebhookDelivery.State.PENDING,
        next_attempt_at__lte=now,
        endpoint__consecutive_failures__gte=SLOW_AFTER_FAILURES,
    ).exists()


@contextmanager
def slow_lane_turn() -> Iterator[bool]:
    """Whether this run is the slow lane's one run now (a session lock: a worker that dies
    drops it with its connection)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_SLOW_LANE_LOCK])
        mine = bool(cursor.fetchone()[0])
    try:
        yield mine
    finally:
        if mine:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [_SLOW_LANE_LOCK])
