from __future__ import annotations

from django.apps import AppConfig


class TunnelsConfig(AppConfig):
    name = "hub.tunnels"
    label = "tunnels"
    verbose_name = "Tunnels"
    default_auto_field = "django.db.models.BigAutoField"
