"""The local trial's gateway run by a user other than root (issue 17 item 4): sshd and nginx as
that user, agents logging in as it, a mock rental's URL answering through it. The gateway's
folder, host key and secret come from ``hub.lib.demo_gateway.plan``, run as that user, exactly
as ``make run`` does when it is not root.

The test needs root to become another user, and an interpreter with the hub's requirements
that this user can run: this one, or ``CLOUDGPU_TEST_USER_PYTHON`` where this one lies below a
folder only root may enter (a pyenv under /root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from hub.accounts.models import User
from hub.leases.models import Lease
from hub.lib.ports import free_port, wait_for_port
from hub.suppliers.models import Host
from hub.tunnels.models import Tunnel
from tests.support.agents import configure, running_agent
from tests.support.gateway import require_gateway
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for
from tests.support.processes import REPO_ROOT, running
from tests.support.sshd import ensure_tunnel_user

pytestmark = pytest.mark.django_db(transaction=True)

TRIAL_USER = "cloudgpu-trial"  # a user of no importance, standing in for a developer


def _as_user(python: str, *args: str, **env: str) -> list[str]:
    return ["runuser", "-u", TRIAL_USER, "--", "env", f"PYTHONPATH={REPO_ROOT}",
            *(f"{k}={v}" for k, v in env.items()), python, *args]  # fmt: skip


def _user_python() -> str:
    python = os.environ.get("CLOUDGPU_TEST_USER_PYTHON", sys.executable)
    probe = subprocess.run(
        _as_user(python, "-c", "import celery, psutil"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(
            f"{TRIAL_USER} cannot run {python} with the hub's requirements "
            f"({probe.stderr.strip()[-200:]}); set CLOUDGPU_TEST_USER_PYTHON to one it can"
        )
    return python


@pytest.fixture
def trial_folder() -> Iterator[Path]:
    """The user's state folder, below folders only root may write to (sshd's rule)."""
    parent = Path(tempfile.mkdtemp(prefix="cloudgpu-trial-", dir="/run"))
    parent.chmod(0o755)
    state = parent / "state"
    state.mkdir(mode=0o700)
    shutil.chown(state, TRIAL_USER, TRIAL_USER)
    try:
        yield state
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def user_python() -> str:
    require_gateway()
    if shutil.which("runuser") is None:
        pytest.skip("runuser is not installed (util-linux)")
    ensure_tunnel_user(TRIAL_USER)
    return _user_python()


def test_a_gateway_run_by_a_user_serves_a_mock_rentals_url(
    user_python: str, trial_folder: Path, tmp_path: Path
) -> None:
    ssh_port, http_port = free_port(), free_port()
    plan = (
        "import json, sys; from pathlib import Path; from hub.lib import demo_gateway; "
        f"g = demo_gateway.plan(Path({str(trial_folder)!r}), {ssh_port}, {http_port}); "
        "print(json.dumps([g.hub_settings(), g.argv(sys.argv[1])]))"
    )
    planned = subprocess.run(
        _as_user(user_python, "-c", plan, "HUB-URL"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    settings, argv = json.loads(planned.stdout)
    # Not root: agents log in as the user itself, and renters' SSH is off.
    assert settings["TUNNEL_GATEWAY_USER"] == TRIAL_USER
    assert settings["TUNNEL_GATEWAY_RENTER_USER"] == ""
    assert (trial_folder / "gateway" / "ssh_host_ed25519_key").stat().st_uid != 0

    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    secret = {"TUNNEL_GATEWAY_SECRET_FILE": settings["TUNNEL_GATEWAY_SECRET_FILE"]}
    with hub_stack(tmp_path, **settings) as stack:
        argv = [stack.url() if arg == "HUB-URL" else arg for arg in argv]
        with running(_as_user(*argv, **secret), log=tmp_path / "gateway.log") as gateway:
            for port in (ssh_port, http_port):
                assert wait_for_port(port, timeout_s=30), (tmp_path / "gateway.log").read_text()
            token = stack.manage(
                "hub", "token", "create", "--owner", supplier.username, "--default-price", "0"
            )
            state = tmp_path / "agent"
            assert configure(state, stack.url(), token, "--runtime", "mock").returncode == 0
            with running_agent(state, tmp_path / "agent.log"):
                host = wait_for(
                    lambda: Host.objects.filter(owner=supplier, status="online").first(),
                    timeout_s=60,
                    what="host online",
                )
                lease_id = stack.manage(
                    "hub", "lease", "start", "--renter", renter.username, "--host", str(host.pk),
                    "--image", "busybox", "--port", "8080",
                ).splitlines()[0]  # fmt: skip
                lease = wait_for(
                    lambda: Lease.objects.filter(pk=lease_id, state="running").first(),
                    timeout_s=60,
                    what="the lease running",
                )
                tunnel = Tunnel.objects.get(lease=lease)
                assert tunnel.state == "up", tunnel.detail
                page = httpx.get(
                    f"http://127.0.0.1:{http_port}/",
                    headers={"Host": f"{tunnel.public_id}-i.localhost:{http_port}"},
                    timeout=30,
                )
                assert page.status_code == 200, page.text
                assert str(lease.pk) in page.text  # the mock runtime's page, through the tunnel

                # Every server of the gateway runs as the user, none as root.
                servers = [
                    p
                    for p in psutil.Process(gateway.pid).children(recursive=True)
                    if p.name() in {"nginx", "sshd"}
                ]
                assert {p.name() for p in servers} == {"nginx", "sshd"}
                assert {p.username() for p in servers} == {TRIAL_USER}
