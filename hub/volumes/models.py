"""Renters' volumes on supplier hosts: the ones they create, and their template caches.

A volume lives on one host's disk (the agent creates it when a lease first mounts it) and
belongs to one renter: no lease of anyone else ever mounts it. The agent reports sizes and
removals (``volume_report``); a removed volume keeps its row, so its owner reads why it went.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from hub.suppliers.models import Host


class Volume(models.Model):
    class Kind(models.TextChoices):
        VOLUME = "volume"  # made by the renter, mounted where they say
        CACHE = "cache"  # a template's cache, made when a lease of the template first ran

    class State(models.TextChoices):
        ACTIVE = "active"
        DELETING = "deleting"  # the renter deleted it; the agent has not confirmed yet
        REMOVED = "removed"

    class Reason(models.TextChoices):
        DELETED = "deleted"  # by its owner
        IDLE = "idle"  # unused for the host's idle limit (VOLUME_IDLE_DAYS on the agent)
        DISK_LOW = "disk_low"  # the host's disk fell under its floor; oldest went first

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    renter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="volumes"
    )
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="volumes")
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.VOLUME)
    # The renter's name for it, or a cache's image (what the renter recognises it by).
    label = models.CharField(max_length=64)
    # The name on the wire ("vol-<40 hex>", "renter-<40 hex>"): a keyed hash, so the supplier
    # learns neither who owns it nor what it is called.
    wire_name = models.CharField(max_length=64, unique=True)
    size_cap_bytes = models.BigIntegerField(null=True, blank=True)
    # The agent's last measurement (hourly and on reconnect).
    used_bytes = models.BigIntegerField(null=True, blank=True)
    over_cap = models.BooleanField(default=False)
    in_use = models.BooleanField(default=False)
    measured_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Set when a lease first mounts it: before that it exists on no disk.
    first_mounted_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.ACTIVE)
    removed_reason = models.CharField(max_length=8, choices=Reason.choices, blank=True)
    removed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["renter", "host", "kind", "label"],
                condition=Q(kind="volume") & ~Q(state="removed"),
                name="volume_unique_live_label",
            )
        ]
        indexes = [
            models.Index(
                fields=["host", "state"],
                condition=Q(state="deleting"),
                name="volume_deleting_idx",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.label} on {self.host_id} ({self.state})"

    @property
    def live(self) -> bool:
        return self.state != self.State.REMOVED
