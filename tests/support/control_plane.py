"""Steps the control-plane end-to-end tests share (tests/e2e/test_control_plane*.py): a token,
an agent configured against a hub stack, a lease started through the `hub` CLI, polls."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hub.accounts.models import User
from hub.leases.models import Lease
from hub.suppliers.models import Host
from tests.support.agents import AGENT, agent_env, configure
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.hub_stack import HubStack


def agent_token(stack: HubStack, supplier: User) -> str:
    return stack.manage(
        "hub", "token", "create", "--owner", supplier.username, "--default-price", "0"
    )


def online_host(supplier: User) -> Host | None:
    return Host.objects.filter(owner=supplier, status=Host.Status.ONLINE).first()


def lease_state(lease_id: str, *states: str) -> Lease | None:
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.state in states else None


def start_lease(stack: HubStack, renter: User, host: Host, *args: str) -> str:
    return stack.manage(
        "hub", "lease", "start", "--renter", renter.username, "--host", str(host.pk), *args
    ).splitlines()[0]


def smoke(state: Path) -> int:
    return subprocess.run(
        [AGENT, "smoke", "--state", str(state)], env=agent_env(), timeout=60, check=False
    ).returncode


def docker_agent(stack: HubStack, token: str, table: FakeGpuTable, tmp_path: Path) -> Path:
    state = tmp_path / "agent"
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    env = agent_env(**fake_nvml_env(table.path))
    # --allow-local-images: no registry here, the test images are built on this machine.
    result = configure(
        state, stack.url(), token, "--gpu-devices", "none", "--lock-dir", str(locks),
        "--allow-local-images", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return state


def containers(docker_client: object, lease_id: object) -> list[object]:
    """The lease's containers. The SDK lists, then inspects each; dockerd lists a container it
    is still creating or removing and answers its inspect 404: skipped (``ignore_removed``),
    as the agent's own listing skips it, instead of failing a poll (CI saw both)."""
    return docker_client.containers.list(  # type: ignore[attr-defined]
        all=True, filters={"label": f"cloudgpu.lease={lease_id}"}, ignore_removed=True
    )
