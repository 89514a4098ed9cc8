"""Enrollment codes: what the install one-liner carries instead of an agent token.

A code is single-use and short-lived, so the copy that lands in ``ps``, shell history and sudo
logs of the supplier's host is worthless once the installer has exchanged it. Like agent
tokens, only its SHA-256 digest is stored.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from hub.suppliers.models import AgentToken


class EnrollmentCode(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="enrollment_codes"
    )
    # Becomes the name of the agent token the code is exchanged for.
    name = models.CharField(max_length=100, blank=True)
    # The visible start of the code ("cgpe_3fa9c1"), so a supplier can tell codes apart.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    # Who exchanged it (REMOTE_ADDR and the hostname the installer reported), for the admin.
    used_from = models.GenericIPAddressField(null=True, blank=True)
    used_by_host = models.CharField(max_length=255, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    token = models.ForeignKey(
        AgentToken,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="enrollment_codes",
    )

    class Meta:
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"
