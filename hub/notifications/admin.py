"""Admin for notifications: view-only, so an admin sees what went out, to whom, and why a
delivery failed, without ever seeing an endpoint's secret."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint


class _ViewOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False


@admin.register(Event)
class EventAdmin(_ViewOnly):
    list_display = ("id", "account", "kind", "state", "email_state", "created_at", "done_at")
    list_filter = ("kind", "state", "email_state", "created_at")
    list_select_related = ("account",)
    search_fields = ("id", "account__username", "account__email")
    date_hierarchy = "created_at"
    fields = (
        "id", "account", "kind", "data", "created_at", "due_at", "state", "done_at",
        "webhooks_made", "email_state", "email_attempts", "email_error",
    )  # fmt: skip
    readonly_fields = fields


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(_ViewOnly):
    list_display = (
        "id", "account", "url", "enabled", "consecutive_failures", "last_success_at",
        "last_failure_at", "created_at",
    )  # fmt: skip
    list_filter = ("enabled",)
    list_select_related = ("account",)
    search_fields = ("url", "account__username")
    # Not the secret: it signs the account's deliveries and is its owner's alone.
    fields = (
        "account", "url", "description", "kinds", "enabled", "created_at", "last_success_at",
        "last_failure_at", "consecutive_failures",
    )  # fmt: skip
    readonly_fields = fields


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(_ViewOnly):
    list_display = (
        "id", "endpoint", "event", "state", "attempts", "last_status", "last_error",
        "created_at", "next_attempt_at", "delivered_at",
    )  # fmt: skip
    list_filter = ("state", "created_at")
    list_select_related = ("endpoint", "event")
    date_hierarchy = "created_at"
    fields = (
        "event", "endpoint", "state", "attempts", "created_at", "next_attempt_at",
        "last_attempt_at", "delivered_at", "last_status", "last_error", "duration_ms",
    )  # fmt: skip
    readonly_fields = fields
