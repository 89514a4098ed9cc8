"""Paying suppliers: a payable balance, a request, and an admin marking it paid with the
transfer's reference (a ``payout`` ledger row). Sending the money is outside the hub today (a
bank transfer an admin makes); a processor that sends it would implement ``PayoutProcessor``
and call ``mark_payout_paid`` with its own reference, as ``payments.py`` is the seam for
money coming in."""

from __future__ import annotations

import logging
from typing import Protocol

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from hub.accounts.models import User
from hub.billing import services
from hub.billing.models import LedgerEntry, Payout
from hub.billing.money import format_micros

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
    """Earnings less what was paid out: the part of a balance that came from renting GPUs out.
    Top-ups, payments and adjustments are not in it, so credit bought with a card (perhaps a
    stolen one) can be spent on rentals but never turned back into a transfer."""
    totals = LedgerEntry.objects.filter(
        account=account, kind__in=[LedgerEntry.Kind.EARNING, LedgerEntry.Kind.PAYOUT]
    ).aggregate(total=Sum("amount_micros"))
    return int(totals["total"] or 0)


def payable_micros(account: User) -> int:
    """What a supplier can ask to be paid now: earnings not yet paid out, less what they asked
    for already, and never more than the balance (earnings spent on rentals are gone); never
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
    log.info("payout %s marked paid by admin %s", payout.pk, by.pk)
    return payout


def cancel_payout(payout_id: int, by: User) -> bool:
    """The supplier's own, or staff: a requested payout no longer holds its money."""
    payouts = Payout.objects.filter(pk=payout_id, state=Payout.State.REQUESTED)
    if not by.is_staff:
        payouts = payouts.filter(account=by)
    return bool(payouts.update(state=Payout.State.CANCELLED, handled_by=by))
