"""Celery tasks: send due events (email and webhook deliveries), post due deliveries, prune.

Each is safe to run twice at once: rows are claimed under skip-locked row locks."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from hub.celery import app as celery_app
from hub.notifications import delivery, emails
from hub.notifications.kinds import KINDS
from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint

log = logging.getLogger(__name__)

DELIVER_TASK = "notifications.deliver_webhooks"
EVENT_BATCH = 200
PROCESS_BUDGET_S = 20.0
DELIVERY_BATCH = delivery.CONCURRENCY
# One endpoint's backlog (a receiver down for hours) fills at most this much of a batch, so
# the other endpoints' deliveries go out in the same run.
PER_ENDPOINT_IN_BATCH = 10
EMAIL_ATTEMPTS = 5
PRUNE_BATCH = 1000


def _queue_deliveries() -> None:
    transaction.on_commit(
        lambda: celery_app.send_task(DELIVER_TASK, ignore_result=True), robust=True
    )


@shared_task(name="notifications.process_events")
def process_events() -> int:
    """Email each due event (unless muted) and make its webhook deliveries; how many done."""
    done = 0
    # A slow mail server that still answers (each send near EMAIL_TIMEOUT) must not hold the
    # worker for the whole batch: the next sweep goes on where this one stopped.
    stop_at = time.monotonic() + PROCESS_BUDGET_S
    for _ in range(EVENT_BATCH):
        if time.monotonic() > stop_at:
            break
        outcome = _process_one()
        if outcome is None:
            break
        done += 1
        if not outcome:
            # The mail server failed: the rest would wait on it too (EMAIL_TIMEOUT each) and
            # hold the worker; the next sweep tries again.
            break
    return done


def _process_one() -> bool | None:
    """One due event: None when there is none, False when its email failed."""
    now = timezone.now()
    with transaction.atomic():
        event = (
            Event.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("account")
            .filter(state=Event.State.PENDING, due_at__lte=now)
            .order_by("due_at")
            .first()
        )
        if event is None:
            return None
        endpoints = [
            e
            for e in WebhookEndpoint.objects.filter(account_id=event.account_id)
            if e.wants(event.kind)
        ]
        if endpoints:
            WebhookDelivery.objects.bulk_create(
                [WebhookDelivery(event=event, endpoint=e, next_attempt_at=now) for e in endpoints],
                ignore_conflicts=True,  # made on an earlier try whose email failed
            )
            _queue_deliveries()
        if event.email_state == Event.EmailState.NONE:
            _email(event, now)
        if event.email_state != Event.EmailState.NONE:
            event.state = Event.State.DONE
            event.done_at = now
        event.save(
            update_fields=[
                "state",
                "done_at",
                "due_at",
                "email_state",
                "email_attempts",
                "email_error",
            ]
        )
    return event.state == Event.State.DONE


def _email(event: Event, now: datetime) -> None:
    if event.kind not in KINDS or not emails.wanted(event.account, event.kind):
        event.email_state = Event.EmailState.SKIPPED
        return
    try:
        emails.message(event, event.account).send()
    except Exception as exc:  # SMTP refused, timed out, unreachable: try again later
        event.email_attempts += 1
        event.email_error = f"{type(exc).__name__}: {exc}"[:300]
        log.warning(
            "email for event %s (%s) failed (attempt %d): %s",
            event.pk,
            event.kind,
            event.email_attempts,
            event.email_error,
        )
        if event.email_attempts >= EMAIL_ATTEMPTS:
            event.email_state = Event.EmailState.FAILED
        else:
            event.due_at = now + timedelta(seconds=60 * event.email_attempts)
        return
    event.email_state = Event.EmailState.SENT


@shared_task(name="notifications.deliver_webhooks")
def deliver_webhooks() -> int:
    """Post every due delivery once; how many were tried."""
    now = timezone.now()
    # At most PER_ENDPOINT_IN_BATCH of each endpoint's oldest, then the oldest of those: one
    # endpoint's backlog cannot fill the batch. (Picked without a lock, as Postgres takes no
    # row locks with a window function, and locked below.)
    ranked = (
        WebhookDelivery.objects.filter(
            state=WebhookDelivery.State.PENDING, next_attempt_at__lte=now
        )
        .annotate(
            rank=Window(
                RowNumber(), partition_by=[F("endpoint_id")], order_by=F("next_attempt_at").asc()
            )
        )
        .filter(rank__lte=PER_ENDPOINT_IN_BATCH)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:DELIVERY_BATCH]
    )
    picked = list(ranked)
    if not picked:
        return 0
    claim_until = now + timedelta(seconds=delivery.batch_seconds(len(picked)) + 60)
    with transaction.atomic():
        batch = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("event", "endpoint")
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
        if row.endpoint.enabled
    ]
    outcomes = {o.delivery_id: o for o in delivery.post_all(requests)}
    finished = timezone.now()
    for row in batch:
        _record(row, outcomes.get(row.pk), finished, claim_until)
    return len(requests)


def _record(
    row: WebhookDelivery, outcome: delivery.Outcome | None, now: datetime, claimed: datetime
) -> None:
    # Only while the claim is this run's: a row whose endpoint or event went meanwhile, or
    # that another run took over, is left as it is.
    mine = WebhookDelivery.objects.filter(
        pk=row.pk, state=WebhookDelivery.State.PENDING, next_attempt_at=claimed
    )
    give_up_at = row.created_at + timedelta(seconds=settings.WEBHOOK_RETRY_FOR_S)
    if outcome is None:  # its endpoint is switched off: kept for when it is on, within the day
        if now > give_up_at:
            mine.update(state=WebhookDelivery.State.FAILED, last_error="the endpoint is off")
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
    if next_at > give_up_at:
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
