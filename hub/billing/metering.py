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
    """The instant a charge at ``now`` runs up to: the stop request, else the lease's end,
    else now. A release the host is slow to carry out is never the renter's cost."""
    ends = [t for t in (lease.stop_requested_at, lease.ended_at) if t is not None]
    return min([*ends, now])


def billable_seconds(lease: Lease, now: datetime) -> int:
    """Whole seconds from ``running_since`` to the end, less every time the host was away
    while the lease ran: past outages (``offline_duration``, which only ever holds their
    running part, see ``running_overlap``) and the one still going on (``host_lost_since``)."""
    if lease.running_since is None:
        return 0
    end = billing_end(lease, now)
    span = end - lease.running_since - lease.offline_duration
    if lease.host_lost_since is not None:
        lost = max(lease.host_lost_since, lease.running_since)
        if lost < end:
            span -= end - lost
    return max(0, span // SECOND)


def running_overlap(lease: Lease, lost_since: datetime, back_at: datetime) -> timedelta:
    """The part of an outage from ``lost_since`` to ``back_at`` that fell while the lease was
    billable: after it began running and before its billing ended. An outage while the lease
    was still starting is not running time, so it is not subtracted from running time either."""
    if lease.running_since is None:
        return timedelta(0)
    start = max(lost_since, lease.running_since)
    end = billing_end(lease, back_at)
    return max(timedelta(0), end - start)


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
