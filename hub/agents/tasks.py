from __future__ import annotations

from celery import shared_task

from hub.agents import stats, sweep

# The names are those from before these tasks moved out of hub.suppliers: during a rolling
# deploy the previous release's beat still sends them, and a worker of either release runs them.


@shared_task(name="suppliers.mark_overdue_hosts_offline")
def mark_overdue_hosts_offline() -> int:
    return len(sweep.mark_overdue_hosts_offline())


@shared_task(name="suppliers.flush_heartbeat_stats")
def flush_heartbeat_stats() -> int:
    return stats.flush_pending()
