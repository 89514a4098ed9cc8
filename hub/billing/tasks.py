"""Celery tasks of billing. The beat schedule runs ``charge_running_leases`` every
BILLING_INTERVAL_S; running it twice charges nothing the second time."""

from __future__ import annotations

from celery import shared_task

from hub.billing import services


@shared_task(name="billing.charge_running_leases")
def charge_running_leases() -> dict[str, int]:
    run = services.charge_running_leases()
    return {
        "leases": run.leases,
        "charged_micros": run.charged_micros,
        "warned": run.warned,
        "released": run.released,
    }
