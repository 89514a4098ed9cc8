"""Which images a host pulls ahead of any rental: the catalogue's most rented, so that a renter
picking a popular template starts in seconds instead of waiting for a multi-GB pull."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Max
from django.utils import timezone

from hub.catalog.models import Template
from hub.leases.models import Lease
from hub.suppliers.models import Gpu

USAGE_WINDOW = timedelta(days=30)


def images_for(host_id: int) -> tuple[str, ...]:
    """The PREPULL_IMAGES most rented template images of the last 30 days that fit the host's
    largest GPU. Only catalogue images: one renter's private image is nobody else's business,
    and a host's disk is the supplier's."""
    limit = settings.PREPULL_IMAGES
    if limit <= 0:
        return ()
    largest = (
        Gpu.objects.filter(host_id=host_id, present=True).aggregate(v=Max("memory_total_bytes"))[
            "v"
        ]
        or 0
    )
    fitting = set(
        Template.objects.filter(listed=True, min_vram_bytes__lte=largest).values_list(
            "image", flat=True
        )
    )
    if not fitting:
        return ()
    usage = (
        Lease.objects.filter(created_at__gte=timezone.now() - USAGE_WINDOW, image__in=fitting)
        .values("image")
        .annotate(n=Count("pk"), last=Max("created_at"))
        .order_by("-n", "-last")[:limit]
    )
    return tuple(row["image"] for row in usage)
