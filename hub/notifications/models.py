"""Events an account hears about, its email preferences, its webhook endpoints and their
deliveries. Events are rows first (written in the transaction of what happened), delivered
by Celery after commit and by the beat's sweep, so a lost task loses nothing."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models


class NotificationSettings(models.Model):
    """One row per account, made on first use. Absent: the defaults."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="notification_settings",
    )
    # None: no low-balance notice at all.
    low_balance_threshold_micros = models.BigIntegerField(null=True, blank=True)
    # Set when the notice went out; cleared once the balance is back above the threshold, so
    # one crossing gives one notice.
    low_balance_notified_at = models.DateTimeField(null=True, blank=True)
    email_muted = ArrayField(models.CharField(max_length=40), default=list, blank=True)

    def __str__(self) -> str:
        return f"notification settings of user {self.user_id}"


class Event(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        DONE = "done"

    class EmailState(models.TextChoices):
        NONE = "", "not yet"
        SENT = "sent"
        SKIPPED = "skipped"  # muted, no address, or a kind never emailed
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    account = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_events"
    )
    kind = models.CharField(max_length=40)
    # A coalesced kind's data is {"items": [...], "count": n}; others carry their fields.
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    due_at = models.DateTimeField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    done_at = models.DateTimeField(null=True, blank=True)
    email_state = models.CharField(
        max_length=8, choices=EmailState.choices, default=EmailState.NONE, blank=True
    )
    # Its webhook deliveries are made (apart from its email, so webhooks never wait on mail).
    webhooks_made = models.BooleanField(default=False)
    email_attempts = models.PositiveSmallIntegerField(default=0)
    email_error = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["due_at"],
                name="event_pending_due",
                condition=models.Q(state="pending"),
            ),
            models.Index(
                fields=["account", "kind"],
                name="event_pending_account_kind",
                condition=models.Q(state="pending"),
            ),
            models.Index(fields=["created_at"], name="event_created"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} for user {self.account_id} ({self.id})"


class WebhookEndpoint(models.Model):
    account = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    url = models.URLField(max_length=500)
    description = models.CharField(max_length=100, blank=True)
    # Signs every delivery (HMAC-SHA256); shown to its owner, never logged or emailed.
    secret = models.CharField(max_length=64)
    # Empty: every kind.
    kinds = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of user {self.account_id}: {self.url}"

    def wants(self, kind: str) -> bool:
        return self.enabled and (not self.kinds or kind in self.kinds)


class WebhookDelivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after WEBHOOK_RETRY_FOR_S

    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    state = models.CharField(max_length=9, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    next_attempt_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["event", "endpoint"], name="one_delivery_per_endpoint")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="delivery_pending_due",
                condition=models.Q(state="pending"),
            ),
            models.Index(fields=["endpoint", "-created_at"], name="delivery_endpoint_recent"),
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} of {self.event_id} to webhook {self.endpoint_id}"
