"""The Celery application shared by the worker, beat and the web processes (which queue tasks)."""

from __future__ import annotations

import logging.config
import os
from pathlib import Path
from typing import Any

from celery import Celery, bootsteps
from celery.signals import setup_logging

from hub.lib import celery_ack_watchdog
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

# The worker runs without remote control (settings: CELERY_WORKER_ENABLE_REMOTE_CONTROL, two
# Redis connections fewer), so `celery inspect ping` has nobody to answer it. Instead, with
# CELERY_WORKER_ALIVE_FILE set, the worker's main process touches that file every
# ALIVE_EVERY_S from its consumer's event loop (the loop that answered the ping), and
# docker-compose's health check reads the file's age.
ALIVE_EVERY_S = 10.0


class AliveFile(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.path = os.environ.get("CELERY_WORKER_ALIVE_FILE", "")
        self.timer_entry: Any = None

    def start(self, consumer: Any) -> None:
        if not self.path:
            return
        Path(self.path).touch()
        self.timer_entry = consumer.timer.call_repeatedly(
            ALIVE_EVERY_S, Path(self.path).touch, priority=10
        )

    def stop(self, consumer: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None


app.steps["consumer"].add(AliveFile)
celery_ack_watchdog.install(app)


if os.environ.get("LOG_FORMAT", "").strip().lower() == "json":
    # Celery replaces the root logger's handlers with its own plain format; with LOG_FORMAT=json
    # the worker and beat keep the hub's LOGGING (hub/settings.py) instead. Connected only then:
    # any receiver at all turns Celery's own logging set-up off.
    def _hub_logging(**kwargs: Any) -> None:
        from django.conf import settings

        logging.config.dictConfig(settings.LOGGING)

    setup_logging.connect(_hub_logging, weak=False)
