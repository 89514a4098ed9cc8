"""The seam for a payment processor (none is wired in yet).

A processor integration has two halves: sending the person to pay (``PaymentProcessor``), and
a webhook view that verifies the processor's event and calls ``record_payment``. Processors
deliver events at least once, so recording is idempotent by the processor's own reference.
"""

from __future__ import annotations

import logging
from typing import Protocol

from django.db import IntegrityError, transaction

from hub.accounts.models import User
from hub.billing import low_balance, services
from hub.billing.models import LedgerEntry
from hub.billing.money import format_micros

log = logging.getLogger(__name__)


class PaymentProcessor(Protocol):
    # Short and stable ("stripe"): it prefixes every reference recorded in the ledger.
    name: str

    def start_checkout(self, account: User, amount_micros: int, return_url: str) -> str:
        """Create a checkout for ``amount_micros`` and return the URL where the person pays."""
        ...


def record_payment(
    account: User, amount_micros: int, *, processor: str, external_ref: str, reason: str = ""
) -> tuple[LedgerEntry, bool]:
    """Credit a payment once. Returns (entry, created): a repeated event returns the row
    written the first time; the same reference with other details is refused."""
    if amount_micros <= 0:
        raise services.BillingError("a payment must be a positive amount")
    if not processor or not external_ref:
        raise services.BillingError("a payment needs its processor and the processor's reference")
    ref = f"{processor}:{external_ref}"
    entry = LedgerEntry.objects.filter(external_ref=ref).first()
    created = False
    if entry is None:
        try:
            with transaction.atomic():
                entry = LedgerEntry.objects.create(
                    account=account,
                    kind=LedgerEntry.Kind.PAYMENT,
                    amount_micros=amount_micros,
                    external_ref=ref,
                    reason=reason or f"payment through {processor}",
                )
                # Only with the row that credits it: a repeated delivery announces nothing.
                services.notify_credited(account, amount_micros)
                created = True
        except IntegrityError:
            # The same event, delivered twice at once: the other delivery wrote it.
            entry = LedgerEntry.objects.get(external_ref=ref)
    if entry.account_id != account.pk or entry.amount_micros != amount_micros:
        raise services.BillingError(f"payment {ref} is already recorded with other details")
    if created:
        log.info("payment %s of %s for user %s", ref, format_micros(amount_micros), account.pk)
        services.review_funds(renter_ids=[account.pk])
        low_balance.review_low_balances(renter_ids=[account.pk])
    return entry, created
