"""The CloudGPU hub: a Django project (web, Celery worker and beat)."""

from __future__ import annotations

from hub.celery import app as celery_app

__all__ = ["celery_app"]
