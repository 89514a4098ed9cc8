from __future__ import annotations

import uuid
from pathlib import Path

import psutil

from hub.health.tasks import echo
from tests.support.processes import hub_env, python_module, running


def test_task_round_trips_through_redis_to_a_real_worker(tmp_path: Path) -> None:
    # A queue of its own, so no other worker on the same Redis can take the task.
    queue = f"test-{uuid.uuid4().hex}"
    payload = uuid.uuid4().hex
    worker_argv = python_module(
        "celery", "-A", "hub", "worker", "-Q", queue, "-c", "1", "-P", "solo", "-l", "INFO",
        "-n", f"{queue}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    )  # fmt: skip
    alive = tmp_path / "alive"
    env = hub_env(CELERY_WORKER_ALIVE_FILE=str(alive))
    with running(worker_argv, env=env, log=tmp_path / "worker.log") as worker:
        result = echo.apply_async((payload,), queue=queue)
        # get() polls the Redis result backend until the deadline; the worker may still be
        # starting when the task is published, and the broker keeps it until then.
        try:
            reply = result.get(timeout=90)
        finally:
            result.forget()
        assert reply["payload"] == payload
        assert reply["worker_pid"] == worker.pid  # -P solo runs tasks in the worker process
        assert psutil.Process(worker.pid).is_running()
        # docker-compose's health check of the worker (no remote control to answer `celery
        # inspect ping`): the consumer touched its alive file when it started.
        assert alive.exists()
