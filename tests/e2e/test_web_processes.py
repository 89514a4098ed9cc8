"""Several web processes (`python -m hub.runner serve --web 2`), run for real: two Daphnes behind
nginx, a Celery worker and beat, on the test database and Redis, with real mock agents.

Agents that connect through the one address are spread over the processes; a command reaches
an agent whichever process holds its socket (the worker sends it through the channel layer);
a restart of one web process moves only the agents it held."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import pytest

from hub.accounts.models import User
from hub.lib.ports import free_port
from hub.suppliers.models import Host, HostTransition
from tests.support import hub_stack
from tests.support.agents import configure, running_agent
from tests.support.control_plane import agent_token, lease_state, start_lease
from tests.support.hub_stack import HubStack
from tests.support.polling import wait_for
from tests.support.processes import hub_env
from tests.support.runner_process import serving

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("nginx") is None, reason="--web N needs nginx (nginx-light)"),
]


def _daphne_on(runner: subprocess.Popen[str], port: int) -> psutil.Process:
    for child in psutil.Process(runner.pid).children(recursive=True):
        try:
            if "hub.serve" in " ".join(child.cmdline()) and any(
                c.laddr.port == port and c.status == psutil.CONN_LISTEN
                for c in child.net_connections(kind="tcp")
            ):
                return child
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no Daphne listens on {port}")


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _process_of(channel_name: str) -> str:
    # channels_redis names a socket's channel "specific.<process prefix>!<socket>".
    return channel_name.partition(".")[2].partition("!")[0]


def _hosts_on_two_processes(supplier: User) -> list[Host] | None:
    hosts = list(Host.objects.filter(owner=supplier, status="online").exclude(channel_name=""))
    if len(hosts) != 2 or len({_process_of(h.channel_name) for h in hosts}) != 2:
        return None
    return sorted(hosts, key=lambda h: h.pk)


@pytest.mark.slow
def test_two_web_processes_share_the_agents_and_a_restart_moves_only_its_own(
    tmp_path: Path,
) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    port = free_port()
    with serving(tmp_path / "state", port, "--web", "2") as runner, ExitStack() as agents:
        # /healthz through nginx answers once one process does; the spread below needs both.
        for upstream in (port + 1, port + 2):
            wait_for(
                lambda u=upstream: _answers(u), timeout_s=120, what=f"the process on {upstream}"
            )
        stack = HubStack(web_ports=[port], env=hub_env(DATABASE_URL=hub_stack.test_database_url()))
        token = agent_token(stack, supplier)
        for n in range(2):
            state = tmp_path / f"agent-{n}"
            hub_url = f"http://127.0.0.1:{port}"  # nginx: one address for both processes
            assert configure(state, hub_url, token, "--runtime", "mock").returncode == 0
            agents.enter_context(running_agent(state, tmp_path / f"agent-{n}.log"))
            # One at a time: nginx's least_conn then gives the second to the other process.
            wait_for(
                lambda n=n: Host.objects.filter(owner=supplier, status="online").count() == n + 1,
                timeout_s=60,
                what=f"agent {n} online",
            )
        hosts = wait_for(
            lambda: _hosts_on_two_processes(supplier), timeout_s=30, what="one agent per process"
        )

        # The worker sends each lease's commands to whichever process holds the host's socket.
        leases = [start_lease(stack, renter, host, "--image", "busybox") for host in hosts]
        for lease_id in leases:
            wait_for(lambda i=lease_id: lease_state(i, "running"), timeout_s=60, what="running")

        # Restart one web process (killed: the runner starts it again). Exactly the host whose
        # socket it held comes back on a new socket; the other's socket stays where it is.
        before = {h.pk: h.channel_name for h in hosts}
        _daphne_on(runner, port + 1).kill()

        def one_moved() -> list[int] | None:
            now = {h.pk: h for h in Host.objects.filter(pk__in=before)}
            back = [pk for pk, h in now.items() if h.status == "online" and h.channel_name]
            moved = [pk for pk in back if now[pk].channel_name != before[pk]]
            return moved if len(back) == 2 and moved else None

        moved = wait_for(one_moved, timeout_s=90, what="the restarted process's agent back")
        assert len(moved) == 1
        (stayed,) = [pk for pk in before if pk not in moved]
        assert Host.objects.get(pk=stayed).channel_name == before[stayed]
        assert not HostTransition.objects.filter(host_id=stayed, to_status="offline").exists()
        for lease_id in leases:
            assert lease_state(lease_id, "running") is not None
