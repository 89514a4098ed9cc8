"""Fixtures of the agent's container tests against the real Docker engine."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from docker.errors import NotFound

from supplier_agent.protocol import CacheVolume, DockerRun
from tests.support.container_specs import HTTPD, SpecFactory, cache_name
from tests.support.docker_cleanup import remove_containers


@pytest.fixture
def agent_id(docker_client: Any) -> Iterator[str]:
    """A fresh agent identity; whatever it leaves in Docker is removed, even after a failure."""
    agent = str(uuid.uuid4())
    yield agent
    remove_containers(docker_client, {"label": f"cloudgpu.claim={agent}"})
    with contextlib.suppress(NotFound):
        docker_client.volumes.get(f"cloudgpu-cache-{cache_name(agent)}").remove(force=True)


@pytest.fixture
def make_spec(busybox_image: str, agent_id: str) -> SpecFactory:
    def make(**overrides: Any) -> DockerRun:
        lease_id = str(uuid.uuid4())
        fields: dict[str, Any] = {
            "command_id": str(uuid.uuid4()),
            "lease_id": lease_id,
            "epoch": 1,
            "image": busybox_image,
            "ports": (8080,),
            "command": ("sh", "-c", HTTPD.format(marker=lease_id)),
            "cache_volume": CacheVolume(name=cache_name(agent_id), path="/cache"),
        }
        fields.update(overrides)
        return DockerRun(**fields)

    return make
