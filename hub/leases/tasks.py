"""Celery tasks of the lease control plane. Tasks take ids, are idempotent and bounded."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from hub.leases import funds, services, stuck_releases
from hub.leases.models import Command
from hub.lib import channel_send, metrics
from supplier_agent import logjson

log = logging.getLogger(__name__)

REDISPATCH_BATCH = 500


@shared_task(name="leases.dispatch_command", acks_late=True, reject_on_worker_lost=True)
def dispatch_command(command_id: str) -> str:
    """Send one command to the connection that holds its host, if any; the sweep re-sends."""
    # Its log lines name the command (LOG_FORMAT=json); bound for this call only, as the
    # worker's thread runs other tasks next.
    with logjson.bound(command_id=command_id):
        return _dispatch(command_id)


def _dispatch(command_id: str) -> str:
    now = timezone.now()
    with transaction.atomic():
        command = (
            # of=self: lock the command only, not its host row (heartbeats write that one).
            Command.objects.select_for_update(skip_locked=True, no_key=True, of=("self",))
            .select_related("host")
            .filter(
                pk=command_id,
                state__in=[Command.State.QUEUED, Command.State.SENT],
                # Already sent by a racing sweep or on-commit task: its re-send is not due.
                next_attempt_at__lte=now,
            )
            .first()
        )
        if command is None:
            return "skipped"
        if command.deadline <= now:
            transaction.on_commit(lambda: services.expire_command(command_id))
            return "expired"
        command.next_attempt_at = now + timedelta(seconds=settings.COMMAND_RESEND_S)
        channel = command.host.channel_name
        if not channel:
            command.save(update_fields=["next_attempt_at"])
            return "no connection"
        # channel_layer.send, not group_send: exactly one connection holds a host. A send
        # that reaches a connection which just closed is simply re-sent by the sweep.
        channel_send.send(channel, {"type": "agent.command", "frame": json.dumps(command.payload)})
        command.state = Command.State.SENT
        command.attempts += 1
        command.sent_at = now
        command.save(update_fields=["state", "attempts", "sent_at", "next_attempt_at"])
    return "sent"


@shared_task(name="leases.redispatch_commands")
def redispatch_commands() -> int:
    """Re-send unacked commands and expire overdue ones. Nothing is lost if Redis (broker or
    channel layer) dropped a message: the outbox row is the truth."""
    now = timezone.now()
    due = list(
        Command.objects.filter(
            state__in=[Command.State.QUEUED, Command.State.SENT], next_attempt_at__lte=now
        )
        .order_by("next_attempt_at")
        .values_list("pk", "deadline")[:REDISPATCH_BATCH]
    )
    for command_id, deadline in due:
        if deadline <= now:
            services.expire_command(command_id)
        else:
            dispatch_command(str(command_id))
    return len(due)


@shared_task(name="leases.end_leases_of_lost_hosts")
def end_leases_of_lost_hosts() -> int:
    return len(services.end_leases_of_lost_hosts())


@shared_task(name="leases.expire_due_leases")
def expire_due_leases() -> int:
    return len(services.expire_due_leases())


@shared_task(name="leases.flag_stuck_releases")
def flag_stuck_releases() -> int:
    return len(stuck_releases.flag_stuck_releases())


@shared_task(name="leases.charge_and_release")
def charge_and_release() -> dict[str, int]:
    """The beat's billing sweep, every BILLING_INTERVAL_S; running it twice charges nothing
    the second time."""
    run = funds.charge_and_release()
    metrics.BILLING_TICKS.inc()
    metrics.BILLING_CHARGED_MICROS.inc(run.charged_micros)
    return {
        "leases": run.leases,
        "charged_micros": run.charged_micros,
        "warned": run.warned,
        "released": run.released,
    }
