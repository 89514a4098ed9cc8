"""Template context every dashboard page gets: the funds warning banner."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from hub.leases.models import Lease


def dashboard(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Billing flags the renter's going leases when the balance covers only a few minutes more.
    warned = Lease.objects.filter(
        renter=user, state__in=Lease.ACTIVE_STATES, funds_warning_at__isnull=False
    ).exists()
    return {"funds_warning": warned}
