"""A rental's disk allowance (issue 33 item 1): what it may write on its host in all, its
container's writable layer, cache and volumes together. The supplier sets one per GPU; a lease
gets the sum of its GPUs' when it starts, and the agent stops it past that (disk_guard.py).

Django-free, so that settings.py checks its default against the same bounds as suppliers'
input."""

from __future__ import annotations

GIB = 1 << 30
# Below a GiB no image even unpacks; above 100 TiB no host has the disk to keep the promise.
MIN_BYTES = GIB
MAX_BYTES = 100 * 1024 * GIB
MAX_GIB = MAX_BYTES // GIB
BOUNDS = f"a disk allowance must be between 1 GiB and 100 TiB ({MAX_GIB} GiB)"


def out_of_bounds(num_bytes: int) -> str | None:
    """Why this allowance is refused, in words a supplier understands; None when it fits."""
    return None if MIN_BYTES <= num_bytes <= MAX_BYTES else BOUNDS


def words(num_bytes: int | None) -> str:
    """``53687091200`` -> ``50 GiB``; one decimal when it is not a whole number of GiB."""
    if num_bytes is None:
        return ""
    if num_bytes % GIB == 0:
        return f"{num_bytes // GIB} GiB"
    return f"{num_bytes / GIB:.1f} GiB"
