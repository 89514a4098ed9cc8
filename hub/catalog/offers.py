"""Offers: every listed GPU that can be rented right now, with what a renter compares on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone

from hub.leases.models import LeaseGpu
from hub.lib.versions import is_older
from hub.suppliers.models import Gpu, Host, HostTransition

UPTIME_WINDOW = timedelta(days=7)
SORTS = {
    "price": ("price_per_hour_micros", "pk"),
    "-price": ("-price_per_hour_micros", "pk"),
    "vram": ("-memory_total_bytes", "price_per_hour_micros", "pk"),
    "model": ("name", "price_per_hour_micros", "pk"),
}


@dataclass(frozen=True)
class Offer:
    gpu_id: int
    host_id: int
    hostname: str
    gpu_index: int
    model: str
    vram_bytes: int
    price_per_hour_micros: int
    utilization_pct: int
    uptime_7d: float  # 0..1: the host's share of the last 7 days online
    # What renters choose a host by: the supplier's name and short id, where it is, and what
    # its agent reports (empty or None: an older agent that does not measure it).
    host_name: str = ""
    host_short_id: str = ""
    location: str = ""
    cpu_model: str = ""
    cpu_count: int = 0
    ram_bytes: int = 0
    disk_free_bytes: int | None = None
    driver_version: str = ""
    cuda_version: str = ""
    rtt_ms: int | None = None
    # What a rental of this GPU may write on the host (the supplier's term), apart from how
    # much the host has free now (disk_free_bytes, shared by all its rentals).
    disk_allowance_bytes: int = 0

    @property
    def host_label(self) -> str:
        return f"{self.host_name} · {self.host_short_id}"


@dataclass(frozen=True)
class HostFilters:
    """Offers' filters on the host: each left at its default filters nothing."""

    location: str = ""
    min_cpus: int = 0
    min_ram_bytes: int = 0
    min_disk_bytes: int = 0
    min_cuda: str = ""
    max_rtt_ms: int | None = None
    min_uptime: float = 0.0  # 0..1 of the last 7 days online


def available_gpus(
    *,
    model: str = "",
    min_vram_bytes: int = 0,
    max_price_micros: int | None = None,
    sort: str = "price",
    host: HostFilters | None = None,
) -> list[Gpu]:
    leased = LeaseGpu.objects.filter(gpu=OuterRef("pk"), active=True)
    gpus = (
        Gpu.objects.select_related("host")
        .filter(
            listed=True,
            priced=True,
            present=True,
            host__status=Host.Status.ONLINE,
            host__maintenance=False,
            host__release_stuck_since__isnull=True,
        )
        .exclude(Exists(leased))
    )
    if model:
        gpus = gpus.filter(name__icontains=model)
    if min_vram_bytes:
        gpus = gpus.filter(memory_total_bytes__gte=min_vram_bytes)
    if max_price_micros is not None:
        gpus = gpus.filter(price_per_hour_micros__lte=max_price_micros)
    wanted = host or HostFilters()
    if wanted.location:
        gpus = gpus.filter(host__location__icontains=wanted.location)
    if wanted.min_cpus:
        gpus = gpus.filter(host__cpu_count__gte=wanted.min_cpus)
    if wanted.min_ram_bytes:
        gpus = gpus.filter(host__ram_bytes__gte=wanted.min_ram_bytes)
    if wanted.min_disk_bytes:
        gpus = gpus.filter(host__disk_free_bytes__gte=wanted.min_disk_bytes)
    if wanted.max_rtt_ms is not None:
        gpus = gpus.filter(host__rtt_ms__lte=wanted.max_rtt_ms)
    found = list(gpus.order_by(*SORTS.get(sort, SORTS["price"])))
    if wanted.min_cuda:
        # Versions compare as numbers ("12.10" is newer than "12.9"): in Python, not SQL.
        found = [
            g
            for g in found
            if g.host.cuda_version and not is_older(g.host.cuda_version, wanted.min_cuda)
        ]
    return found


def uptime(host_ids: list[int], now: datetime | None = None) -> dict[int, float]:
    """Each host's fraction of the window spent online, from its transition history."""
    now = now or timezone.now()
    start = now - UPTIME_WINDOW
    before = HostTransition.objects.filter(host=OuterRef("pk"), at__lt=start).order_by("-at")
    hosts = {
        h.pk: h
        for h in Host.objects.filter(pk__in=host_ids).annotate(
            status_before=Subquery(before.values("to_status")[:1])
        )
    }
    result: dict[int, float] = {}
    history: dict[int, list[tuple[str, datetime]]] = {}
    rows = (
        HostTransition.objects.filter(host_id__in=host_ids, at__gte=start)
        .order_by("host_id", "at")
        .values_list("host_id", "to_status", "at")
    )
    for host_id, status, at in rows:
        history.setdefault(host_id, []).append((status, at))
    for host_id, host in hosts.items():
        # Before its first transition the host did not exist for us: not counted as downtime.
        begin = max(start, host.created_at)
        if host.status_before is None and history.get(host_id):
            begin = max(begin, history[host_id][0][1])
        if begin >= now:
            result[host_id] = 1.0 if host.status == Host.Status.ONLINE else 0.0
            continue
        status, online = host.status_before or Host.Status.OFFLINE, 0.0
        cursor = begin
        for to_status, at in history.get(host_id, []):
            if at <= begin:
                status = to_status
                continue
            if status == Host.Status.ONLINE:
                online += (min(at, now) - cursor).total_seconds()
            cursor, status = at, to_status
        if status == Host.Status.ONLINE:
            online += (now - cursor).total_seconds()
        result[host_id] = max(0.0, min(1.0, online / (now - begin).total_seconds()))
    return result


def list_offers(
    *,
    model: str = "",
    min_vram_bytes: int = 0,
    max_price_micros: int | None = None,
    sort: str = "price",
    now: datetime | None = None,
    host: HostFilters | None = None,
) -> list[Offer]:
    gpus = available_gpus(
        model=model,
        min_vram_bytes=min_vram_bytes,
        max_price_micros=max_price_micros,
        sort=sort,
        host=host,
    )
    uptimes = uptime(sorted({g.host_id for g in gpus}), now)
    if host is not None and host.min_uptime:
        gpus = [g for g in gpus if uptimes.get(g.host_id, 0.0) >= host.min_uptime]
    return [
        Offer(
            gpu_id=g.pk,
            host_id=g.host_id,
            hostname=g.host.hostname,
            gpu_index=g.index,
            model=g.name,
            vram_bytes=g.memory_total_bytes,
            price_per_hour_micros=g.price_per_hour_micros,
            utilization_pct=g.utilization_pct,
            uptime_7d=round(uptimes.get(g.host_id, 0.0), 4),
            host_name=g.host.display_name,
            host_short_id=g.host.short_id,
            location=g.host.location,
            cpu_model=g.host.cpu_model,
            cpu_count=g.host.cpu_count,
            ram_bytes=g.host.ram_bytes,
            disk_free_bytes=g.host.disk_free_bytes,
            driver_version=g.host.driver_version,
            cuda_version=g.host.cuda_version,
            rtt_ms=g.host.rtt_ms,
            disk_allowance_bytes=g.disk_allowance_bytes,
        )
        for g in gpus
    ]
