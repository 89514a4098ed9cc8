from __future__ import annotations

from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "hub.leases"
