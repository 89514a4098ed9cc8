"""Sending due events' emails, after their webhook deliveries are made (tasks.py), so a mail
server that is down or slow never holds a webhook.

One SMTP connection serves a run. A message the server refuses (a recipient it does not
take) is set aside alone and retried later; the others still go. A server that cannot be
reached or stops answering ends the run's mail work, since every other message would wait
EMAIL_TIMEOUT on it too; the next sweep tries again. A failed email is retried with backoff,
like a webhook, for a day after its event."""

from __future__ import annotations

import logging
import smtplib
import time
import uuid
from datetime import datetime, timedelta

from django.core.mail import get_connection
from django.core.mail.backends.base import BaseEmailBackend
from django.db import transaction
from django.utils import timezone

from hub.notifications import backoff, emails
from hub.notifications.kinds import KINDS
from hub.notifications.models import Event

log = logging.getLogger(__name__)

EVENT_BATCH = 200
# The n-th failed attempt waits RETRY_STEPS[n-1] * RETRY_BASE_S (the last step repeats):
# 1, 2, 5, 10, 30 min, 1, 2, 4 h, then every 8 h, until RETRY_FOR_S after the event: a mail
# server down for an evening loses nothing.
RETRY_BASE_S = 60
RETRY_STEPS = (1, 2, 5, 10, 30, 60, 120, 240, 480)
RETRY_FOR_S = 86400
# One message's problem, not the server's: the connection is still good for the others.
_MESSAGE_ERRORS = (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused, smtplib.SMTPDataError)
_EMAIL_FIELDS = ["state", "done_at", "due_at", "email_state", "email_attempts", "email_error"]


def retry_delay(attempts: int) -> timedelta:
    return backoff.delay(attempts, RETRY_STEPS, RETRY_BASE_S)


def send_due(stop_at: float) -> set[uuid.UUID]:
    """Email due events (whose deliveries are made) until none is left, the mail server
    fails, or ``stop_at`` (monotonic) passed; the ids of the events tried."""
    tried: set[uuid.UUID] = set()
    connection = get_connection()
    try:
        for _ in range(EVENT_BATCH):
            if time.monotonic() > stop_at:
                break
            outcome = _send_one(connection)
            if outcome is None:
                break
            event_id, server_failed = outcome
            tried.add(event_id)
            if server_failed:
                break
    finally:
        try:
            connection.close()
        except OSError as exc:  # a server that went away while we said goodbye
            log.info("closing the SMTP connection failed: %s", exc)
    return tried


def _send_one(connection: BaseEmailBackend) -> tuple[uuid.UUID, bool] | None:
    """One due event's email: None when there is none, else its id and whether the mail
    server itself failed."""
    now = timezone.now()
    with transaction.atomic():
        event = (
            Event.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("account")
            .filter(
                state=Event.State.PENDING,
                webhooks_made=True,
                email_state=Event.EmailState.NONE,
                due_at__lte=now,
            )
            .order_by("due_at")
            .first()
        )
        if event is None:
            return None
        server_failed = _email(event, connection, now)
        if event.email_state != Event.EmailState.NONE:
            event.state = Event.State.DONE
            event.done_at = now
        event.save(update_fields=_EMAIL_FIELDS)
    return event.pk, server_failed


def _email(event: Event, connection: BaseEmailBackend, now: datetime) -> bool:
    if event.kind not in KINDS or not emails.wanted(event.account, event.kind):
        event.email_state = Event.EmailState.SKIPPED
        return False
    try:
        mail = emails.message(event, event.account)
        mail.connection = connection
        connection.open()  # kept open: send() closes only a connection it opened itself
        mail.send()
    except Exception as exc:  # refused, timed out, unreachable, or a bug in one message
        _failed(event, exc, now)
        return isinstance(exc, OSError) and not isinstance(exc, _MESSAGE_ERRORS)
    event.email_state = Event.EmailState.SENT
    return False


def _failed(event: Event, exc: Exception, now: datetime) -> None:
    event.email_attempts += 1
    event.email_error = f"{type(exc).__name__}: {exc}"[:300]
    log.warning(
        "email for event %s (%s) failed (attempt %d): %s",
        event.pk,
        event.kind,
        event.email_attempts,
        event.email_error,
    )
    # A recipient refused for good (5xx: no such mailbox) will be refused tomorrow too.
    permanent = isinstance(exc, smtplib.SMTPRecipientsRefused) and all(
        code >= 500 for code, _ in exc.recipients.values()
    )
    next_at = now + retry_delay(event.email_attempts)
    if permanent or next_at > event.created_at + timedelta(seconds=RETRY_FOR_S):
        event.email_state = Event.EmailState.FAILED
    else:
        event.due_at = next_at
