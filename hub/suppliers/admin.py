"""Admin for suppliers' tokens, hosts and GPUs.

What agents report (hardware, status, liveness, the connection's channel) is read-only here:
only services write it, and status changes must leave a HostTransition row. Admins may edit
the knobs that are theirs: a host's maintenance flag, a GPU's listing and price, a token's name.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from hub.lib.timewords import ago
from hub.suppliers import transitions
from hub.suppliers.models import AgentToken, Gpu, Host, HostTransition
from hub.suppliers.services import revoke_agent_token


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = (
        "prefix",
        "name",
        "owner",
        "hosts_count",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "created_at")
    list_select_related = ("owner",)
    search_fields = ("prefix", "name", "owner__username", "owner__email")
    # The digest is never shown: it is not the secret, but nobody needs it on a screen.
    fields = ("owner", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("owner", "prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[AgentToken]:
        return super().get_queryset(request).annotate(host_count=Count("hosts"))

    @admin.display(description="hosts", ordering="host_count")
    def hosts_count(self, token: AgentToken) -> int:
        return token.host_count  # type: ignore[attr-defined]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A token is created by a service that shows its plaintext once; a form can't do that.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AgentToken | None = None) -> bool:
        return False  # revoke instead: that also closes the agents' live connections

    @admin.action(description="Revoke selected tokens (closes their agents' connections)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[AgentToken]) -> None:
        revoked = sum(revoke_agent_token(pk) for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    can_delete = False
    show_change_link = True
    fields = (
        "index",
        "name",
        "uuid",
        "memory_total_bytes",
        "utilization_pct",
        "present",
        "listed",
        "price_per_hour_micros",
    )
    readonly_fields = ("index", "name", "uuid", "memory_total_bytes", "utilization_pct", "present")

    def has_add_permission(self, request: HttpRequest, obj: Host | None = None) -> bool:
        return False  # GPUs come from the agent's register message


class HostTransitionInline(admin.TabularInline):
    model = HostTransition
    extra = 0
    fields = ("at", "from_status", "to_status", "reason")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Host | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Host | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Host | None = None) -> bool:
        return False


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    # Few, short columns: the list fits a laptop's width (details are on each host's page).
    list_display = (
        "host_label",
        "owner",
        "status",
        "maintenance",
        "gpus_count",
        "agent",
        "location",
        "last_seen",
    )
    # agent_version: the fleet page's versions table links each version to its hosts here.
    list_filter = ("status", "maintenance", "runtime", "location", "agent_version")
    actions = ("drain", "undrain")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Host]:
        return super().get_queryset(request).annotate(gpu_count=Count("gpus"))

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpus_count(self, host: Host) -> int:
        return host.gpu_count  # type: ignore[attr-defined]

    @admin.action(description="Drain selected hosts (no new leases; running ones go on)")
    def drain(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        # Compare-and-set per host (transitions.py): only hosts not drained yet count, however
        # often an admin clicks, and each change leaves a transition row with the admin's name.
        ids = list(queryset.values_list("pk", flat=True))
        drained = transitions.set_maintenance(ids, True, f"drained by admin {request.user}")
        self.message_user(request, f"Drained {drained} host(s).", messages.SUCCESS)

    @admin.action(description="Undrain selected hosts (take new leases again)")
    def undrain(self, request: HttpRequest, queryset: QuerySet[Host]) -> None:
        ids = list(queryset.values_list("pk", flat=True))
        undrained = transitions.set_maintenance(ids, False, f"undrained by admin {request.user}")
        self.message_user(request, f"Undrained {undrained} host(s).", messages.SUCCESS)

    @admin.display(description="host", ordering="hostname")
    def host_label(self, host: Host) -> str:
        return host.label

    @admin.display(description="agent", ordering="agent_version")
    def agent(self, host: Host) -> str:
        version = host.agent_version or "unknown"
        extra = [host.runtime] if host.runtime != "docker" else []
        if host.agent_outdated:
            extra.append("outdated")
        return f"{version} ({', '.join(extra)})" if extra else version

    @admin.display(description="last seen", ordering="last_seen_at")
    def last_seen(self, host: Host) -> str:
        return ago(host.last_seen_at) if host.last_seen_at else "never"

    list_select_related = ("owner",)
    search_fields = ("hostname", "name", "location", "agent_id", "owner__username", "owner__email")
    readonly_fields = (
        "owner",
        "token",
        "agent_id",
        "hostname",
        "os",
        "arch",
        "cpu_model",
        "cpu_count",
        "ram_bytes",
        "disk_free_bytes",
        "driver_version",
        "cuda_version",
        "rtt_ms",
        "agent_version",
        "runtime",
        "status",
        "offline_after",
        "last_seen_at",
        "channel_name",
        "machine_id",
        "release_stuck_since",
        "release_stuck_reason",
        "created_at",
    )
    inlines = (GpuInline, HostTransitionInline)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # hosts exist because an agent registered

    def save_model(self, request: HttpRequest, obj: Host, form: Any, change: bool) -> None:
        # The maintenance flag changes through transitions.py, like the drain action, so the
        # change leaves its transition row with the admin's name.
        if change and "maintenance" in form.changed_data:
            wanted = obj.maintenance
            obj.maintenance = not wanted
            super().save_model(request, obj, form, change)
            transitions.set_maintenance([obj.pk], wanted, f"set by admin {request.user}")
            obj.maintenance = wanted
            return
        super().save_model(request, obj, form, change)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "host",
        "index",
        "name",
        "listed",
        "price_per_hour_micros",
        "present",
        "utilization_pct",
        "stats_updated_at",
    )
    list_filter = ("listed", "present", "name")
    list_select_related = ("host",)
    search_fields = ("name", "uuid", "host__hostname")
    readonly_fields = (
        "host",
        "index",
        "uuid",
        "name",
        "memory_total_bytes",
        "memory_used_bytes",
        "utilization_pct",
        "processes",
        "present",
        "foreign_process_seen_at",
        "stats_updated_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(HostTransition)
class HostTransitionAdmin(admin.ModelAdmin):
    list_display = ("at", "host", "from_status", "to_status", "reason")
    list_filter = ("to_status", "at")
    list_select_related = ("host",)
    search_fields = ("host__hostname", "reason")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: HostTransition | None = None
    ) -> bool:
        return False

    def has_delete_permission(
        self, request: HttpRequest, obj: HostTransition | None = None
    ) -> bool:
        return False
