from __future__ import annotations

from celery import shared_task

from hub.suppliers import services, stats


@shared_task(name="suppliers.mark_overdue_hosts_offline")
def mark_overdue_hosts_offline() -> int:
    return len(services.mark_overdue_hosts_offline())


@shared_task(name="suppliers.flush_heartbeat_stats")
def flush_heartbeat_stats() -> int:
    return stats.flush_pending()
