from __future__ import annotations

import time

from celery import shared_task
from django.db import DatabaseError
from redis.exceptions import RedisError

from hub.agents import stats, sweep
from hub.lib import metrics

# The names are those from before these tasks moved out of hub.suppliers: during a rolling
# deploy the previous release's beat still sends them, and a worker of either release runs them.


@shared_task(name="suppliers.mark_overdue_hosts_offline")
def mark_overdue_hosts_offline() -> int:
    return len(sweep.mark_overdue_hosts_offline())


@shared_task(name="suppliers.flush_heartbeat_stats")
def flush_heartbeat_stats() -> int:
    started = time.perf_counter()
    try:
        written = stats.flush_pending()
    except DatabaseError:
        metrics.STORE_ERRORS.labels("postgres").inc()
        raise
    except RedisError:
        metrics.STORE_ERRORS.labels("redis").inc()
        raise
    metrics.FLUSH_SECONDS.observe(time.perf_counter() - started)
    metrics.FLUSH_HOSTS.observe(written)
    return written
