"""The fleet at a glance, for staff: what is online, what is rented, what is stuck."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

import supplier_agent
from hub.leases.models import Command, Lease, LeaseGpu
from hub.lib.versions import is_older, version_key
from hub.suppliers.models import Gpu, Host

# "Recently" for failed commands and finished leases.
RECENT = timedelta(hours=24)
TABLE_ROWS = 20


@dataclass(frozen=True)
class AgentVersion:
    version: str  # "" for hosts that never said (none register without it today)
    hosts: int
    online: int
    behind: bool  # older than the agent this hub serves


@dataclass(frozen=True)
class Fleet:
    hosts_online: int
    hosts_offline: int
    hosts_in_maintenance: int
    hosts_release_stuck: int
    gpus_total: int  # present GPUs
    gpus_leased: int
    gpus_free: int  # rentable now: listed, present, host online and not drained, not leased
    gpus_unavailable: int  # present but neither leased nor rentable
    gpus_unhealthy: int  # delisted for a failure their agent reported (hub/leases/gpu_faults.py)
    leases_by_state: dict[str, int]  # active states now; ended/failed within RECENT
    commands_failed_recently: int
    commands_overdue: int
    offline_hosts: list[Host]
    release_stuck_hosts: list[Host]
    unhealthy_gpus: list[Gpu]
    failed_commands: list[Command]
    overdue_commands: list[Command]
    now: datetime
    agent_versions: tuple[AgentVersion, ...] = ()


def fleet_summary(now: datetime | None = None) -> Fleet:
    now = now or timezone.now()
    since = now - RECENT
    hosts = Host.objects.aggregate(
        online=Count("pk", filter=Q(status=Host.Status.ONLINE)),
        offline=Count("pk", filter=Q(status=Host.Status.OFFLINE)),
        maintenance=Count("pk", filter=Q(maintenance=True)),
        release_stuck=Count("pk", filter=Q(release_stuck_since__isnull=False)),
    )
    is_leased = Exists(LeaseGpu.objects.filter(gpu=OuterRef("pk"), active=True))
    gpus = Gpu.objects.filter(present=True).aggregate(
        total=Count("pk"),
        leased=Count("pk", filter=Q(is_leased)),
        free=Count(
            "pk",
            filter=Q(
                ~is_leased,
                listed=True,
                priced=True,
                host__status=Host.Status.ONLINE,
                host__maintenance=False,
                host__release_stuck_since__isnull=True,
            ),
        ),
    )
    by_state = {state: 0 for state in Lease.State.values}
    rows = (
        Lease.objects.filter(
            Q(state__in=Lease.ACTIVE_STATES)
            | Q(state__in=[Lease.State.ENDED, Lease.State.FAILED], ended_at__gte=since)
        )
        .values_list("state")
        .annotate(n=Count("pk"))
    )
    by_state.update(dict(rows))
    failed = Command.objects.filter(state=Command.State.FAILED, created_at__gte=since)
    overdue = Command.objects.filter(
        state__in=[Command.State.QUEUED, Command.State.SENT], deadline__lt=now
    )
    return Fleet(
        hosts_online=hosts["online"],
        hosts_offline=hosts["offline"],
        hosts_in_maintenance=hosts["maintenance"],
        hosts_release_stuck=hosts["release_stuck"],
        gpus_total=gpus["total"],
        gpus_leased=gpus["leased"],
        gpus_free=gpus["free"],
        gpus_unavailable=gpus["total"] - gpus["leased"] - gpus["free"],
        gpus_unhealthy=Gpu.objects.filter(unhealthy_since__isnull=False).count(),
        leases_by_state=by_state,
        commands_failed_recently=failed.count(),
        commands_overdue=overdue.count(),
        offline_hosts=list(
            Host.objects.filter(status=Host.Status.OFFLINE)
            .select_related("owner")
            .order_by("-last_seen_at", "pk")[:TABLE_ROWS]
        ),
        release_stuck_hosts=list(
            Host.objects.filter(release_stuck_since__isnull=False)
            .select_related("owner")
            .order_by("release_stuck_since", "pk")[:TABLE_ROWS]
        ),
        unhealthy_gpus=list(
            Gpu.objects.filter(unhealthy_since__isnull=False)
            .select_related("host", "host__owner")
            .order_by("-unhealthy_since", "pk")[:TABLE_ROWS]
        ),
        failed_commands=list(failed.select_related("host").order_by("-created_at")[:TABLE_ROWS]),
        overdue_commands=list(overdue.select_related("host").order_by("deadline")[:TABLE_ROWS]),
        now=now,
        agent_versions=agent_versions(),
    )


def agent_versions() -> tuple[AgentVersion, ...]:
    """Hosts per agent version, newest first: what a rollout has reached, and who is behind
    the agent this hub serves."""
    rows = Host.objects.values_list("agent_version").annotate(
        hosts=Count("pk"), online=Count("pk", filter=Q(status=Host.Status.ONLINE))
    )
    found = [
        AgentVersion(v, hosts, online, bool(v) and is_older(v, supplier_agent.__version__))
        for v, hosts, online in rows
    ]
    return tuple(sorted(found, key=lambda a: version_key(a.version), reverse=True))
