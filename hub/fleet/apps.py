from __future__ import annotations

from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "hub.fleet"
    label = "fleet"
    verbose_name = "Fleet"
    default_auto_field = "django.db.models.BigAutoField"
