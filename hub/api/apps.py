from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "hub.api"
    label = "api"
    verbose_name = "REST API"
    default_auto_field = "django.db.models.BigAutoField"
