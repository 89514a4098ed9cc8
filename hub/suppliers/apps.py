from __future__ import annotations

from django.apps import AppConfig


class SuppliersConfig(AppConfig):
    name = "hub.suppliers"
