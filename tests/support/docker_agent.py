"""A real agent with the Docker runtime and fake GPUs, joined to a live hub (hub_stack)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hub.accounts.models import User
from hub.suppliers.models import Host
from tests.support.agents import agent_env, configure, running_agent
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.polling import wait_for


@contextmanager
def docker_agent_online(
    stack: Any, tmp_path: Path, supplier: User, *, gpu_count: int = 1
) -> Iterator[Host]:
    """Configure and run the agent for ``supplier`` (its GPUs listed at $0, no real device
    passed to containers) and yield its host once online; the agent stops on exit."""
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=gpu_count)
    env = agent_env(**fake_nvml_env(table.path))
    locks = tmp_path / "locks"
    locks.mkdir()
    token = stack.manage(
        "hub", "token", "create", "--owner", supplier.username, "--default-price", "0"
    )
    state = tmp_path / "agent"
    # --allow-local-images: no registry here, the test images are built on this machine.
    configured = configure(
        state, stack.url(), token, "--gpu-devices", "none", "--lock-dir", str(locks),
        "--allow-local-images", env=env,
    )  # fmt: skip
    assert configured.returncode == 0, configured.stderr
    with running_agent(state, tmp_path / "agent.log", env=env):
        yield wait_for(
            lambda: Host.objects.filter(owner=supplier, status="online").first(),
            timeout_s=60,
            what="host online",
        )
