"""Paying suppliers: a payable balance, a request, and an admin marking it paid with the
transfer's reference (a ``payout`` ledger row). Sending the money is outside the hub today (a
bank transfer an admin makes); a processor that sends it would implement ``PayoutProcessor``
and call ``mark_payout_paid`` with its own reference, as ``payments.py`` is the seam for
money coming in."""

from __future__ import annotations

import logging
from typing import Protocol

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from hub.accounts.models import User
from hub.billing import services
from hub.billing.models import LedgerEntry, Payout
from hub.billing.money import format_micros
from hub.notifications.events import emit

log = logging.getLogger(__name__)


class PayoutProcessor(Protocol):
    # Short and stable ("wise"): it prefixes the references recorded on payouts.
    name: str

    def send_payout(self, payout: Payout) -> str:
        """Send ``payout.amount_micros`` to its account's payout method; return the
        processor's reference for the transfer."""
        ...


def held_micros(account: User) -> int:
    """Requested payouts not yet paid: held, so they are not payable twice."""
    total = Payout.objects.filter(account=account, state=Payout.State.REQUESTED).aggregate(
        total=Sum("amount_micros")
    )["total"]
    return int(total or 0)


def earned_micros(account: User) -> int:
    """The part of a balance that came from renting GPUs out and is still there: earnings,
    less what was paid out, less what spending took from them.

    Top-ups, payments and positive adjustments are credit: it can be spent on rentals but never
    turned back into a transfer (credit bought with a stolen card must not come out as a
    payout). Spending (charges, negative adjustments) takes credit first and earnings only
    once the credit is gone, in the ledger's order: so earning, spending it, then topping up
    leaves nothing payable, where a plain "earnings less payouts" would pay the top-up out.

    The credit bucket is the running sum of credit and spending clamped at zero from below;
    what the clamp lifted in all is what spending took from earnings: minus the lowest prefix
    sum of credit and spending (one window query, however long the ledger)."""
    Kind = LedgerEntry.Kind
    totals = LedgerEntry.objects.filter(account=account, kind__in=[Kind.EARNING, Kind.PAYOUT])
    earned = int(totals.aggregate(total=Sum("amount_micros"))["total"] or 0)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT LEAST(0, COALESCE(MIN(running), 0)) FROM (
                SELECT SUM(amount_micros) OVER (
                    ORDER BY created_at, id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW
                ) AS running
                FROM {LedgerEntry._meta.db_table}
                WHERE account_id = %s AND kind IN (%s, %s, %s)
            ) AS credit
            """,  # noqa: S608 - the table name is ours; values are parameters
            [account.pk, Kind.CHARGE, Kind.PAYMENT, Kind.ADJUSTMENT],
        )
        lowest = int(cursor.fetchone()[0])
    return earned + lowest


def payable_micros(account: User) -> int:
    """What a supplier can ask to be paid now: their earnings still in the balance
    (``earned_micros``), never more than the balance, less what they asked for already; never
    below zero."""
    held = held_micros(account)
    return max(0, min(earned_micros(account), services.balance_micros(account)) - held)


def request_payout(account: User, amount_micros: int) -> Payout:
    minimum = settings.PAYOUT_MINIMUM_MICROS
    if amount_micros < minimum:
        raise services.BillingError(f"a payout is at least {format_micros(minimum, cents=True)}")
    with transaction.atomic():
        # One person's money questions queue on their row (as rents do): two requests cannot
        # both pass the payable check.
        User.objects.select_for_update().filter(pk=account.pk).first()
        payable = payable_micros(account)
        if amount_micros > payable:
            raise services.BillingError(
                f"you can ask for at most {format_micros(payable, cents=True)} now"
            )
        payout = Payout.objects.create(account=account, amount_micros=amount_micros)
        _notify(payout, "payout.requested")
    log.info(
        "payout %s of %s requested by user %s", payout.pk, format_micros(amount_micros), account.pk
    )
    return payout


def mark_payout_paid(payout_id: int, reference: str, by: User) -> Payout:
    """The money went out: record the reference and the ledger row, once."""
    reference = " ".join(reference.split())
    if not reference:
        raise services.BillingError("give the transfer's reference")
    if len(reference) > 200:
        raise services.BillingError("a reference is at most 200 characters")
    if not (by.is_active and by.is_staff):
        raise services.BillingError("only staff can mark payouts paid")
    with transaction.atomic():
        payout = Payout.objects.select_for_update().select_related("account").get(pk=payout_id)
        if payout.state != Payout.State.REQUESTED:
            raise services.BillingError(f"payout {payout.pk} is {payout.state} already")
        User.objects.select_for_update().filter(pk=payout.account_id).first()
        balance = services.balance_micros(payout.account)
        if balance < payout.amount_micros:
            raise services.BillingError(
                f"the balance ({format_micros(balance, cents=True)}) is less than the payout "
                "now; cancel it and ask the supplier for a new one"
            )
        # And still earned: spending since the request may have taken the earnings it was
        # asked against (the rest held stays held for the other requests).
        room = min(earned_micros(payout.account), balance) - (
            held_micros(payout.account) - payout.amount_micros
        )
        if room < payout.amount_micros:
            raise services.BillingError(
                f"only {format_micros(max(0, room), cents=True)} of the supplier's earnings is "
                "payable now, less than the payout; cancel it and ask the supplier for a new one"
            )
        entry = LedgerEntry.objects.create(
            account=payout.account,
            kind=LedgerEntry.Kind.PAYOUT,
            amount_micros=-payout.amount_micros,
            reason=f"payout {payout.pk}: {reference}",
            created_by=by,
        )
        payout.state = Payout.State.PAID
        payout.reference = reference
        payout.paid_at = timezone.now()
        payout.handled_by = by
        payout.ledger_entry = entry
        payout.save(update_fields=["state", "reference", "paid_at", "handled_by", "ledger_entry"])
        _notify(payout, "payout.paid")
    log.info("payout %s marked paid by admin %s", payout.pk, by.pk)
    return payout


# What a supplier reads when staff cancel their payout without saying why.
REFUSED_WITHOUT_REASON = "an administrator cancelled it; contact support to ask why"


def cancel_payout(payout_id: int, by: User, reason: str = "") -> bool:
    """The supplier's own, or staff: a requested payout no longer holds its money. Staff
    cancelling someone else's payout refuse it: its supplier hears so, with ``reason``."""
    payouts = Payout.objects.filter(pk=payout_id, state=Payout.State.REQUESTED)
    if not by.is_staff:
        payouts = payouts.filter(account=by)
    with transaction.atomic():
        # Locked, so that the notice goes with the one cancel that changed it.
        payout = payouts.select_for_update().first()
        if payout is None:
            return False
        payout.state = Payout.State.CANCELLED
        payout.handled_by = by
        payout.save(update_fields=["state", "handled_by"])
        if payout.account_id != by.pk:
            _notify(payout, "payout.refused", reason=" ".join(reason.split()) or None)
    return True


def _notify(payout: Payout, kind: str, *, reason: str | None = None) -> None:
    data: dict[str, object] = {
        "payout": str(payout.pk),
        "amount": format_micros(payout.amount_micros, cents=True, symbol=""),
        "amount_micros": payout.amount_micros,
    }
    if kind == "payout.refused":
        data["reason"] = reason or REFUSED_WITHOUT_REASON
    emit(payout.account_id, kind, data)
