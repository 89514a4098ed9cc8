"""Enrollment codes in the admin, read-only: codes are made on the supplier's tokens page (their
plaintext shown once) and used up by the installer; nobody edits one."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from hub.installer.models import EnrollmentCode


@admin.register(EnrollmentCode)
class EnrollmentCodeAdmin(admin.ModelAdmin):
    list_display = (
        "prefix",
        "name",
        "owner",
        "created_at",
        "expires_at",
        "used_at",
        "used_by_host",
        "used_from",
        "token",
        "revoked_at",
    )
    list_filter = (("used_at", admin.EmptyFieldListFilter), "created_at")
    list_select_related = ("owner", "token")
    search_fields = ("prefix", "name", "owner__username", "used_by_host")
    # The digest is never shown: it is not the secret, but nobody needs it on a screen.
    fields = (
        "owner",
        "name",
        "prefix",
        "created_at",
        "expires_at",
        "used_at",
        "used_from",
        "used_by_host",
        "token",
        "revoked_at",
    )
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: EnrollmentCode | None = None
    ) -> bool:
        return False

    def has_delete_permission(
        self, request: HttpRequest, obj: EnrollmentCode | None = None
    ) -> bool:
        return False
