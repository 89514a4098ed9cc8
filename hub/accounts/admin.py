from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from hub.accounts.models import User
from hub.billing.admin import BalanceAdminMixin


@admin.register(User)
class HubUserAdmin(BalanceAdminMixin, UserAdmin):
    list_display = (*UserAdmin.list_display, "balance")
