"""Celery tasks: make due events' webhook deliveries and send their email, post due
deliveries, prune.

Each is safe to run twice at once: rows are claimed under skip-locked row locks."""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from hub.celery import app as celery_app
from hub.notifications import delivery, mailing, picking
from hub.notifications.kinds import TEST_KIND
from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint

log = logging.getLogger(__name__)

DELIVER_TASK = "notifications.deliver_webhooks"
EVENT_BATCH = 200
PROCESS_BUDGET_S = 20.0
DELIVERY_BATCH = picking.LANES[picking.HEALTHY].batch
PER_ENDPOINT_IN_BATCH = picking.LANES[picking.HEALTHY].per_endpoint
PER_ACCOUNT_IN_BATCH = picking.LANES[picking.HEALTHY].per_account
PRUNE_BATCH = 1000


def _queue_deliveries(lane: str = picking.HEALTHY) -> None:
    kwargs = {"lane": lane} if lane != picking.HEALTHY else {}
    transaction.on_commit(
        lambda: celery_app.send_task(DELIVER_TASK, kwargs=kwargs, ignore_result=True),
        robust=True,
    )


@shared_task(name="notifications.process_events")
def process_events() -> int:
    """Make each due event's webhook deliveries, then email it (unless muted); how many
    events were handled."""
    # Webhooks first, and apart from email: a mail server that is down or slow (each try
    # near EMAIL_TIMEOUT) holds no webhook. The budget bounds the worker's time; the next
    # sweep goes on where this one stopped.
    stop_at = time.monotonic() + PROCESS_BUDGET_S
    handled: set[uuid.UUID] = set()
    while time.monotonic() <= stop_at:
        made = _make_deliveries()
        handled.update(made)
        if len(made) < EVENT_BATCH:
            break
    handled |= mailing.send_due(stop_at)
    return len(handled)


def _make_deliveries() -> list[uuid.UUID]:
    """One batch of due events' deliveries, to every enabled endpoint that wants the kind;
    the events' ids."""
    now = timezone.now()
    with transaction.atomic():
        events = list(
            Event.objects.select_for_update(skip_locked=True)
            .filter(state=Event.State.PENDING, webhooks_made=False, due_at__lte=now)
            .order_by("due_at")[:EVENT_BATCH]
        )
        if not events:
            return []
        endpoints: dict[int, list[WebhookEndpoint]] = defaultdict(list)
        # A deactivated account gets no webhooks (nor email: emails.wanted).
        for endpoint in WebhookEndpoint.objects.filter(
            account_id__in={e.account_id for e in events}, enabled=True, account__is_active=True
        ):
            endpoints[endpoint.account_id].append(endpoint)
        rows = [
            WebhookDelivery(event=event, endpoint=endpoint, next_attempt_at=now)
            for event in events
            for endpoint in endpoints[event.account_id]
            if endpoint.wants(event.kind)
        ]
        WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
        ids = [event.pk for event in events]
        Event.objects.filter(pk__in=ids).update(webhooks_made=True)
        if rows:
            _queue_deliveries()
    return ids


@shared_task(name="notifications.deliver_webhooks")
def deliver_webhooks(lane: str = picking.HEALTHY) -> int:
    """Post one batch of ``lane``'s due deliveries; how many were tried. The healthy lane's
    run queues the slow lane's when it has work (picking.py says why two)."""
    if lane == picking.SLOW:
        with picking.slow_lane_turn() as mine:
            return _deliver(picking.SLOW) if mine else 0
    tried = _deliver(picking.HEALTHY)
    if picking.slow_lane_due(timezone.now()):
        _queue_deliveries(picking.SLOW)
    return tried


def _deliver(lane: str) -> int:
    now = timezone.now()
    picked = picking.due(lane, now)
    if not picked:
        return 0
    claim_until = now + timedelta(seconds=delivery.batch_seconds(len(picked)) + 60)
    with transaction.atomic():
        batch = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("event", "endpoint", "endpoint__account")
            .filter(pk__in=picked, state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now)
        )
        # Claimed: a run that starts before this one recorded its outcomes leaves them alone.
        WebhookDelivery.objects.filter(pk__in=[row.pk for row in batch]).update(
            next_attempt_at=claim_until
        )
    requests = [
        delivery.Request(
            delivery_id=row.pk,
            url=row.endpoint.url,
            secret=row.endpoint.secret,
            body=delivery.body(row.event),
            event_id=str(row.event_id),
            kind=row.event.kind,
        )
        for row in batch
        if _why_not_sent(row) is None
    ]
    outcomes = {o.delivery_id: o for o in delivery.post_all(requests)}
    finished = timezone.now()
    for row in batch:
        _record(row, outcomes.get(row.pk), finished, claim_until)
    return len(requests)


def _why_not_sent(row: WebhookDelivery) -> str | None:
    if not row.endpoint.account.is_active:
        return "the account is deactivated"
    if not row.endpoint.enabled:
        return "the endpoint is off"
    return None


def _record(
    row: WebhookDelivery, outcome: delivery.Outcome | None, now: datetime, claimed: datetime
) -> None:
    # Only while the claim is this run's: a row whose endpoint or event went meanwhile, or
    # that another run took over, is left as it is.
    mine = WebhookDelivery.objects.filter(
        pk=row.pk, state=WebhookDelivery.State.PENDING, next_attempt_at=claimed
    )
    # A test event is tried once: its owner is watching the log for this one answer, and a
    # receiver that is down would otherwise hold the button for a day.
    once = row.event.kind == TEST_KIND
    give_up_at = row.created_at + timedelta(seconds=settings.WEBHOOK_RETRY_FOR_S)
    if outcome is None:  # not sent: kept for when the endpoint is on again, within the day
        why = _why_not_sent(row) or "not sent"
        if once or now > give_up_at or not row.endpoint.account.is_active:
            mine.update(state=WebhookDelivery.State.FAILED, last_error=why)
        else:
            mine.update(next_attempt_at=min(now + timedelta(hours=1), give_up_at))
        return
    fields: dict[str, Any] = {
        "attempts": row.attempts + 1,
        "last_attempt_at": now,
        "last_status": outcome.status,
        "last_error": outcome.error,
        "duration_ms": outcome.duration_ms,
    }
    if outcome.ok:
        fields |= {"state": WebhookDelivery.State.DELIVERED, "delivered_at": now}
        if mine.update(**fields):
            WebhookEndpoint.objects.filter(pk=row.endpoint_id).update(
                last_success_at=now, consecutive_failures=0
            )
        return
    next_at = now + delivery.retry_delay(row.attempts + 1)
    if once or next_at > give_up_at:
        fields["state"] = WebhookDelivery.State.FAILED
    else:
        fields["next_attempt_at"] = next_at
    if mine.update(**fields):
        WebhookEndpoint.objects.filter(pk=row.endpoint_id).update(
            last_failure_at=now, consecutive_failures=F("consecutive_failures") + 1
        )


@shared_task(name="notifications.prune")
def prune(now: datetime | None = None) -> int:
    """Delete events (and their deliveries) older than NOTIFICATION_RETENTION_DAYS that are
    done and have nothing left to deliver; in batches, so one run never holds much."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.NOTIFICATION_RETENTION_DAYS)
    deleted = 0
    for _ in range(50):
        ids = list(
            Event.objects.filter(state=Event.State.DONE, created_at__lt=cutoff)
            .exclude(deliveries__state=WebhookDelivery.State.PENDING)
            .values_list("pk", flat=True)[:PRUNE_BATCH]
        )
        if not ids:
            break
        Event.objects.filter(pk__in=ids).delete()
        deleted += len(ids)
    return deleted
