from __future__ import annotations

import uuid
from pathlib import Path

import psutil

from hub.health.tasks import echo
from tests.support.processes import hub_env, python_module, running


def _worker_argv(queue: str, *options: str) -> list[str]:
    """One worker process (``-c 1``) on a queue of its own, so no other worker on the same
    Redis can take the test's tasks."""
    return python_module(
        "celery", "-A", "hub", "worker", "-Q", queue, "-c", "1", *options, "-l", "INFO",
        "-n", f"{queue}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    )  # fmt: skip


def test_task_round_trips_through_redis_to_a_real_worker(tmp_path: Path) -> None:
    # A queue of its own, so no other worker on the same Redis can take the task.
    queue = f"test-{uuid.uuid4().hex}"
    payload = uuid.uuid4().hex
    worker_argv = _worker_argv(queue, "-P", "solo")
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


def test_a_pool_child_past_its_memory_bound_is_replaced_after_its_task(tmp_path: Path) -> None:
    # CELERY_WORKER_MAX_MEMORY_PER_CHILD_KIB (issue 23): every child is past 1 KiB, so each
    # task runs in a fresh one; with the bound off, one child runs them all.
    def child_pids(bound_kib: str) -> list[int]:
        queue = f"test-{uuid.uuid4().hex}"
        worker_argv = _worker_argv(queue)
        env = hub_env(CELERY_WORKER_MAX_MEMORY_PER_CHILD_KIB=bound_kib)
        pids = []
        with running(worker_argv, env=env, log=tmp_path / f"worker-{bound_kib}.log") as worker:
            for _ in range(3):
                result = echo.apply_async(("x",), queue=queue)
                try:
                    pids.append(result.get(timeout=90)["worker_pid"])
                finally:
                    result.forget()
        assert worker.pid not in pids  # prefork: tasks run in the pool's children
        return pids

    assert len(set(child_pids("1"))) == 3
    assert len(set(child_pids("0"))) == 1
