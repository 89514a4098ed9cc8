from __future__ import annotations

import pytest
from django.test import Client

from hub.installer.services import WheelInfo, build_agent_wheel


@pytest.fixture(scope="session")
def agent_wheel(tmp_path_factory: pytest.TempPathFactory) -> WheelInfo:
    """The agent wheel built once for the session, from this repository."""
    return build_agent_wheel(tmp_path_factory.mktemp("agent-dist"))


@pytest.fixture
def install_script(client: Client) -> str:
    response = client.get("/install.sh")
    assert response.status_code == 200
    return response.content.decode()
