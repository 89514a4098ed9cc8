from __future__ import annotations

from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    name = "hub.rollouts"
    label = "rollouts"
    verbose_name = "Agent rollouts"
    default_auto_field = "django.db.models.BigAutoField"
