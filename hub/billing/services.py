"""Billing services: balances, metering of leases, funds checks and admin adjustments.

Locking: metering locks the lease row first (``select_for_update`` on the lease, the order every
lease transition in hub/leases/services.py uses) and writes its ledger rows and the lease's
charged total in that one transaction. A lease that ends is settled inside the transition that
ends it (``settle_lease``, under the same lock), so the beat task and an ending lease queue on
the lease row and the second one finds nothing left to charge. Ledger rows are only ever
inserted, so balances need no lock of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import F, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from hub.accounts.models import User
from hub.billing import metering
from hub.billing.models import LedgerEntry
from hub.billing.money import format_micros, format_rate
from hub.leases.models import Lease
from hub.notifications.events import emit
from hub.suppliers.models import Host

log = logging.getLogger(__name__)

Kind = LedgerEntry.Kind

# Leases metered per beat tick; the stalest go first and the rest follow on the next tick
# (metering is cumulative, so a lease billed late is billed exactly all the same).
CHARGE_BATCH = 1000


class BillingError(Exception):
    """A money operation was refused; the message is fit to show the person."""


class OutOfFunds(BillingError):
    pass


# --- balances -----------------------------------------------------------------------------------


def balance_micros(account: User | None) -> int:
    """A person's balance, or the platform's with ``None``: the sum of their ledger rows."""
    rows = (
        LedgerEntry.objects.filter(account__isnull=True)
        if account is None
        else LedgerEntry.objects.filter(account=account)
    )
    return rows.aggregate(total=Coalesce(Sum("amount_micros"), Value(0)))["total"]


def balances_of(account_ids: Iterable[int]) -> dict[int, int]:
    """Balances of many people in one query; anyone without rows has 0."""
    ids = list(account_ids)
    totals = dict(
        LedgerEntry.objects.filter(account_id__in=ids)
        .values("account_id")
        .annotate(total=Sum("amount_micros"))
        .values_list("account_id", "total")
    )
    return {account_id: totals.get(account_id, 0) for account_id in ids}


def with_balances(users: QuerySet[User]) -> QuerySet[User]:
    """Annotate ``balance_micros`` on each user (for admin lists and pages)."""
    total = (
        LedgerEntry.objects.filter(account=OuterRef("pk"))
        .values("account")
        .annotate(total=Sum("amount_micros"))
        .values("total")[:1]
    )
    return users.annotate(balance_micros=Coalesce(Subquery(total), Value(0)))


# --- price at start -----------------------------------------------------------------------------


# Leases that bill, or will once their container runs: a rent must be paid for on top of all
# of them. Stopping ones are not: their bill ended at the stop request.
COMMITTED_STATES = (
    Lease.State.PENDING,
    Lease.State.RESERVING,
    Lease.State.STARTING,
    Lease.State.RUNNING,
)


def committed_burn_per_hour(renter_id: int) -> int:
    """What a renter's rentals cost per hour once all of them run: every active priced lease,
    including those still starting and those on a host that is away (it may come back)."""
    return (
        Lease.objects.filter(
            renter_id=renter_id, state__in=COMMITTED_STATES, price_per_hour_micros__gt=0
        ).aggregate(total=Sum("price_per_hour_micros"))["total"]
        or 0
    )


def _billable_now() -> QuerySet[Lease]:
    return Lease.objects.filter(
        state=Lease.State.RUNNING, price_per_hour_micros__gt=0, host_lost_since__isnull=True
    )


def require_funds_to_start(renter: User, price_per_hour_micros: int) -> None:
    """Refuse a priced rental the renter's balance cannot pay the first minute of (on top of
    a minute of every other rental they have going, started or not). Free rentals are always
    allowed. The caller holds the renter's row lock, so rents of one renter queue here."""
    if price_per_hour_micros <= 0:
        return
    needed = metering.per_minute(committed_burn_per_hour(renter.pk) + price_per_hour_micros)
    balance = balance_micros(renter)
    if balance < needed:
        others = needed > metering.per_minute(price_per_hour_micros)
        raise OutOfFunds(
            f"out of funds: this rental costs {format_rate(price_per_hour_micros)} an hour,"
            f" its first minute needs {format_rate(needed)}"
            + (" with your other rentals" if others else "")
            + f" and your balance is {format_micros(balance, cents=True)};"
            " add funds on your Usage page to rent it"
        )


# --- metering -----------------------------------------------------------------------------------


def _charge_locked(lease: Lease, now: datetime) -> int:
    """Charge what is due and not yet charged; the caller holds the lease's row lock."""
    until = metering.billing_end(lease, now)
    due = metering.amount_due(lease.price_per_hour_micros, metering.billable_seconds(lease, now))
    delta = due - lease.charged_micros
    if delta > 0:
        fee = metering.fee_of(due, lease.platform_fee_bps) - metering.fee_of(
            lease.charged_micros, lease.platform_fee_bps
        )
        earning = delta - fee
        supplier_id = Host.objects.filter(pk=lease.host_id).values_list("owner_id", flat=True).get()
        rows = [
            LedgerEntry(
                account_id=lease.renter_id,
                kind=Kind.CHARGE,
                amount_micros=-delta,
                lease=lease,
                covers_until=until,
            )
        ]
        if earning:
            rows.append(
                LedgerEntry(
                    account_id=supplier_id,
                    kind=Kind.EARNING,
                    amount_micros=earning,
                    lease=lease,
                    covers_until=until,
                )
            )
        if fee:
            rows.append(
                LedgerEntry(
                    account=None, kind=Kind.FEE, amount_micros=fee, lease=lease, covers_until=until
                )
            )
        LedgerEntry.objects.bulk_create(rows)
        lease.charged_micros = due
    else:
        # Nothing new: free, under a second, the host away, or another run got here first.
        delta = 0
    if lease.billed_until is None or until > lease.billed_until:
        lease.billed_until = until
    lease.save(update_fields=["charged_micros", "billed_until"])
    return delta


def settle_lease(lease: Lease, now: datetime) -> int:
    """Final charge of a lease that just ended, up to its ``ended_at``. Called by the lease
    transition that ends it, which holds the lease's row lock."""
    if lease.billing_settled_at is not None:
        return 0
    charged = _charge_locked(lease, now) if lease.running_since is not None else 0
    lease.billing_settled_at = now
    lease.save(update_fields=["billing_settled_at"])
    return charged


def charge_lease(lease_id: object, now: datetime | None = None) -> int:
    """Charge one lease up to ``now`` (or its end, settling it). Idempotent."""
    now = now or timezone.now()
    with transaction.atomic():
        lease = (
            Lease.objects.select_for_update(no_key=True)
            .filter(pk=lease_id, billing_settled_at__isnull=True)
            .first()
        )
        if lease is None:
            return 0
        if lease.ended_at is not None:
            return settle_lease(lease, now)
        return _charge_locked(lease, now)


@dataclass(frozen=True)
class ChargeRun:
    leases: int
    charged_micros: int
    warned: int
    # Running leases of renters who cannot pay their next minute: the caller releases them
    # (hub/leases/services.py charge_and_release); billing only says which.
    out_of_funds: tuple[object, ...] = ()
    released: int = 0


def charge_running_leases(now: datetime | None = None, batch: int = CHARGE_BATCH) -> ChargeRun:
    """The beat task's money half: charge every running priced lease up to now, settle ended
    ones, warn renters running low, and name the leases of renters who ran out."""
    now = now or timezone.now()
    due = (
        Lease.objects.filter(running_since__isnull=False, billing_settled_at__isnull=True)
        .filter(Q(price_per_hour_micros__gt=0) | Q(ended_at__isnull=False))
        .order_by(F("billed_until").asc(nulls_first=True), "pk")
        .values_list("pk", flat=True)[:batch]
    )
    lease_ids = list(due)
    charged = sum(charge_lease(lease_id, now) for lease_id in lease_ids)
    warned, out_of_funds = review_funds(now)
    return ChargeRun(len(lease_ids), charged, warned, tuple(out_of_funds))


# --- funds --------------------------------------------------------------------------------------


def review_funds(
    now: datetime | None = None, renter_ids: Iterable[int] | None = None
) -> tuple[int, list[object]]:
    """Compare each renter's balance with what their running rentals burn. Below one minute:
    their running leases are returned, for the caller to release with ``no_funds``. Below
    BILLING_WARN_MINUTES: flag their running leases with ``funds_warning_at``. Enough: clear
    the flag. Returns (renters warned, leases out of funds)."""
    now = now or timezone.now()
    renters = Lease.objects.filter(state=Lease.State.RUNNING, price_per_hour_micros__gt=0)
    if renter_ids is not None:
        renters = renters.filter(renter_id__in=list(renter_ids))
    renter_set = set(renters.values_list("renter_id", flat=True).distinct())
    burns = dict(
        _billable_now()
        .filter(renter_id__in=renter_set)
        .values("renter_id")
        .annotate(burn=Sum("price_per_hour_micros"))
        .values_list("renter_id", "burn")
    )
    balances = balances_of(renter_set)
    warned = 0
    out_of_funds: list[object] = []
    for renter_id in sorted(renter_set):
        burn = burns.get(renter_id, 0)
        balance = balances[renter_id]
        running = Lease.objects.filter(
            renter_id=renter_id, state=Lease.State.RUNNING, price_per_hour_micros__gt=0
        )
        if burn and balance < metering.per_minute(burn):
            ids = list(running.order_by("pk").values_list("pk", flat=True))
            out_of_funds += ids
            # Flagged too: until the caller releases them the renter sees the warning.
            running.filter(funds_warning_at__isnull=True).update(funds_warning_at=now)
            log.info(
                "renter %s is out of funds (balance %s): %d lease(s) to release",
                renter_id,
                format_micros(balance),
                len(ids),
            )
        elif burn and balance < metering.for_minutes(burn, settings.BILLING_WARN_MINUTES):
            if running.filter(funds_warning_at__isnull=True).update(funds_warning_at=now):
                warned += 1
        else:
            running.filter(funds_warning_at__isnull=False).update(funds_warning_at=None)
    if renter_ids is not None:
        # A top-up for someone with no priced lease running: clear any flag left on the others.
        Lease.objects.filter(
            renter_id__in=set(renter_ids) - renter_set,
            state__in=Lease.ACTIVE_STATES,
            funds_warning_at__isnull=False,
        ).update(funds_warning_at=None)
    return warned, out_of_funds


# --- credit -------------------------------------------------------------------------------------


def notify_credited(account: User, amount_micros: int) -> None:
    """``topup.credited`` for money just added to the account (an admin's top-up, a payment),
    in the caller's transaction, with the balance it made."""
    balance = balance_micros(account)
    emit(
        account.pk,
        "topup.credited",
        {
            "amount": format_micros(amount_micros, cents=True, symbol=""),
            "amount_micros": amount_micros,
            "balance": format_micros(balance, cents=True, symbol=""),
            "balance_micros": balance,
        },
    )


# --- adjustments --------------------------------------------------------------------------------


def adjust(account: User, amount_micros: int, reason: str, by: User) -> LedgerEntry:
    """An admin's top-up (positive) or correction (negative), with why and by whom."""
    reason = reason.strip()
    if not reason:
        raise BillingError("an adjustment needs a reason")
    if amount_micros == 0:
        raise BillingError("an adjustment of zero changes nothing")
    if not (by.is_active and by.is_staff):
        raise BillingError("only staff can adjust balances")
    with transaction.atomic():
        entry = LedgerEntry.objects.create(
            account=account,
            kind=Kind.ADJUSTMENT,
            amount_micros=amount_micros,
            reason=reason,
            created_by=by,
        )
        if amount_micros > 0:
            # A credit is a top-up to the person; a correction (negative) is not announced.
            notify_credited(account, amount_micros)
    log.info(
        "balance of user %s adjusted by %s by admin %s: %s",
        account.pk,
        format_micros(amount_micros),
        by.pk,
        reason,
    )
    # A top-up clears warnings; releasing is the beat task's (never on an admin's click).
    review_funds(renter_ids=[account.pk])
    return entry
