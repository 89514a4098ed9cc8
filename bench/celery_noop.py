"""The no-op Celery task behind the B_celery baseline: it returns how long after its publishing
it started. Its worker runs with the hub's broker, pool size and prefetch settings, on a queue
of its own so that it never takes the hub's tasks.

    celery -A bench.celery_noop worker -c 2 -Q cloudgpu-bench-noop
"""

from __future__ import annotations

import os
import time

from celery import Celery

QUEUE = "cloudgpu-bench-noop"
TASK = "bench.noop"


def make_app(broker_url: str) -> Celery:
    celery_app = Celery("bench_noop", broker=broker_url, backend=broker_url)
    celery_app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=600,
        broker_connection_retry_on_startup=True,
    )

    @celery_app.task(name=TASK)
    def noop(published_at: float) -> float:
        return time.time() - published_at

    return celery_app


app = make_app(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/3"))
