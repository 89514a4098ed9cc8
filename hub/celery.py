"""The Celery application shared by the worker, beat and the web processes (which queue tasks)."""

from __future__ import annotations

import logging.config
import os
from typing import Any

from celery import Celery
from celery.signals import setup_logging

from hub.lib.metrics_dir import sweep

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
# The metrics folder must exist before the first metric is made (hub/lib/metrics_dir.py); the
# worker and beat may start before the web process that would make it. Processes that used it
# before (this container's previous run) are folded into its archive now.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], mode=0o700, exist_ok=True)
    sweep(os.environ["PROMETHEUS_MULTIPROC_DIR"])

app = Celery("hub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


if os.environ.get("LOG_FORMAT", "").strip().lower() == "json":
    # Celery replaces the root logger's handlers with its own plain format; with LOG_FORMAT=json
    # the worker and beat keep the hub's LOGGING (hub/settings.py) instead. Connected only then:
    # any receiver at all turns Celery's own logging set-up off.
    def _hub_logging(**kwargs: Any) -> None:
        from django.conf import settings

        logging.config.dictConfig(settings.LOGGING)

    setup_logging.connect(_hub_logging, weak=False)
