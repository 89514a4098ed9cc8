from __future__ import annotations

from django.contrib import admin

from hub.catalog.models import Template


@admin.register(Template)
class TemplateAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "image", "ports", "min_vram_bytes", "listed", "position")
    list_filter = ("listed",)
    list_editable = ("listed", "position")
    search_fields = ("name", "slug", "image")
    prepopulated_fields = {"slug": ("name",)}
