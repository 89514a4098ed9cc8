from __future__ import annotations

from django.contrib.auth.models import AbstractUser


class User(AbstractUser):
    """One account for every person: a renter, a supplier, or both; admins are staff.

    A project-owned user model from the first migration, because swapping it later is painful.
    """
