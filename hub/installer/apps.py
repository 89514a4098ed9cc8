from __future__ import annotations

from django.apps import AppConfig


class InstallerConfig(AppConfig):
    name = "hub.installer"
