"""The lease page's benchmark panel (issue 21 item 5): ask the hub's worker to run
``cloudgpu-agent bench`` against the rental's own URL, and see the figures."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from hub.benchmarks import services as benchmarks
from hub.benchmarks.models import BenchmarkRun
from hub.leases.models import Lease
from hub.web.forms import BenchmarkForm


def _own_lease(request: HttpRequest, lease_id: Any) -> Lease:
    return get_object_or_404(Lease, pk=lease_id, renter=request.user)


def panel_context(lease: Lease, form: BenchmarkForm | None = None) -> dict[str, Any]:
    runs = list(BenchmarkRun.objects.filter(lease=lease)[: settings.BENCH_RUNS_KEPT])
    ports = sorted(
        lease.tunnels.filter(closed_at__isnull=True).values_list("container_port", flat=True)
    )
    return {
        "lease": lease,
        "bench_form": form or BenchmarkForm(ports=ports),
        "bench_runs": runs,
        "bench_active": any(run.state in BenchmarkRun.ACTIVE for run in runs),
        "bench_possible": lease.state == Lease.State.RUNNING and bool(ports),
        "bench_limits": benchmarks.limits() | {"duration_s": settings.BENCH_MAX_DURATION_S},
    }


@login_required
@require_GET
def benchmark_panel(request: HttpRequest, lease_id: Any) -> HttpResponse:
    lease = _own_lease(request, lease_id)
    return render(request, "web/partials/lease_benchmarks.html", panel_context(lease))


@login_required
@require_POST
def benchmark_start(request: HttpRequest, lease_id: Any) -> HttpResponse:
    lease = _own_lease(request, lease_id)
    ports = sorted(
        lease.tunnels.filter(closed_at__isnull=True).values_list("container_port", flat=True)
    )
    form = BenchmarkForm(request.POST, ports=ports)
    if lease.state != Lease.State.RUNNING or not ports:
        form.add_error(None, "only a running rental with a URL can be benchmarked")
    elif form.is_valid():
        try:
            benchmarks.request_benchmark(request.user, lease.pk, form.ask())  # type: ignore[arg-type]
        except benchmarks.BenchmarkRefused as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, "Benchmark queued: the hub's worker runs it now.")
            return redirect("web:lease", lease_id=lease.pk)
    # Back to the lease page, which shows why (the form's errors, in words).
    for field, errors in form.errors.items():
        for error in errors:
            where = "" if field == "__all__" else f"{form.fields[field].label or field}: "
            messages.error(request, f"Benchmark not started: {where}{error}")
    return redirect("web:lease", lease_id=lease.pk)
