"""The billing sweep's lease half: billing charges and names the leases whose renter ran out of
funds (hub/billing/services.py); releasing them is a lease transition, so it happens here.
Side effects flow one way: leases call billing, billing never calls back into leases."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from django.utils import timezone

from hub.billing import low_balance
from hub.billing import services as billing
from hub.leases.models import Lease
from hub.leases.services import release_lease

log = logging.getLogger(__name__)


def charge_and_release(now: datetime | None = None) -> billing.ChargeRun:
    """Charge what is due, then release (``no_funds``) what the renters cannot pay, then tell
    renters below their low-balance threshold (hub/billing/low_balance.py)."""
    now = now or timezone.now()
    run = billing.charge_running_leases(now)
    released = 0
    for lease_id in run.out_of_funds:
        lease = release_lease(lease_id, Lease.EndReason.NO_FUNDS, now)
        if lease.end_reason == Lease.EndReason.NO_FUNDS:
            released += 1
            log.info("released lease %s: its renter is out of funds", lease_id)
    # After the charges (the balances are current) and the releases (a renter who ran out
    # hears rental.ended, not that their rentals are about to stop).
    low_balance.review_low_balances(now)
    return dataclasses.replace(run, released=released)
