from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    """One account for every person: a renter, a supplier, or both; admins are staff.

    A project-owned user model from the first migration, because swapping it later is painful.
    """


class ApiToken(models.Model):
    """A renter's credential for the REST API (``Authorization: Bearer cgpr_...``).

    Like agent tokens, only a SHA-256 digest is stored: the token carries ~178 random bits, so a
    fast hash is enough and a lookup stays one indexed query (hub/accounts/api_tokens.py).
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    # The visible start of the token ("cgpr_3fa9c1"), so a renter can tell tokens apart.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None
