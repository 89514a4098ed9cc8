"""Rollouts in the admin: a record to read. They are started, paused, resumed and aborted on
the fleet page (/admin/fleet/), where their progress is."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from hub.rollouts.models import Rollout, RolloutHost


class RolloutHostInline(admin.TabularInline):
    model = RolloutHost
    fields = ("host", "wave", "state", "from_version", "sent_at", "upgraded_at", "detail")
    readonly_fields = fields
    extra = 0
    can_delete = False
    max_num = 0
    show_change_link = False


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
        "accepted_wave",
        "created_by",
        "created_at",
        "finished_at",
    )
    inlines = [RolloutHostInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # from the fleet page, which checks the served release

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
