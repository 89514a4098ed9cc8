"""balance.low: a renter whose balance fell below their threshold while rentals run hears it
once, with when those rentals stop at their rate; once the balance is back at or above the
threshold (a top-up), the next crossing tells them again.

``NotificationSettings.low_balance_notified_at`` is the once: set (compare-and-set) with the
event in one transaction, cleared when the balance recovers. Called by the billing sweep after
it charged (hub/leases/funds.py) and by the top-up paths (hub/billing/topups.py, payments.py),
so a top-up re-arms it at once. Balances and what bills come from hub/billing/services.py, so
this module never reads leases itself (billing code calls it; see .importlinter).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from hub.billing import services as billing
from hub.billing.money import format_micros, format_rate
from hub.notifications.events import MAX_ITEMS, emit
from hub.notifications.models import NotificationSettings

log = logging.getLogger(__name__)

KIND = "balance.low"


def threshold_of(row: NotificationSettings | None) -> int | None:
    """The account's threshold in micros, or None when it has the notice off: a row's own
    (None: off), else NOTIFY_LOW_BALANCE_DEFAULT_MICROS (0: off). A threshold of 0 or less
    is off too: the funds sweep releases rentals before a balance ever gets below it."""
    threshold = (
        settings.NOTIFY_LOW_BALANCE_DEFAULT_MICROS
        if row is None
        else row.low_balance_threshold_micros
    )
    return threshold if threshold is not None and threshold > 0 else None


def review_low_balances(
    now: datetime | None = None, renter_ids: Iterable[int] | None = None
) -> int:
    """Notify the renters (all, or ``renter_ids``) who crossed below their threshold while
    rentals bill, and re-arm those back at or above it. Returns how many were notified."""
    now = now or timezone.now()
    # What bills now (running, priced, host not away): the same leases the funds check burns.
    billable = billing._billable_now()
    notified = NotificationSettings.objects.filter(low_balance_notified_at__isnull=False)
    if renter_ids is not None:
        ids = list(renter_ids)
        billable = billable.filter(renter_id__in=ids)
        notified = notified.filter(user_id__in=ids)
    rentals: dict[int, list[tuple[str, int]]] = {}
    for lease_id, renter_id, price in billable.order_by(
        "renter_id", "created_at", "pk"
    ).values_list("pk", "renter_id", "price_per_hour_micros"):
        rentals.setdefault(renter_id, []).append((str(lease_id), price))
    candidates = set(rentals) | set(notified.values_list("user_id", flat=True))
    if not candidates:
        return 0
    rows = {row.user_id: row for row in NotificationSettings.objects.filter(user_id__in=candidates)}
    balances = billing.balances_of(candidates)
    sent = 0
    for renter_id in sorted(candidates):
        row = rows.get(renter_id)
        threshold = threshold_of(row)
        balance = balances[renter_id]
        if row is not None and row.low_balance_notified_at is not None:
            if threshold is None or balance >= threshold:
                # Back above (or turned off): the next crossing is news again. Compare-and-set,
                # so a notice another run just sent is not re-armed by this run's older read.
                NotificationSettings.objects.filter(
                    pk=row.pk, low_balance_notified_at=row.low_balance_notified_at
                ).update(low_balance_notified_at=None)
            continue
        if threshold is None or balance >= threshold or renter_id not in rentals:
            continue
        if _notify(renter_id, row, threshold, balance, rentals[renter_id], now):
            sent += 1
    return sent


def _notify(
    renter_id: int,
    row: NotificationSettings | None,
    threshold: int,
    balance: int,
    rentals: list[tuple[str, int]],
    now: datetime,
) -> bool:
    """Mark the renter notified and emit, in one transaction; False when another run did."""
    with transaction.atomic():
        if row is None:
            try:
                # The row is made on first use, with the default threshold it was judged by.
                with transaction.atomic():
                    NotificationSettings.objects.create(
                        user_id=renter_id,
                        low_balance_threshold_micros=threshold,
                        low_balance_notified_at=now,
                    )
            except IntegrityError:
                return False  # made meanwhile: the next sweep reads it
        elif not NotificationSettings.objects.filter(
            pk=row.pk, low_balance_notified_at__isnull=True
        ).update(low_balance_notified_at=now):
            return False
        # Read again now the flag is ours: a top-up that committed after the sweep's read
        # would otherwise get a "below your threshold" notice right after it.
        balance = billing.balances_of([renter_id])[renter_id]
        if balance >= threshold:
            transaction.set_rollback(True)
            return False
        emit(renter_id, KIND, _data(threshold, balance, rentals, now), now=now)
    log.info("renter %s notified of a low balance (%s)", renter_id, format_micros(balance))
    return True


def _data(
    threshold: int, balance: int, rentals: list[tuple[str, int]], now: datetime
) -> dict[str, Any]:
    burn = sum(price for _, price in rentals)
    # When the balance reaches zero at this burn (the funds sweep releases them a minute
    # before): now when it is gone already.
    runs_out_at = now + timedelta(seconds=max(balance, 0) * 3600 / burn) if burn else None
    return {
        "balance": format_micros(balance, cents=True, symbol=""),
        "balance_micros": balance,
        "threshold": format_micros(threshold, cents=True, symbol=""),
        "threshold_micros": threshold,
        "burn_per_hour": format_rate(burn, symbol=""),
        "burn_per_hour_micros": burn,
        "runs_out_at": runs_out_at.isoformat(timespec="seconds") if runs_out_at else None,
        # Bounded like a coalesced event's items: a renter with a thousand rentals gets the
        # first hundred named, and the burn of them all.
        "rentals": [
            {
                "lease": lease_id,
                "price_per_hour": format_rate(price, symbol=""),
                "price_per_hour_micros": price,
            }
            for lease_id, price in rentals[:MAX_ITEMS]
        ],
    }
