"""A GPU's one true state, as its supplier (and admins) see it.

A GPU is many flags (listed, priced, present), its host more (online, maintenance, release
stuck) and a lease may hold it; a person wants one word. The precedence below is the rule, in
one place: what stops a renter first wins, and a rented GPU says so even while its host is in
maintenance (running rentals go on there).
"""

from __future__ import annotations

from dataclasses import dataclass

from hub.leases.models import LeaseGpu
from hub.suppliers.models import Gpu, Host

RENTED = "rented"
LISTED_IDLE = "listed"
UNLISTED = "unlisted"
MAINTENANCE = "maintenance"
OFFLINE = "offline"
DELISTED_HEALTH = "delisted"


@dataclass(frozen=True)
class GpuStatus:
    state: str  # one of the constants above
    label: str  # what the page says
    detail: str = ""  # why, when the label alone does not say


def _health_delisted(gpu: Gpu) -> str:
    """Why the hub delisted this GPU for its health, or "" (issue 19 adds health delisting:
    where its field lands, this is the one place that reads it)."""
    reason = getattr(gpu, "health_delisted_reason", "") or ""
    if getattr(gpu, "health_delisted_at", None) is not None:
        return str(reason) or "the hub delisted it after hardware errors"
    return ""


def gpu_status(gpu: Gpu, host: Host, *, rented: bool) -> GpuStatus:
    if host.status != Host.Status.ONLINE:
        return GpuStatus(OFFLINE, "offline", "rented, host away" if rented else "host offline")
    if not gpu.present:
        return GpuStatus(OFFLINE, "offline", "missing: the agent no longer reports it")
    if rented:
        return GpuStatus(RENTED, "rented")
    health = _health_delisted(gpu)
    if health:
        return GpuStatus(DELISTED_HEALTH, "delisted for health", health)
    if host.maintenance:
        return GpuStatus(MAINTENANCE, "maintenance", "no new rentals")
    if host.release_stuck_since is not None:
        return GpuStatus(MAINTENANCE, "maintenance", "release stuck: no new rentals")
    if not gpu.priced:
        return GpuStatus(UNLISTED, "unlisted", "needs a price")
    if not gpu.listed:
        return GpuStatus(UNLISTED, "unlisted")
    return GpuStatus(LISTED_IDLE, "listed, idle")


def rented_gpu_ids(gpu_ids: list[int]) -> set[int]:
    return set(
        LeaseGpu.objects.filter(gpu_id__in=gpu_ids, active=True).values_list("gpu_id", flat=True)
    )


def gpu_statuses(hosts: list[Host]) -> dict[int, GpuStatus]:
    """Each GPU's status for these hosts (GPUs prefetched), with one query for the leases."""
    gpus = [(gpu, host) for host in hosts for gpu in host.gpus.all()]
    rented = rented_gpu_ids([gpu.pk for gpu, _ in gpus])
    return {gpu.pk: gpu_status(gpu, host, rented=gpu.pk in rented) for gpu, host in gpus}
