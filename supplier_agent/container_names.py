"""The names and labels by which the agent knows its Docker objects again.

Each lease's container is labelled with the claiming agent, the lease, its declared ports and
its GPUs, so that a restarted agent rebuilds its view from Docker alone (containers.py); renters'
volumes and caches carry names and labels of their own, by which the container runtime mounts
them and the janitor (volumes.py) measures and removes them. Only strings here, no Docker calls:
the runtime, the janitor and the lease runtime (docker_runtime.py) share them without importing
one another.
"""

from __future__ import annotations

LABEL_CLAIM = "cloudgpu.claim"
LABEL_LEASE = "cloudgpu.lease"
LABEL_PORTS = "cloudgpu.ports"
LABEL_GPUS = "cloudgpu.gpus"
LABEL_CACHE = "cloudgpu.cache"
# A volume a renter made (issue 13): its wire name (vol-<40 hex>), and the cap it was made with.
LABEL_VOLUME = "cloudgpu.volume"
LABEL_VOLUME_CAP = "cloudgpu.volume.size_bytes"
LEGACY_SHARED_CACHE_PREFIX = "template-"
LABEL_NETWORK = "cloudgpu.network"
# What the container was created from (ObtainedImage.digest): the ack reports it again when a
# retried docker_run finds the container made already.
LABEL_IMAGE_DIGEST = "cloudgpu.image.digest"


def cache_volume_name(name: str) -> str:
    """The Docker volume behind a lease's ``cache_volume.name``."""
    return f"cloudgpu-cache-{name}"


def renter_volume_name(name: str) -> str:
    """The Docker volume behind a renter volume's wire name (``vol-<40 hex>``)."""
    return f"cloudgpu-{name}"
