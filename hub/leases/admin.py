"""Admin for leases and the command outbox: view-only, because every lease and command change
is a state transition that a service makes under a lock. Admins stop a lease with the
"release" action, which goes through the same service as a renter's stop."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from hub.leases.models import Command, ExecSession, Lease, LeaseGpu
from hub.leases.services import release_lease


class ViewOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False  # leases and commands are the record of what ran and what was billed


class LeaseGpuInline(ViewOnlyMixin, admin.TabularInline):
    model = LeaseGpu
    extra = 0
    fields = ("gpu", "active")
    readonly_fields = fields


@admin.register(Lease)
class LeaseAdmin(ViewOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "renter",
        "host",
        "state",
        "end_reason",
        "image",
        "access_protected",
        "price_per_hour_micros",
        "created_at",
        "running_since",
        "foreign_process_seen_at",
        "ended_at",
    )
    list_filter = (
        "state",
        "end_reason",
        "access_protected",
        "created_at",
        ("foreign_process_seen_at", admin.EmptyFieldListFilter),
    )
    list_select_related = ("renter", "host")
    search_fields = ("id", "image", "renter__username", "renter__email", "host__hostname")
    date_hierarchy = "created_at"
    inlines = (LeaseGpuInline,)
    actions = ("release",)

    @admin.action(description="Force-release selected leases (end reason: admin)")
    def release(self, request: HttpRequest, queryset: QuerySet[Lease]) -> None:
        leases = [
            release_lease(pk, Lease.EndReason.ADMIN) for pk in queryset.values_list("pk", flat=True)
        ]
        stopping = sum(lease.state == Lease.State.STOPPING for lease in leases)
        self.message_user(request, f"Releasing {stopping} lease(s).", messages.SUCCESS)


@admin.register(Command)
class CommandAdmin(ViewOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "state",
        "lease",
        "host",
        "attempts",
        "ok",
        "next_attempt_at",
        "deadline",
        "error",
        "created_at",
    )
    list_filter = ("kind", "state", "ok", "created_at")
    list_select_related = ("lease", "host")
    search_fields = ("id", "lease__id", "host__hostname")
    date_hierarchy = "created_at"


@admin.register(ExecSession)
class ExecSessionAdmin(ViewOnlyMixin, admin.ModelAdmin):
    """Who opened a terminal or ran a command in which lease, when, for how long: the audit
    trail of every way into a renter's container (never what was typed)."""

    list_display = ("id", "lease", "user", "via", "opened_at", "closed_at", "exit_code")
    list_filter = ("via",)
    search_fields = ("lease__id", "user__username")
    date_hierarchy = "opened_at"
    list_select_related = ("user",)
