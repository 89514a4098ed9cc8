"""Which images a host pulls ahead of any rental: the catalogue's most rented, so that a renter
picking a popular template starts in seconds instead of waiting for a multi-GB pull."""

from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Max
from django.utils import timezone

from hub.catalog.models import Template
from hub.leases.models import Lease
from hub.suppliers.models import Gpu

USAGE_WINDOW = timedelta(days=30)
# The ranking is catalogue-wide (only the VRAM filter depends on the host) and changes slowly,
# while a reconnect storm registers thousands of hosts a minute: one GROUP BY over 30 days of
# leases per registration was the storm's most expensive query.
RANKING_TTL_S = 300.0

_ranking: tuple[float, tuple[tuple[str, int], ...]] | None = None


def clear_ranking() -> None:
    """Forget the cached ranking (tests; an admin change shows within RANKING_TTL_S anyway)."""
    global _ranking
    _ranking = None


def _ranked_images() -> tuple[tuple[str, int], ...]:
    """Listed catalogue images, most rented in the last 30 days first, each with the least VRAM
    a listed template of it needs; cached per process for RANKING_TTL_S."""
    global _ranking
    now = time.monotonic()
    if _ranking is not None and now - _ranking[0] < RANKING_TTL_S:
        return _ranking[1]
    needs: dict[str, int] = {}
    for image, vram in Template.objects.filter(listed=True).values_list("image", "min_vram_bytes"):
        needs[image] = min(vram, needs.get(image, vram))
    usage = (
        Lease.objects.filter(created_at__gte=timezone.now() - USAGE_WINDOW, image__in=list(needs))
        .values("image")
        .annotate(n=Count("pk"), last=Max("created_at"))
        .order_by("-n", "-last")
    )
    ranked = tuple((row["image"], needs[row["image"]]) for row in usage)
    _ranking = (now, ranked)
    return ranked


def images_for(host_id: int) -> tuple[str, ...]:
    """The PREPULL_IMAGES most rented template images of the last 30 days that fit the host's
    largest GPU. Only catalogue images: one renter's private image is nobody else's business,
    and a host's disk is the supplier's."""
    if settings.PREPULL_IMAGES <= 0:
        return ()
    largest = (
        Gpu.objects.filter(host_id=host_id, present=True).aggregate(v=Max("memory_total_bytes"))[
            "v"
        ]
        or 0
    )
    return images_fitting(largest)


def images_fitting(largest_vram_bytes: int) -> tuple[str, ...]:
    """As ``images_for``, given the host's largest GPU: registration knows it from the GPUs the
    agent just reported, so a reconnect storm costs no query here (the ranking is cached)."""
    limit = settings.PREPULL_IMAGES
    if limit <= 0:
        return ()
    return tuple(image for image, vram in _ranked_images() if vram <= largest_vram_bytes)[:limit]
