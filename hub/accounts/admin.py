from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from hub.accounts.api_tokens import revoke_api_token
from hub.accounts.models import ApiToken

# The User admin (with balances and "Adjust balance") is registered by hub/billing/admin.py:
# billing builds on accounts, not the other way round.


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "prefix",
        "name",
        "user",
        "scope_list",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "created_at")
    list_select_related = ("user",)
    search_fields = ("prefix", "name", "user__username", "user__email")
    # The digest is never shown: it is not the secret, but nobody needs it on a screen.
    fields = ("user", "name", "prefix", "scope_list", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    actions = ("revoke",)

    @admin.display(description="scopes")
    def scope_list(self, token: ApiToken) -> str:
        return ", ".join(token.scopes) or "none"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the renter creates it, and sees its plaintext once

    def has_delete_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False  # revoke instead: the row says when it stopped working

    @admin.action(description="Revoke selected API tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = sum(
            revoke_api_token(token.user, token.pk) for token in queryset.select_related("user")
        )
        self.message_user(request, f"Revoked {revoked} API token(s).", messages.SUCCESS)
