"""Every change of a host's status (online, offline) or maintenance flag, in one place.

Each change is a compare-and-set on the host row with a ``HostTransition`` row in the same
transaction, so the history says who changed what and when, and two racing writers (the
offline sweep and a heartbeat, two admins) change it once. The lease side of going offline and
coming back (the grace clock of the host's leases) is hub/leases/host_status.py, which wraps
``mark_offline`` and ``bring_back`` in one transaction with it: the host's state knows nothing
of leases, the leases build on it.

Callers: registration (online, hub/agents/registration.py), the offline sweep (offline,
hub/agents/sweep.py), the first heartbeat after the sweep (online again,
hub/agents/heartbeats.py), the telemetry flush as a fallback (hub/agents/stats.py), and the
supplier's page and the admin's drain (maintenance).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from hub.notifications.events import emit
from hub.suppliers.models import Host, HostTransition

log = logging.getLogger(__name__)

Status = Host.Status
# HostTransition rows for the maintenance flag: the status stays, the reason says which way.
MAINTENANCE_ON = "maintenance on"
MAINTENANCE_OFF = "maintenance off"


def set_online(host: Host, reason: str) -> None:
    """For registration, which holds the host's row lock and saves the row itself; a new host
    (no id yet) is saved here, online, since its transition row needs its id."""
    if host.status == Status.ONLINE:
        return
    is_new = host.pk is None
    previous, host.status = host.status, Status.ONLINE
    if is_new:
        host.save()
    HostTransition.objects.create(
        host=host, from_status=previous, to_status=Status.ONLINE, reason=reason
    )
    if not is_new:
        # A host joining for the first time is not "back": its supplier just installed it.
        _notify(host.owner_id, "host.online", host.pk, host.label, timezone.now())


def mark_offline(host_id: int, reason: str, now: datetime) -> bool:
    """The sweep's verdict: online -> offline. False if the host was not online (another sweep,
    or it re-registered meanwhile). Through ``host_status.host_lost``, which starts the grace
    clock of the host's leases in the same transaction."""
    # savepoint=False: host_status calls this inside its own transaction, where a savepoint
    # would only cost a round trip (a failure rolls the whole change back either way).
    with transaction.atomic(savepoint=False):
        changed = Host.objects.filter(pk=host_id, status=Status.ONLINE).update(
            status=Status.OFFLINE
        )
        if not changed:
            return False
        HostTransition.objects.create(
            host_id=host_id, from_status=Status.ONLINE, to_status=Status.OFFLINE, reason=reason
        )
        _notify_of(host_id, "host.offline", now)
    return True


def bring_back(host_id: int, reason: str) -> bool:
    """Heartbeats from a host the sweep marked offline: it came back on the same connection.
    False if it was not offline. Through ``host_status.host_back``, which lets its leases go on
    (the time away is not billed) in the same transaction."""
    # savepoint=False: host_status calls this inside its own transaction, where a savepoint
    # would only cost a round trip (a failure rolls the whole change back either way).
    with transaction.atomic(savepoint=False):
        changed = Host.objects.filter(pk=host_id, status=Status.OFFLINE).update(
            status=Status.ONLINE
        )
        if not changed:
            return False
        HostTransition.objects.create(
            host_id=host_id, from_status=Status.OFFLINE, to_status=Status.ONLINE, reason=reason
        )
        _notify_of(host_id, "host.online", timezone.now())
    log.info("host %s is back (%s)", host_id, reason)
    return True


def _notify(owner_id: int, kind: str, host_id: int, label: str, at: datetime) -> None:
    # In the transition's transaction: the supplier hears of exactly the changes that commit.
    emit(
        owner_id,
        kind,
        {"host": str(host_id), "name": label, "at": at.isoformat(timespec="seconds")},
    )


def _notify_of(host_id: int, kind: str, at: datetime) -> None:
    host = Host.objects.only("owner_id", "name", "hostname", "agent_id").get(pk=host_id)
    _notify(host.owner_id, kind, host.pk, host.label, at)


def set_maintenance(host_ids: list[int], on: bool, reason: str) -> int:
    """Drain (no new rentals; running ones go on) or undrain hosts; how many changed."""
    changed = 0
    for host_id in host_ids:
        with transaction.atomic():
            host = (
                Host.objects.select_for_update(no_key=True)
                .filter(pk=host_id, maintenance=not on)
                .first()
            )
            if host is None:
                continue
            host.maintenance = on
            host.save(update_fields=["maintenance"])
            HostTransition.objects.create(
                host=host,
                from_status=host.status,
                to_status=host.status,
                reason=f"{MAINTENANCE_ON if on else MAINTENANCE_OFF}: {reason}"[:200],
            )
            changed += 1
    return changed
