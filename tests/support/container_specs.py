"""The material of the agent's container tests against the real Docker engine
(tests/agent/test_containers.py, test_container_limits.py; their fixtures are in
tests/agent/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from supplier_agent.protocol import DockerRun
from tests.support import control_plane

# Serves the lease id at / so a test knows it reached this lease's container.
HTTPD = "mkdir -p /www && echo {marker} > /www/index.html && exec httpd -f -p 8080 -h /www"

SpecFactory = Callable[..., DockerRun]


def cache_name(agent_id: str) -> str:
    return f"test-{agent_id[:8]}"


def lease_containers(docker_client: Any, lease_id: str) -> list[Any]:
    return control_plane.containers(docker_client, lease_id)  # type: ignore[return-value]
