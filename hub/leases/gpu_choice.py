"""Which GPUs a selection means (hub/lib/gpu_select.py's grammar), on a host or across the
market, and starting a lease on them. ``start_lease`` re-checks every GPU under its locks, so
a choice made here that a racing renter takes first is refused there and made again."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from hub.accounts.models import User
from hub.leases import services
from hub.leases.models import Lease
from hub.lib.gpu_select import GpuSelection
from hub.suppliers.models import Gpu, Host

# A count's choice may lose a race to another renter; after this many it says so.
ATTEMPTS = 3


@dataclass(frozen=True)
class Choice:
    host: Host
    indices: list[int]


def _free(queryset: QuerySet[Gpu], model: str | None) -> QuerySet[Gpu]:
    free = queryset.filter(listed=True, priced=True, present=True).exclude(lease_gpus__active=True)
    return free.filter(name__icontains=model) if model else free


def choose(selection: GpuSelection, host: Host | None, model: str | None = None) -> Choice:
    """The host and GPU indices a selection names; a ``LeaseError`` says why there are none."""
    if host is None:
        if selection.kind != "count":
            raise services.LeaseError(
                "without a host, choose a count (count=N, optionally of a model): indices, "
                "UUIDs and all name one host's GPUs"
            )
        return _across_market(selection.count, model)
    gpus = Gpu.objects.filter(host=host)
    if selection.kind == "all":
        indices = list(gpus.filter(present=True).values_list("index", flat=True))
        if not indices:
            raise services.LeaseError("this host has no GPUs")
    elif selection.kind == "count":
        free = list(
            _free(gpus, model)
            .order_by("price_per_hour_micros", "index")
            .values_list("index", flat=True)[: selection.count]
        )
        if len(free) < selection.count:
            of = f" {model}" if model else ""
            raise services.LeaseError(
                f"this host has {len(free)} free{of} GPU(s), not {selection.count}"
            )
        indices = free
    elif selection.kind == "uuids":
        by_uuid = dict(gpus.filter(uuid__in=selection.uuids).values_list("uuid", "index"))
        missing = [u for u in selection.uuids if u not in by_uuid]
        if missing:
            raise services.LeaseError(f"this host has no GPU {missing[0]}")
        indices = [by_uuid[u] for u in selection.uuids]
    else:
        indices = list(selection.indices)
    return Choice(host, sorted(indices))


def _across_market(count: int, model: str | None) -> Choice:
    """The cheapest online host with ``count`` free GPUs (of ``model``), and its cheapest."""
    best: tuple[int, int, list[int]] | None = None  # (price, host id, indices)
    hosts = Host.objects.filter(
        status=Host.Status.ONLINE, maintenance=False, release_stuck_since__isnull=True
    )
    free = _free(Gpu.objects.filter(host__in=hosts), model).order_by(
        "host_id", "price_per_hour_micros", "index"
    )
    by_host: dict[int, list[tuple[int, int]]] = {}
    for host_id, index, price in free.values_list("host_id", "index", "price_per_hour_micros"):
        by_host.setdefault(host_id, []).append((price, index))
    for host_id, offered in by_host.items():
        if len(offered) < count:
            continue
        cheapest = offered[:count]
        price = sum(p for p, _ in cheapest)
        if best is None or (price, host_id) < best[:2]:
            best = (price, host_id, [i for _, i in cheapest])
    if best is None:
        of = f" {model}" if model else ""
        raise services.LeaseError(f"no online host has {count} free{of} GPU(s) right now")
    return Choice(Host.objects.get(pk=best[1]), sorted(best[2]))


def start_lease_on(
    renter: User,
    selection: GpuSelection,
    spec: services.LeaseSpec,
    *,
    host: Host | None = None,
    model: str | None = None,
    max_price_per_hour_micros: int | None = None,
) -> Lease:
    """``start_lease`` for a selection; a count chosen again if a racing renter took a GPU."""
    attempts = ATTEMPTS if selection.kind == "count" else 1
    for attempt in range(1, attempts + 1):
        choice = choose(selection, host, model)
        try:
            return services.start_lease(
                renter,
                choice.host,
                choice.indices,
                spec,
                max_price_per_hour_micros=max_price_per_hour_micros,
            )
        except services.LeaseError as exc:
            if attempt == attempts or "just rented" not in str(exc):
                raise
    raise AssertionError("unreachable")  # the loop returns or raises
