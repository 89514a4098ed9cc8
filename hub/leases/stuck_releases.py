"""Releases a host keeps failing: past RELEASE_STUCK_AFTER_S the host is flagged.

The renter stopped paying at the stop request (hub/billing/metering.py); what is left is the
supplier's problem and the next renter's risk. A flagged host takes no new rentals
(hub/leases/services.py start_lease, hub/catalog/offers.py), shows on the fleet page, and its
owner sees the agent's last error on the host page. The flag clears on the first sweep after
the last stuck lease let go.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from hub.leases.models import Command, Lease
from hub.notifications.events import emit
from hub.suppliers.models import Host

log = logging.getLogger(__name__)

NO_ANSWER = "the host has not answered the release"


def _stuck_leases(cutoff: datetime) -> Q:
    stopping = Q(state=Lease.State.STOPPING, stop_requested_at__lt=cutoff)
    # A lease that failed before it ran still holds its GPUs until the agent lets go.
    failed_holding = Q(state=Lease.State.FAILED, ended_at__lt=cutoff, lease_gpus__active=True)
    return stopping | failed_holding


def _last_release_error(host_id: int, lease_ids: list[object]) -> str:
    error = (
        Command.objects.filter(
            host_id=host_id, lease_id__in=lease_ids, kind=Command.Kind.RELEASE, ok=False
        )
        .order_by("-acked_at")
        .values_list("error", flat=True)
        .first()
    )
    return (error or NO_ANSWER)[:2000]


def _notify(host_id: int, lease_ids: list[object], error: str) -> None:
    host = Host.objects.only("owner_id", "name", "hostname", "agent_id").get(pk=host_id)
    for lease_id in sorted(lease_ids, key=str):
        emit(
            host.owner_id,
            "release.stuck",
            {"lease": str(lease_id), "host": host.label, "error": error},
        )


def flag_stuck_releases(now: datetime | None = None) -> list[int]:
    """Flag hosts with a release older than RELEASE_STUCK_AFTER_S, clear the others.
    Returns the ids of the hosts flagged now."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.RELEASE_STUCK_AFTER_S)
    stuck: dict[int, list[object]] = {}
    for lease_id, host_id in (
        Lease.objects.filter(_stuck_leases(cutoff)).values_list("pk", "host_id").distinct()
    ):
        stuck.setdefault(host_id, []).append(lease_id)
    newly = []
    for host_id, lease_ids in stuck.items():
        reason = _last_release_error(host_id, lease_ids)
        with transaction.atomic():
            flagged = Host.objects.filter(pk=host_id, release_stuck_since__isnull=True).update(
                release_stuck_since=now, release_stuck_reason=reason
            )
            if flagged:
                # Once per flag (the compare-and-set above): one item per stuck lease.
                _notify(host_id, lease_ids, reason)
        if flagged:
            newly.append(host_id)
            log.warning(
                "host %s flagged: %d release(s) stuck for over %ss (%s)",
                host_id,
                len(lease_ids),
                settings.RELEASE_STUCK_AFTER_S,
                reason,
            )
        else:
            Host.objects.filter(pk=host_id).exclude(release_stuck_reason=reason).update(
                release_stuck_reason=reason
            )
    cleared = (
        Host.objects.filter(release_stuck_since__isnull=False)
        .exclude(pk__in=list(stuck))
        .update(release_stuck_since=None, release_stuck_reason="")
    )
    if cleared:
        log.info("%d host(s) no longer have a stuck release", cleared)
    return newly
