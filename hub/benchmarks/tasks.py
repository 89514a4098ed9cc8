"""The worker's side of benchmarks: run one, keep its summary on its row."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from hub.benchmarks import services
from hub.benchmarks.models import BenchmarkRun
from supplier_agent.bench import BenchError, run_bench

log = logging.getLogger(__name__)


# Not acks_late: a run cut by a lost worker is not run again behind the renter's back (load
# is not idempotent); its row is failed by the next ask's check instead (see fail_stale).
@shared_task(name=services.RUN_TASK)
def run_benchmark(run_id: str) -> str:
    claimed = BenchmarkRun.objects.filter(pk=run_id, state=BenchmarkRun.State.QUEUED).update(
        state=BenchmarkRun.State.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return "not queued"
    run = BenchmarkRun.objects.select_related("lease").get(pk=run_id)
    try:
        summary = run_bench(services.bench_options(run))
    except (services.BenchmarkRefused, BenchError) as exc:
        _finish(run_id, error=str(exc))
        return "failed"
    except Exception:
        log.exception("benchmark %s failed", run_id)
        _finish(run_id, error="the benchmark could not run (the hub's log has why)")
        return "failed"
    _finish(run_id, result=summary)
    return "done"


def _finish(run_id: str, *, result: dict[str, object] | None = None, error: str = "") -> None:
    BenchmarkRun.objects.filter(pk=run_id, state=BenchmarkRun.State.RUNNING).update(
        state=BenchmarkRun.State.FAILED if error else BenchmarkRun.State.DONE,
        result=result,
        error=error[:1000],
        finished_at=timezone.now(),
    )
