"""The Celery application shared by the worker, beat and the web processes (which queue tasks)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
# The metrics folder must exist before the first metric is made (hub/lib/metrics_dir.py); the
# worker and beat may start before the web process that would make it.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], mode=0o700, exist_ok=True)

app = Celery("hub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
