from __future__ import annotations

from celery import shared_task

from hub.rollouts import progress


@shared_task(name="rollouts.advance", ignore_result=True)
def advance() -> None:
    progress.advance()
