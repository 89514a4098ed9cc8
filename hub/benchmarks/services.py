"""Benchmarks of a rental's URL (issue 21 item 5): who may ask, within what bounds, and what
the worker connects to.

The worker runs ``cloudgpu-agent bench``'s own code (supplier_agent/bench.py, standard library
only) against the lease's tunnel URL, which the hub builds from its own rows: a renter picks
one of the lease's ports, never a URL or a host, so the worker cannot be pointed at anything
else (no SSRF). The bounds (BENCH_MAX_*) and one run at a time per lease (a partial unique
index) keep it from being anyone's load generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from hub.accounts.models import User
from hub.benchmarks.models import BenchmarkRun
from hub.celery import app as celery_app
from hub.leases.models import Lease
from hub.tunnels import access
from hub.tunnels import services as tunnels
from hub.tunnels.models import Tunnel
from supplier_agent.bench import BenchOptions

MODEL_MAX_CHARS = 200
RUN_TASK = "benchmarks.run"
# A queued or running run older than BENCH_MAX_DURATION_S and this is over, whatever its row
# says (the worker was down, busy or restarted).
STALE_AFTER_S = 300


class BenchmarkRefused(Exception):
    """Why a benchmark cannot be run, in words for the renter."""


class NoSuchLease(BenchmarkRefused):
    pass


@dataclass(frozen=True)
class BenchmarkAsk:
    model: str
    concurrency: int = 1
    isl: int = 128
    osl: int = 32
    requests: int = 32
    port: int | None = None  # one of the lease's ports with a URL; None: the first


def limits() -> dict[str, int]:
    return {
        "requests": settings.BENCH_MAX_REQUESTS,
        "concurrency": settings.BENCH_MAX_CONCURRENCY,
        "isl": settings.BENCH_MAX_ISL,
        "osl": settings.BENCH_MAX_OSL,
    }


def check(ask: BenchmarkAsk) -> dict[str, str]:
    """Field -> what is wrong with it; empty when the ask is within bounds."""
    errors: dict[str, str] = {}
    model = ask.model.strip()
    if not model:
        errors["model"] = "name the model the server serves (its --served-model-name)"
    elif len(model) > MODEL_MAX_CHARS or not model.isprintable():
        errors["model"] = f"a model name is at most {MODEL_MAX_CHARS} printable characters"
    for name, most in limits().items():
        value = getattr(ask, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            errors[name] = f"must be a whole number from 1 to {most}"
    return errors


def _target_tunnel(lease: Lease, port: int | None) -> Tunnel:
    open_tunnels = list(
        Tunnel.objects.filter(lease=lease, closed_at__isnull=True).order_by("container_port")
    )
    if not open_tunnels:
        raise BenchmarkRefused("this rental has no URL to benchmark (it declares no port)")
    if port is None:
        return open_tunnels[0]
    for tunnel in open_tunnels:
        if tunnel.container_port == port:
            return tunnel
    listed = ", ".join(str(t.container_port) for t in open_tunnels)
    raise BenchmarkRefused(f"port {port} has no URL on this rental; its ports with URLs: {listed}")


def request_benchmark(user: User, lease_id: Any, ask: BenchmarkAsk) -> BenchmarkRun:
    """Queue a run for the renter's own running lease; BenchmarkRefused says why not."""
    errors = check(ask)
    if errors:
        raise BenchmarkRefused("; ".join(f"{k}: {v}" for k, v in errors.items()))
    fail_stale()
    with transaction.atomic():
        lease = Lease.objects.select_for_update().filter(pk=lease_id, renter=user).first()
        if lease is None:
            raise NoSuchLease("no such lease")
        if lease.state != Lease.State.RUNNING:
            raise BenchmarkRefused(f"the rental is {lease.state}: only a running one is measured")
        tunnel = _target_tunnel(lease, ask.port)
        if BenchmarkRun.objects.filter(lease=lease, state__in=BenchmarkRun.ACTIVE).exists():
            raise BenchmarkRefused("a benchmark of this rental is running; wait for its end")
        if (
            BenchmarkRun.objects.filter(state__in=BenchmarkRun.ACTIVE).count()
            >= settings.BENCH_MAX_RUNNING
        ):
            raise BenchmarkRefused("the hub is running as many benchmarks as it may; try later")
        try:
            with transaction.atomic():
                run = BenchmarkRun.objects.create(
                    lease=lease,
                    requested_by=user,
                    port=tunnel.container_port,
                    model=ask.model.strip(),
                    concurrency=ask.concurrency,
                    isl=ask.isl,
                    osl=ask.osl,
                    requests=ask.requests,
                )
        except IntegrityError:  # a racing ask of the same lease won
            raise BenchmarkRefused(
                "a benchmark of this rental is running; wait for its end"
            ) from None
        kept = BenchmarkRun.objects.filter(lease=lease).values_list("pk", flat=True)[
            : settings.BENCH_RUNS_KEPT
        ]
        BenchmarkRun.objects.filter(lease=lease).exclude(pk__in=list(kept)).delete()
        # By name, through the hub's app (hub/benchmarks/tasks.py builds on this module).
        # Robust: with the broker down the row commits and fail_stale ends it later.
        run_id = str(run.pk)
        # ignore_result: send_task does not know the task's own setting, and would otherwise
        # subscribe this thread to a result nobody reads (a Redis connection per thread).
        transaction.on_commit(
            lambda: celery_app.send_task(RUN_TASK, args=[run_id], ignore_result=True), robust=True
        )
    return run


def fail_stale(now: datetime | None = None) -> int:
    """End runs that cannot still be going: never picked up, or their worker lost. A run
    takes at most BENCH_MAX_DURATION_S (every request's timeout is within it)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.BENCH_MAX_DURATION_S + STALE_AFTER_S)
    return BenchmarkRun.objects.filter(state__in=BenchmarkRun.ACTIVE, created_at__lt=cutoff).update(
        state=BenchmarkRun.State.FAILED,
        error="the hub's worker did not finish it (it was busy, or restarted)",
        finished_at=now,
    )


def bench_options(run: BenchmarkRun) -> BenchOptions:
    """What the worker runs: the lease's own URL, through the edge, within the bounds.

    Raises BenchmarkRefused when the lease stopped running or its URL closed meanwhile."""
    lease = run.lease
    if lease.state != Lease.State.RUNNING:
        raise BenchmarkRefused(f"the rental is {lease.state}: only a running one is measured")
    tunnel = _target_tunnel(lease, run.port)
    headers: tuple[tuple[str, str], ...] = ()
    if lease.access_protected:
        # A token of the lease's own, for the edge; never stored, gone with the lease.
        headers = ((access.HEADER, access.issue(lease.pk)),)
    duration = float(settings.BENCH_MAX_DURATION_S)
    return BenchOptions(
        url=tunnels.public_url(tunnel),
        model=run.model,
        concurrency=run.concurrency,
        isl=run.isl,
        osl=run.osl,
        requests=run.requests,
        timeout_s=duration,
        max_duration_s=duration,
        headers=headers,
        connect_to=settings.TUNNEL_EDGE_CONNECT,
    )
