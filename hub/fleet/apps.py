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
        # The app list stays on the index; beside every list it took a third of a laptop's
        # width, and the hosts list no longer fitted its columns.
        admin.site.enable_nav_sidebar = False
