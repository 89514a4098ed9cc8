from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import Client, override_settings

from hub.installer.services import WheelInfo, build_agent_wheel
from hub.lib.ports import free_port
from tests.support.agent_wheels import download_wheelhouse
from tests.support.installed_agent import InstalledAgent, first_install


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (`make test`: --dist loadgroup) the tests that copy the installed agent
    # share one worker, so that its first install (seconds on the 2-core VM) is made once, not
    # once per worker.
    for item in items:
        if "installed_agent" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("installed-agent"))


@pytest.fixture(scope="session")
def agent_wheel(tmp_path_factory: pytest.TempPathFactory) -> WheelInfo:
    """The agent wheel built once for the session, from this repository."""
    return build_agent_wheel(tmp_path_factory.mktemp("agent-dist"))


@pytest.fixture
def install_script(client: Client) -> str:
    response = client.get("/install.sh")
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's dependencies as wheels, once for the session: pip installs offline."""
    return download_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="session")
def installed_agent(
    tmp_path_factory: pytest.TempPathFactory, agent_wheel: WheelInfo, wheelhouse: Path
) -> Iterator[InstalledAgent]:
    """One real first install by install.sh for the whole session; a test takes its own copy
    with ``installed_agent.fresh_copy()`` (tests/support/installed_agent.py)."""
    # The script as the hub serves it, its default hub a port where nothing listens (as the
    # `script` fixture of test_install_faults.py): every run names its hub.
    with override_settings(HUB_PUBLIC_URL=f"http://127.0.0.1:{free_port()}"):
        response = Client().get("/install.sh")
    assert response.status_code == 200
    with first_install(
        tmp_path_factory.mktemp("installed-agent"),
        response.content.decode(),
        agent_wheel,
        wheelhouse,
    ) as installed:
        yield installed
