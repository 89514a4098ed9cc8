"""Account services."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.db import transaction

from hub.accounts.models import User

DEMO_USERNAMES = ("admin", "renter", "supplier")


@dataclass(frozen=True)
class DemoAccount:
    username: str
    password: str
    is_staff: bool


@transaction.atomic
def create_demo_accounts() -> list[DemoAccount]:
    """Create the demo admin, renter and supplier with fresh random passwords.

    Returns only the accounts created now, so their passwords are shown once; existing
    accounts (a second `make run`) are left exactly as their owners left them.
    """
    created: list[DemoAccount] = []
    for username in DEMO_USERNAMES:
        if User.objects.filter(username=username).exists():
            continue
        password = secrets.token_urlsafe(12)
        is_admin = username == "admin"
        User.objects.create_user(
            username=username,
            password=password,
            email=f"{username}@example.com",
            is_staff=is_admin,
            is_superuser=is_admin,
        )
        created.append(DemoAccount(username, password, is_admin))
    return created
