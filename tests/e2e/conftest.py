"""Fixtures of the end-to-end tests that make lease containers through the agent's own
ContainerRuntime (the hostile-tenant suites)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from supplier_agent.containers import LABEL_CLAIM
from tests.support.docker_cleanup import remove_containers


@pytest.fixture
def agent_id(docker_client: Any) -> Iterator[str]:
    """A new agent's id for the containers a test claims; they are removed afterwards."""
    agent = str(uuid.uuid4())
    yield agent
    remove_containers(docker_client, {"label": f"{LABEL_CLAIM}={agent}"})
