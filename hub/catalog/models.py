"""Templates: what a renter starts on a GPU (image, ports, env, command, cache volume)."""

from __future__ import annotations

from collections.abc import Collection

from django.core.exceptions import ValidationError
from django.db import models

from supplier_agent.mount_paths import mount_path_refusal


class Template(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    image = models.CharField(max_length=512)
    # Container ports that get a URL each (tunnels), e.g. [8888].
    ports = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    command = models.JSONField(null=True, blank=True)
    entrypoint = models.JSONField(null=True, blank=True)
    # Run in the container (exec, argv) once its ports answer and before the rental counts as
    # running: loading weights, compiling. Renters may replace it.
    warmup = models.JSONField(null=True, blank=True)
    # A folder in the container kept in a named volume on the host across rentals (model
    # weights, pip caches): re-renting the same template there starts warm.
    cache_volume_path = models.CharField(max_length=1024, blank=True)
    min_vram_bytes = models.BigIntegerField(default=0)
    # An env variable the template's command writes to /root/.ssh/authorized_keys (e.g.
    # PUBLIC_KEY): at rent time it gets the renter's account SSH keys, one per line.
    authorized_keys_env = models.CharField(max_length=128, blank=True)
    listed = models.BooleanField(default=True)
    # Lower first in the catalogue.
    position = models.PositiveIntegerField(default=100)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["position", "name"]

    def __str__(self) -> str:
        return self.name

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        # The agent refuses a rental whose cache path breaks the mount rule: say so to the
        # admin who sets it (the admin form shows it on the field), not to each renter later.
        # Here rather than in clean(): a form without the field (the list's editable columns)
        # must not fail on it; and rather than a field validator, which would need a migration.
        errors: dict[str, list[str]] = {}
        try:
            super().clean_fields(exclude=exclude)
        except ValidationError as exc:
            errors = exc.message_dict
        if "cache_volume_path" not in (exclude or ()) and "cache_volume_path" not in errors:
            refusal = self.cache_path_refusal()
            if refusal is not None:
                errors["cache_volume_path"] = [f"the cache path {refusal}"]
        if errors:
            raise ValidationError(errors)

    def cache_path_refusal(self) -> str | None:
        """Why this template's cache path may not be mounted, or None (also when it has none)."""
        if not self.cache_volume_path:
            return None
        return mount_path_refusal(self.cache_volume_path)
