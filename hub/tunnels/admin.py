"""Admin for tunnels: view-only (tunnels follow their lease), searchable by public id."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from hub.tunnels.models import Tunnel
from hub.tunnels.services import public_url


@admin.register(Tunnel)
class TunnelAdmin(admin.ModelAdmin):
    list_display = ("public_id", "lease", "container_port", "listen_port", "state", "url")
    list_filter = ("state",)
    search_fields = ("public_id", "lease__id")
    readonly_fields = [f.name for f in Tunnel._meta.fields]

    @admin.display(description="URL")
    def url(self, tunnel: Tunnel) -> str:
        return public_url(tunnel)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False
