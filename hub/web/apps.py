from __future__ import annotations

from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "hub.web"
    label = "web"
    verbose_name = "Dashboard"
