"""The arithmetic of metering, kept apart from the database so that it reads as a formula.

Everything is cumulative from the lease's start: what is due is computed from the whole billable
time, and a batch charges the difference from what was already charged. Rounding (always down,
in the renter's favour) therefore never accumulates, however many batches a lease is billed in.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hub.leases.models import Lease

SECOND = timedelta(seconds=1)
SECONDS_PER_HOUR = 3600
BPS = 10_000


def billing_end(lease: Lease, now: datetime) -> datetime:
    """The instant a charge at ``now`` runs up to: the lease's end once it ended."""
    return lease.ended_at or now


def billable_seconds(lease: Lease, now: datetime) -> int:
    """Whole seconds from ``running_since`` to the end, less every time the host was away:
    past outages (``offline_duration``) and the one still going on (``host_lost_since``)."""
    if lease.running_since is None:
        return 0
    end = billing_end(lease, now)
    span = end - lease.running_since - lease.offline_duration
    if lease.host_lost_since is not None:
        lost = max(lease.host_lost_since, lease.running_since)
        if lost < end:
            span -= end - lost
    return max(0, span // SECOND)


def amount_due(price_per_hour_micros: int, seconds: int) -> int:
    return price_per_hour_micros * seconds // SECONDS_PER_HOUR


def fee_of(charged_micros: int, fee_bps: int) -> int:
    """The platform's part of a lease's cumulative charge; the supplier earns the rest."""
    return charged_micros * fee_bps // BPS


def per_minute(price_per_hour_micros: int) -> int:
    """What a minute costs, rounded up: the funds checks must not let a minute go unpaid."""
    return -(-price_per_hour_micros // 60)


def for_minutes(price_per_hour_micros: int, minutes: int) -> int:
    return -(-price_per_hour_micros * minutes // 60)
