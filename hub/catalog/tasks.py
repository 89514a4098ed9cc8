from __future__ import annotations

from celery import shared_task

from hub.catalog.uptime import refresh_uptimes as refresh


@shared_task(name="catalog.refresh_uptimes", ignore_result=True)
def refresh_uptimes() -> int:
    return refresh()
