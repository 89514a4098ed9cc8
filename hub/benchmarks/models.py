"""Benchmark runs against a rental's URL (issue 21 item 5): asked for on the lease page or the
API, run by the hub's worker with the agent's own bench code (supplier_agent/bench.py)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from hub.leases.models import Lease


class BenchmarkRun(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    ACTIVE = (State.QUEUED, State.RUNNING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="benchmark_runs")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="benchmark_runs"
    )
    # The lease's declared port whose URL is measured; the URL itself is the hub's own
    # (its tunnel), never one a renter typed.
    port = models.PositiveIntegerField()
    model = models.CharField(max_length=200)
    concurrency = models.PositiveIntegerField()
    isl = models.PositiveIntegerField()
    osl = models.PositiveIntegerField()
    requests = models.PositiveIntegerField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    # The bench's summary (supplier_agent.bench.run_bench) once done.
    result = models.JSONField(null=True, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        constraints = [
            # One run at a time per lease: the worker is nobody's load cannon.
            models.UniqueConstraint(
                fields=("lease",),
                condition=models.Q(state__in=("queued", "running")),
                name="benchmarkrun_one_active_per_lease",
            ),
        ]
        indexes = [models.Index(fields=("lease", "-created_at"))]

    def __str__(self) -> str:
        return f"benchmark {self.pk} of lease {self.lease_id} ({self.state})"
