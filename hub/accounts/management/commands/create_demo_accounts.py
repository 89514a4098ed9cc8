from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from hub.accounts.services import create_demo_accounts


class Command(BaseCommand):
    help = "Create the demo admin, renter and supplier accounts (passwords printed once)."

    def handle(self, *args: Any, **options: Any) -> None:
        created = create_demo_accounts()
        if not created:
            self.stdout.write("Demo accounts already exist (passwords were shown when created).")
            return
        self.stdout.write("Demo accounts created; passwords are shown this once:")
        for account in created:
            role = "admin (staff, superuser)" if account.is_staff else account.username
            self.stdout.write(
                f"  demo-account username={account.username} password={account.password}  [{role}]"
            )
