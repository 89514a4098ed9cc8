from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from hub.accounts.models import User

admin.site.register(User, UserAdmin)
