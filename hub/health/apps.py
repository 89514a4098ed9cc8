from __future__ import annotations

from django.apps import AppConfig


class HealthConfig(AppConfig):
    name = "hub.health"
