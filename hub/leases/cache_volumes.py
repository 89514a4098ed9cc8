"""Whose cache volume a lease mounts: the renter's own, per template, per host.

The seed's "the models volume survives redeploys" once meant one volume per template on a host,
mounted into every renter's lease of that template: one renter planted files that the next one
ran, and read another's tokens while both ran. Now the volume belongs to one renter: its name is
a keyed hash of renter and template (the supplier sees neither the renter's id nor who it is),
so the same renter finds their cache again on that host and nobody else ever mounts it.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac

# Agents refuse names of this form: they were shared between renters (supplier_agent/containers).
LEGACY_SHARED_PREFIX = "template-"
PREFIX = "renter-"


def for_renter(renter_id: int, cache_volume: dict[str, str] | None) -> dict[str, str] | None:
    """The renter's own volume for a template's cache (``name`` is the template's key)."""
    if cache_volume is None:
        return None
    # Keyed with SECRET_KEY: rotating it gives every renter a fresh, empty cache.
    digest = salted_hmac(
        "cloudgpu.leases.cache_volume", f"{renter_id}:{cache_volume['name']}", algorithm="sha256"
    ).hexdigest()
    return {"name": PREFIX + digest[:40], "path": cache_volume["path"]}
