from __future__ import annotations

from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "hub.leases"

    def ready(self) -> None:
        # Celery's autodiscovery imports only tasks.py: the retention task lives apart.
        from hub.leases import retention  # noqa: F401
