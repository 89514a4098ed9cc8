"""The fleet's gauges, read from Postgres when Prometheus scrapes (hub/health/metrics_view.py).

Counted at scrape time rather than kept as gauges in each process: Postgres is the truth, a
gauge updated on every transition would drift whenever a process died between the row and the
increment, and a handful of grouped COUNTs every scrape interval cost less than that. Labels
are states and GPU models only, never hosts or leases; models are the TOP_MODELS commonest, the
rest summed as "other", so a supplier inventing GPU names cannot add series.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Exists, OuterRef, Q
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hub.leases.models import Command, Lease, LeaseGpu
from hub.suppliers.models import Gpu, Host

TOP_MODELS = 20
OTHER_MODEL = "other"
GPU_STATES = ("free", "leased", "unhealthy", "unavailable", "absent")


def gpu_counts() -> dict[str, int]:
    """GPUs by state: ``free`` rentable now, ``leased``, ``unhealthy`` (delisted for a fault its
    agent reported), ``unavailable`` (present but neither: unlisted, unpriced, host offline or
    drained), ``absent`` (no longer reported by its host)."""
    is_leased = Exists(LeaseGpu.objects.filter(gpu=OuterRef("pk"), active=True))
    rentable = Q(
        listed=True,
        priced=True,
        unhealthy_since__isnull=True,
        host__status=Host.Status.ONLINE,
        host__maintenance=False,
        host__release_stuck_since__isnull=True,
    )
    counts = Gpu.objects.aggregate(
        absent=Count("pk", filter=Q(present=False)),
        leased=Count("pk", filter=Q(is_leased, present=True)),
        unhealthy=Count("pk", filter=Q(~is_leased, present=True, unhealthy_since__isnull=False)),
        free=Count("pk", filter=Q(~is_leased, rentable, present=True)),
        present=Count("pk", filter=Q(present=True)),
    )
    present = counts.pop("present")
    counts["unavailable"] = present - counts["leased"] - counts["unhealthy"] - counts["free"]
    return counts


def model_counts() -> dict[str, int]:
    """Present GPUs per model name: the TOP_MODELS commonest, the rest under "other"."""
    rows = list(
        Gpu.objects.filter(present=True)
        .values_list("name")
        .annotate(n=Count("pk"))
        .order_by("-n", "name")
    )
    counts = {name: n for name, n in rows[:TOP_MODELS]}
    rest = sum(n for _, n in rows[TOP_MODELS:])
    if rest:
        counts[OTHER_MODEL] = counts.get(OTHER_MODEL, 0) + rest
    return counts


class FleetCollector(Collector):
    """Hosts, GPUs, leases and pending commands as Prometheus gauges, from one scrape's queries."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        hosts = GaugeMetricFamily("cloudgpu_hosts", "Hosts by status.", labels=["status"])
        by_status = dict(Host.objects.values_list("status").annotate(n=Count("pk")))
        for status in Host.Status.values:
            hosts.add_metric([status], by_status.get(status, 0))
        yield hosts

        gpus = GaugeMetricFamily("cloudgpu_gpus", "GPUs by state.", labels=["state"])
        for state, n in gpu_counts().items():
            gpus.add_metric([state], n)
        yield gpus

        models = GaugeMetricFamily(
            "cloudgpu_gpus_by_model",
            f"Present GPUs per model (the {TOP_MODELS} commonest, the rest as 'other').",
            labels=["model"],
        )
        for name, n in model_counts().items():
            models.add_metric([name], n)
        yield models

        leases = GaugeMetricFamily(
            "cloudgpu_leases", "Leases in an active state, by state.", labels=["state"]
        )
        active = dict(
            Lease.objects.filter(state__in=Lease.ACTIVE_STATES)
            .values_list("state")
            .annotate(n=Count("pk"))
        )
        for state in Lease.ACTIVE_STATES:
            leases.add_metric([str(state)], active.get(state, 0))
        yield leases

        flagged = GaugeMetricFamily(
            "cloudgpu_leases_gpu_fault",
            "Active leases flagged because one of their GPUs failed under them.",
        )
        flagged.add_metric(
            [],
            Lease.objects.filter(state__in=Lease.ACTIVE_STATES, gpu_fault_at__isnull=False).count(),
        )
        yield flagged

        commands = GaugeMetricFamily(
            "cloudgpu_commands_pending", "Commands not yet answered, by state.", labels=["state"]
        )
        pending = dict(
            Command.objects.filter(state__in=[Command.State.QUEUED, Command.State.SENT])
            .values_list("state")
            .annotate(n=Count("pk"))
        )
        for state in (Command.State.QUEUED, Command.State.SENT):
            commands.add_metric([str(state)], pending.get(state, 0))
        yield commands
