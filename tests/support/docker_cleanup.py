"""Removing the tests' containers, whatever state dockerd has them in.

``containers.list`` inspects each container it lists, and dockerd lists a container it is still
creating or removing and then answers that inspect 404: one ``NotFound`` ended a fixture's
clean-up loop and left the rest running (two lease containers outlived a CI run). Here one
listing call, no inspect, and each removal on its own."""

from __future__ import annotations

import contextlib
from typing import Any

from docker.errors import APIError, NotFound

# The label the session's test image carries (tests/conftest.py, busybox_image); Docker copies
# an image's labels onto its containers, so the session's clean-up finds them by it.
TEST_IMAGE_LABEL = "cloudgpu-test-image"


def remove_containers(client: Any, filters: dict[str, str]) -> int:
    """Force-remove every container (and its anonymous volumes) matching ``filters``; the
    number removed. One that is already going, or that dockerd refuses, is skipped."""
    removed = 0
    for row in client.api.containers(all=True, filters=filters):
        with contextlib.suppress(NotFound, APIError):
            client.api.remove_container(row["Id"], force=True, v=True)
            removed += 1
    return removed


def remove_volume(client: Any, name: str) -> None:
    """Remove a Docker volume and every container that mounts it (if they are still there)."""
    remove_containers(client, {"volume": name})
    with contextlib.suppress(NotFound):
        client.volumes.get(name).remove(force=True)
