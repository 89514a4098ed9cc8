from __future__ import annotations

from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "hub.catalog"
    label = "catalog"
    verbose_name = "Catalog"
    default_auto_field = "django.db.models.BigAutoField"
