"""Which image a rental runs: the repository a reference names, the digest its registry served,
and what a renter reads when the image cannot be had.

The container runtime (containers.py) pulls every rental's image anonymously and creates the
container from the digest its registry answered with, so a later retag cannot swap what runs.
The rules for reading Docker's answers are here, apart from the Docker calls: plain functions of
image references and image metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supplier_agent import image_policy

# What Docker takes for Docker Hub besides no registry at all.
DOCKER_HUB_NAMES = ("docker.io", "index.docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class ObtainedImage:
    """The image a lease's container is created from, pinned: a later retag cannot swap it."""

    ref: str  # what Docker creates the container from
    digest: str  # what the lease records
    local: bool  # taken from the host without a pull (the supplier's opt-in)


def not_found_message(ref: str) -> str:
    """What a renter reads for an image missing from its registry, whether or not a copy of
    it is on this host."""
    return f"image {ref} not found in its registry or access denied"


def pull_refusal(ref: str, detail: str) -> str:
    """What a renter reads for a failed pull of ``ref``, from dockerd's ``detail``: a sentence
    of ours, since dockerd's text (addresses, resolver and proxy details of the supplier's
    network) is for the supplier's log only."""
    lowered = detail.lower()
    denied = ("not found", "manifest unknown", "pull access denied", "unauthorized", "denied")
    if any(marker in lowered for marker in denied):
        return not_found_message(ref)
    unreachable = ("dial tcp", "no such host", "timeout", "connection refused", "tls", "eof")
    if any(marker in lowered for marker in unreachable):
        return f"the registry of image {ref} is unreachable from this host"
    return f"pulling image {ref} failed on this host"


def registry_digest(ref: str, attrs: dict[str, Any]) -> str | None:
    """``<repository>@sha256:...`` of ``ref``'s repository from an image's ``RepoDigests``
    (None: not pulled from that repository's registry)."""
    repository = _repository(ref)
    for entry in attrs.get("RepoDigests") or []:
        name, _, digest = str(entry).partition("@")
        if digest.startswith("sha256:") and _repository(name) == repository:
            return f"{name}@{digest}"
    return None


def _repository(ref: str) -> str:
    """The repository of a reference, as Docker normalises it: no tag or digest, Docker Hub's
    implicit ``docker.io/`` and ``library/`` made explicit."""
    name = ref.partition("@")[0]
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name = name[:colon]
    registry = image_policy.registry_of(name)
    if registry in DOCKER_HUB_NAMES:  # Docker Hub by one of its other names
        name = name.partition("/")[2]
        registry = None
    if registry is None:
        name = "docker.io/" + (name if "/" in name else "library/" + name)
    return name
