"""Rollouts in the admin: a record to read. They are started, paused, resumed and aborted on
the fleet page (/admin/fleet/), where their progress is."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from hub.rollouts.models import Rollout, RolloutHost


@admin.register(RolloutHost)
class RolloutHostAdmin(admin.ModelAdmin):
    """Each host's record in a rollout: filter by rollout and state (thousands per rollout,
    so a list with pages, not an inline on the rollout)."""

    list_display = ("host", "rollout", "wave", "state", "from_version", "updated_at", "detail")
    list_filter = ("state", "rollout")
    list_select_related = ("host", "rollout")
    search_fields = ("host__hostname", "host__name", "detail")
    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ("version", "state", "wave", "created_at", "created_by", "finished_at")
    list_filter = ("state",)
    readonly_fields = (
        "version",
        "percents",
        "named_first",
        "pause_s",
        "force",
        "state",
        "reason",
        "wave",
        "wave_started_at",
        "next_wave_at",
        "self_paused",
        "accepted_wave",
        "created_by",
        "created_at",
        "finished_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # from the fleet page, which checks the served release

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
