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
        ]

    def __str__(self) -> str:
        who = self.account_id if self.account_id is not None else "platform"
        return f"{self.kind} {format_rate(self.amount_micros)} ({who})"
