"""A host going offline or coming back, with what it means for its leases, in one transaction.

The host's own change (status, transition row) is hub/suppliers/transitions.py; the leases'
side (the grace clock, the outage kept out of billing) is here, above it, so that suppliers
never call up into leases (docs/architecture.md, "Layers"). The agents' side calls these: the
offline sweep, the first heartbeat after it, the telemetry flush as a fallback.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from hub.leases.services import note_host_back, note_host_lost
from hub.suppliers import transitions


def host_lost(host_id: int, reason: str, now: datetime) -> bool:
    """Online -> offline, and the host's leases start their grace clock. False if the host was
    not online (another sweep, or it re-registered meanwhile)."""
    with transaction.atomic():
        if not transitions.mark_offline(host_id, reason, now):
            return False
        note_host_lost(host_id, now)
    return True


def host_back(host_id: int, reason: str, now: datetime | None = None) -> bool:
    """Offline -> online on the same connection within the grace: its leases go on and the
    time away is not billed. False if the host was not offline."""
    now = now or timezone.now()
    with transaction.atomic():
        if not transitions.bring_back(host_id, reason):
            return False
        note_host_back(host_id, now)
    return True
