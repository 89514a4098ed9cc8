"""A Celery app for tests/hub/test_celery_ack_watchdog.py: the hub's broker settings that
matter for a lost ack (acks late, prefetch 1, no remote control) and the hub's watchdog, on a
Redis of the test's own (ACK_TEST_BROKER), with a task that signals through a file in
ACK_TEST_DIR. ACK_TEST_WATCHDOG=0 leaves the watchdog out (to see the worker stall)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

from hub.lib import celery_ack_watchdog


def make_app(broker_url: str) -> Celery:
    # Not the current app: imported into a test process, it would otherwise become the app
    # the hub's shared tasks send through (to this test's Redis, killed by then).
    app = Celery("ack_test", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )
    return app


app = make_app(os.environ.get("ACK_TEST_BROKER", "redis://127.0.0.1:1/0"))
if os.environ.get("ACK_TEST_WATCHDOG", "1") != "0":
    celery_ack_watchdog.install(app)


@app.task(name="ack_test.mark")
def mark(name: str) -> None:
    """Some work, then a mark: a worker that is always busy with one of these is most often
    mid-task when the test kills Redis, so the ack at its end is the one lost."""
    time.sleep(0.05)
    (Path(os.environ["ACK_TEST_DIR"]) / f"{name}.done").touch()
