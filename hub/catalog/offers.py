"""Offers: every listed GPU that can be rented right now, with what a renter compares on."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from django.db.models import Count, Exists, F, Field, Func, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.lookups import GreaterThan, LessThan

from hub.catalog.uptime import UPTIME_WINDOW, uptime
from hub.leases.models import LeaseGpu
from hub.lib.versions import version_number
from hub.suppliers.models import Gpu, Host

__all__ = [
    "UPTIME_WINDOW",
    "CursorError",
    "HostFilters",
    "Offer",
    "cursor_after",
    "list_offers",
    "market_summary",
    "uptime",
]

SORTS = {
    "price": ("price_per_hour_micros", "pk"),
    "-price": ("-price_per_hour_micros", "-pk"),
    "vram": ("-memory_total_bytes", "price_per_hour_micros", "pk"),
    "model": ("name", "price_per_hour_micros", "pk"),
}
# Sorts whose keys all run one way: a page can start after a row by comparing rows, (key, id)
# > (last key, last id), which reads the index from there instead of skipping an offset.
KEYSET = {
    "price": (("price_per_hour_micros", int), ("id", int)),
    "-price": (("price_per_hour_micros", int), ("id", int)),
    "model": (("name", str), ("price_per_hour_micros", int), ("id", int)),
}


class CursorError(ValueError):
    """``after`` is not a cursor of this sort (the words are the API's)."""


def cursor_after(offer: Offer, sort: str) -> str | None:
    """The ``after`` that starts the page following ``offer`` (None: this sort has none)."""
    if sort not in KEYSET:
        return None
    values: dict[str, object] = {
        "price_per_hour_micros": offer.price_per_hour_micros,
        "id": offer.gpu_id,
        "name": offer.model,
    }
    row = [values[name] for name, _ in KEYSET[sort]]
    return base64.urlsafe_b64encode(json.dumps(row).encode()).decode().rstrip("=")


def _after(gpus: QuerySet[Gpu], sort: str, cursor: str) -> QuerySet[Gpu]:
    keys = KEYSET.get(sort)
    if keys is None:
        raise CursorError(f"sort {sort!r} pages by offset, not by cursor")
    try:
        row = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError):
        raise CursorError("not a cursor from a Link header") from None
    if (
        not isinstance(row, list)
        or len(row) != len(keys)
        or any(type(v) is not kind for v, (_, kind) in zip(row, keys, strict=False))
    ):
        raise CursorError("not a cursor of this sort")
    # A row value has no one Django type: any field will do, nothing is converted.
    columns = Func(*(F(name) for name, _ in keys), function="ROW", output_field=Field())
    values = Func(*(Value(v) for v in row), function="ROW", output_field=Field())
    compare = LessThan if sort.startswith("-") else GreaterThan
    return gpus.filter(compare(columns, values))


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
    uptime_7d: float  # 0..1: the host's share of the last 7 days online (hub/catalog/uptime.py)
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
    # Rented together on this host (the num_gpus filter): the total is this many at this price.
    num_gpus: int = 1

    @property
    def total_price_per_hour_micros(self) -> int:
        return self.price_per_hour_micros * self.num_gpus

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
    num_gpus: int = 1,
) -> QuerySet[Gpu]:
    """Every filter in SQL, so a page of a large market reads only that page (the cheapest
    first through the gpu_offer_by_price index); evaluated by the caller, sliced."""
    # What makes a GPU itself an offer; its host's side is below.
    rentable = Q(listed=True, priced=True, present=True)
    if model:
        rentable &= Q(name__icontains=model)
    if min_vram_bytes:
        rentable &= Q(memory_total_bytes__gte=min_vram_bytes)
    if max_price_micros is not None:
        rentable &= Q(price_per_hour_micros__lte=max_price_micros)
    free = ~Exists(LeaseGpu.objects.filter(gpu=OuterRef("pk"), active=True))
    gpus = Gpu.objects.select_related("host").filter(
        rentable,
        free,
        host__status=Host.Status.ONLINE,
        host__maintenance=False,
        host__release_stuck_since__isnull=True,
    )
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
    if wanted.min_cuda:
        # As numbers ("12.10" is newer than "12.9"): Host.cuda_key, set at registration.
        gpus = gpus.filter(host__cuda_key__gte=max(1, version_number(wanted.min_cuda)))
    if wanted.min_uptime:
        gpus = gpus.filter(host__uptime_7d__gte=wanted.min_uptime)
    if num_gpus > 1:
        # GPUs free together on one host: as many of the host's GPUs pass the GPU's own
        # filters (the host's are the same for all of them). Counted per candidate row as the
        # price-ordered scan meets it, through the (host, index) index: a page costs its own
        # rows' hosts, not a count over the whole market.
        siblings = (
            Gpu.objects.filter(rentable, free, host_id=OuterRef("host_id"))
            .order_by()
            .values("host_id")
            .annotate(n=Count("pk"))
            .values("n")
        )
        gpus = gpus.annotate(free_on_host=Subquery(siblings)).filter(free_on_host__gte=num_gpus)
    return gpus.order_by(*SORTS.get(sort, SORTS["price"]))


def list_offers(
    *,
    model: str = "",
    min_vram_bytes: int = 0,
    max_price_micros: int | None = None,
    sort: str = "price",
    host: HostFilters | None = None,
    num_gpus: int = 1,
    limit: int | None = None,
    offset: int = 0,
    after: str = "",
) -> list[Offer]:
    """The offers in order, ``limit`` of them from ``offset`` or after the row ``after``
    names (``cursor_after``); all without a limit: only for small markets and tests, pages
    and the API always pass one. Raises CursorError for a cursor that is not one."""
    gpus = available_gpus(
        model=model,
        min_vram_bytes=min_vram_bytes,
        max_price_micros=max_price_micros,
        sort=sort,
        host=host,
        num_gpus=num_gpus,
    )
    if after:
        gpus = _after(gpus, sort, after)
    page = gpus[offset : offset + limit] if limit is not None else gpus[offset:]
    return [_offer(g, num_gpus) for g in page]


def market_summary() -> tuple[int, Offer | None]:
    """How many GPUs are on offer, and the cheapest: two indexed queries, not the market."""
    gpus = available_gpus()
    cheapest = gpus.first()
    return gpus.count(), None if cheapest is None else _offer(cheapest, 1)


def _offer(g: Gpu, num_gpus: int) -> Offer:
    return Offer(
        gpu_id=g.pk,
        host_id=g.host_id,
        hostname=g.host.hostname,
        gpu_index=g.index,
        model=g.name,
        vram_bytes=g.memory_total_bytes,
        price_per_hour_micros=g.price_per_hour_micros,
        utilization_pct=g.utilization_pct,
        uptime_7d=round(g.host.uptime_7d, 4),
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
        num_gpus=num_gpus,
    )
