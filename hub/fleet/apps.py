from __future__ import annotations

from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "hub.fleet"
    label = "fleet"
    verbose_name = "Fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The admin is CloudGPU's, not "Django administration"; the fleet page, which is not
        # a model, is linked from the index (templates/admin/index.html).
        from django.contrib import admin

        admin.site.site_header = "CloudGPU admin"
        admin.site.site_title = "CloudGPU admin"
        admin.site.index_title = "Run the market"
