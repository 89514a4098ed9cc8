from __future__ import annotations

import os

from celery import shared_task


@shared_task(name="health.echo", ignore_result=False)  # its caller reads the result
def echo(payload: str) -> dict[str, object]:
    """Round-trip probe: proves a worker took a task off the broker and stored its result."""
    return {"payload": payload, "worker_pid": os.getpid()}
