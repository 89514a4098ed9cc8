"""The ledger: every change of anyone's money is one row, and a balance is their rows' sum.

There is no stored balance that could drift from the rows. The platform's own account is the
rows without an account (kind ``fee``): no system user to create, protect or mistake for a
person, and its balance is the same indexed sum over ``account IS NULL``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from hub.billing.money import format_rate
from hub.leases.models import Lease


class LedgerEntry(models.Model):
    class Kind(models.TextChoices):
        CHARGE = "charge", "lease charge"  # a renter pays for a lease: negative
        EARNING = "earning", "supplier earning"  # the host's owner earns: positive
        FEE = "fee", "platform fee"  # the platform's cut, on the platform account: positive
        ADJUSTMENT = "adjustment", "admin adjustment"  # a top-up or correction by an admin
        PAYMENT = "payment", "payment"  # money paid in through a payment processor
        PAYOUT = "payout", "payout"  # money paid out to a supplier: negative

    # NULL is the platform's account (fees); every other row belongs to a person.
    account = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    amount_micros = models.BigIntegerField()
    lease = models.ForeignKey(
        Lease, null=True, blank=True, on_delete=models.PROTECT, related_name="ledger_entries"
    )
    # Metering rows: the instant the lease's cumulative charge runs up to after this batch.
    covers_until = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    # The admin behind an adjustment.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    # A payment processor's reference ("<processor>:<id>"): one row per payment, however often
    # the processor tells us about it.
    external_ref = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        indexes = [
            # Balances are SUM(amount) per account: an index-only scan, however long the ledger.
            models.Index(fields=["account"], include=["amount_micros"], name="ledger_balance_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["external_ref"],
                condition=~Q(external_ref=""),
                name="ledger_unique_external_ref",
            ),
            models.CheckConstraint(
                condition=(Q(kind="fee") & Q(account__isnull=True))
                | (~Q(kind="fee") & Q(account__isnull=False)),
                name="ledger_fees_only_on_platform",
            ),
            models.CheckConstraint(condition=~Q(amount_micros=0), name="ledger_amount_nonzero"),
            models.CheckConstraint(
                condition=~Q(kind="charge") | Q(amount_micros__lt=0),
                name="ledger_charge_negative",
            ),
            models.CheckConstraint(
                condition=~Q(kind__in=["earning", "fee", "payment"]) | Q(amount_micros__gt=0),
                name="ledger_income_positive",
            ),
            models.CheckConstraint(
                condition=~Q(kind="adjustment") | (~Q(reason="") & Q(created_by__isnull=False)),
                name="ledger_adjustment_has_reason_and_author",
            ),
            models.CheckConstraint(
                condition=~Q(kind="payout") | Q(amount_micros__lt=0),
                name="ledger_payout_negative",
            ),
        ]

    def __str__(self) -> str:
        who = self.account_id if self.account_id is not None else "platform"
        return f"{self.kind} {format_rate(self.amount_micros)} ({who})"


class TopUpRequest(models.Model):
    """A renter asking for funds while no payment processor is wired in: admins see it on the
    person's admin page and answer it with an adjustment (the ledger row it became)."""

    class State(models.TextChoices):
        WAITING = "waiting"
        ADDED = "added"
        DECLINED = "declined"

    account = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="topup_requests"
    )
    amount_micros = models.BigIntegerField()
    note = models.CharField(max_length=500, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.WAITING)
    created_at = models.DateTimeField(default=timezone.now)
    handled_at = models.DateTimeField(null=True, blank=True)
    handled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    ledger_entry = models.OneToOneField(
        LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, related_name="topup_request"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount_micros__gt=0), name="topup_positive"),
        ]

    def __str__(self) -> str:
        return f"top-up {format_rate(self.amount_micros)} for {self.account_id} ({self.state})"


class Payout(models.Model):
    """A supplier's request to be paid their balance. Requested money is held (it is not
    payable twice); the ledger row (kind ``payout``) is written when an admin marks it paid,
    with the reference of the transfer, through ``hub/billing/payouts.py``."""

    class State(models.TextChoices):
        REQUESTED = "requested"
        PAID = "paid"
        CANCELLED = "cancelled"

    account = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="payouts"
    )
    amount_micros = models.BigIntegerField()
    state = models.CharField(
        max_length=16, choices=State.choices, default=State.REQUESTED, db_index=True
    )
    requested_at = models.DateTimeField(default=timezone.now)
    # Where the money went: the bank transfer's or the processor's reference.
    reference = models.CharField(max_length=200, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    handled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    ledger_entry = models.OneToOneField(
        LedgerEntry, null=True, blank=True, on_delete=models.PROTECT, related_name="payout"
    )

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(amount_micros__gt=0), name="payout_positive"),
            models.CheckConstraint(
                condition=~Q(state="paid")
                | (~Q(reference="") & Q(ledger_entry__isnull=False) & Q(paid_at__isnull=False)),
                name="payout_paid_has_reference_and_row",
            ),
        ]

    def __str__(self) -> str:
        return f"payout {format_rate(self.amount_micros)} to {self.account_id} ({self.state})"
