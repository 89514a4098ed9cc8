"""Adding funds while no payment processor is wired in: a renter asks (``request_top_up``), an
admin adds the money from the person's own admin page (``add_top_up``: an adjustment with the
reason and the admin's name, which answers the request). A processor, when there is one,
comes in through ``hub/billing/payments.py`` instead."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from hub.accounts.models import User
from hub.billing import low_balance, services
from hub.billing.models import LedgerEntry, TopUpRequest
from hub.billing.money import MICROS_PER_UNIT

MIN_REQUEST_MICROS = 1 * MICROS_PER_UNIT
MAX_REQUEST_MICROS = 100_000 * MICROS_PER_UNIT
# A person's requests waiting at once: a form cannot fill the admins' queue.
MAX_WAITING = 5


def waiting_requests(account: User) -> list[TopUpRequest]:
    return list(
        TopUpRequest.objects.filter(account=account, state=TopUpRequest.State.WAITING).order_by(
            "created_at", "pk"
        )
    )


def request_top_up(account: User, amount_micros: int, note: str = "") -> TopUpRequest:
    if not MIN_REQUEST_MICROS <= amount_micros <= MAX_REQUEST_MICROS:
        raise services.BillingError("ask for between $1 and $100,000")
    note = " ".join(note.split())[:500]
    with transaction.atomic():
        # Serialises one person's requests, so the cap holds under double clicks.
        User.objects.select_for_update().filter(pk=account.pk).first()
        waiting = TopUpRequest.objects.filter(account=account, state=TopUpRequest.State.WAITING)
        if waiting.count() >= MAX_WAITING:
            raise services.BillingError(
                f"you have {MAX_WAITING} requests waiting already; an admin will answer them"
            )
        return TopUpRequest.objects.create(account=account, amount_micros=amount_micros, note=note)


def add_top_up(
    account: User,
    amount_micros: int,
    reason: str,
    by: User,
    *,
    answers: int | None = None,
) -> LedgerEntry:
    """An admin's top-up (or correction) of one person, answering one of their waiting
    requests when ``answers`` names it."""
    with transaction.atomic():
        request = None
        if answers is not None:
            request = (
                TopUpRequest.objects.select_for_update()
                .filter(pk=answers, account=account, state=TopUpRequest.State.WAITING)
                .first()
            )
            if request is None:
                raise services.BillingError("that request was answered already")
        entry = services.adjust(account, amount_micros, reason, by)
        if request is not None:
            request.state = TopUpRequest.State.ADDED
            request.handled_at = timezone.now()
            request.handled_by = by
            request.ledger_entry = entry
            request.save(update_fields=["state", "handled_at", "handled_by", "ledger_entry"])
        # At once rather than at the next billing sweep: a top-up back above the threshold
        # re-arms the low-balance notice, a correction below it sends one.
        low_balance.review_low_balances(renter_ids=[account.pk])
    return entry


def decline_top_up(request_id: int, by: User) -> bool:
    return bool(
        TopUpRequest.objects.filter(pk=request_id, state=TopUpRequest.State.WAITING).update(
            state=TopUpRequest.State.DECLINED, handled_at=timezone.now(), handled_by=by
        )
    )
