"""Each hub process holds at most two Redis connections at steady state (issue 18): the
processes `make run` starts (`hub.runner serve`: Daphne, the Celery worker and its pool
children, beat), with real mock agents connected and one rental run from rent to ended through
the REST API.

Counted from Redis' own CLIENT LIST, matched to each process by the client's address in the
operating system's socket table (bench/redis_clients.py, which the benchmarks use too), so a
connection counts whether or not the hub named it."""

from __future__ import annotations

import subprocess
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from django.conf import settings

from bench import redis_clients
from hub.accounts.api_tokens import create_api_token
from hub.accounts.models import User
from hub.lib.ports import free_port
from hub.suppliers.models import Host
from tests.support import hub_stack
from tests.support.agents import configure, running_agent
from tests.support.control_plane import agent_token, lease_state
from tests.support.hub_stack import HubStack
from tests.support.polling import wait_for
from tests.support.processes import hub_env
from tests.support.runner_process import serving

pytestmark = pytest.mark.django_db(transaction=True)

AGENTS = 3
BUDGET = 2  # Redis connections per hub process


def _hub_processes(runner: subprocess.Popen[str]) -> dict[str, int]:
    """The runner's web, worker and beat processes by name (the worker's children follow it)."""
    found: dict[str, int] = {}
    for child in psutil.Process(runner.pid).children():
        command = " ".join(child.cmdline())
        for name, marker in (("web", "hub.serve"), ("worker", " worker"), ("beat", " beat")):
            if marker in command:
                found[name] = child.pid
    return found


def _rent_and_stop(base: str, renter: User, host: Host) -> None:
    auth = {"Authorization": f"Bearer {create_api_token(renter, 'rent')[1]}"}
    body = {"host_id": host.pk, "gpu_indices": [0], "image": "busybox"}
    response = httpx.post(f"{base}/api/v1/leases/", json=body, headers=auth, timeout=30)
    assert response.status_code == 201, response.text
    lease_id = response.json()["id"]
    wait_for(lambda: lease_state(lease_id, "running"), timeout_s=60, what="lease running")
    stop = httpx.post(f"{base}/api/v1/leases/{lease_id}/stop/", headers=auth, timeout=30)
    assert stop.status_code == 200, stop.text
    wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="lease ended")


@pytest.mark.slow
def test_every_hub_process_holds_at_most_two_redis_connections(tmp_path: Path) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving(tmp_path / "state", port) as runner, ExitStack() as agents:
        stack = HubStack(web_ports=[port], env=hub_env(DATABASE_URL=hub_stack.test_database_url()))
        token = agent_token(stack, supplier)
        for n in range(AGENTS):
            state = tmp_path / f"agent-{n}"
            assert configure(state, base, token, "--runtime", "mock").returncode == 0
            agents.enter_context(running_agent(state, tmp_path / f"agent-{n}.log"))
        wait_for(
            lambda: Host.objects.filter(owner=supplier, status="online").count() == AGENTS,
            timeout_s=90,
            what=f"{AGENTS} agents online",
        )
        _rent_and_stop(base, renter, Host.objects.filter(owner=supplier).order_by("pk")[0])

        processes = _hub_processes(runner)
        assert sorted(processes) == ["beat", "web", "worker"], processes
        url = stack.env["REDIS_URL"]
        last: list[dict[str, list[dict[str, Any]]]] = []

        def over_budget() -> dict[str, list[dict[str, Any]]]:
            found = redis_clients.clients_by_process(url, processes)
            last[:] = [found]
            return {name: entries for name, entries in found.items() if len(entries) > BUDGET}

        within = [0]

        def steady_and_within() -> bool:
            # Steady state: two samples in a row within the budget (a connection opened and
            # closed again within a request, such as the health check's, may show in one).
            within[0] = within[0] + 1 if not over_budget() else 0
            return within[0] >= 2

        try:
            wait_for(steady_and_within, timeout_s=30, interval_s=1, what="steady state")
        except AssertionError:
            raise AssertionError(
                f"Redis connections per process over the budget of {BUDGET}:\n"
                + redis_clients.describe(last[0])
            ) from None
        found = last[0]
        print(redis_clients.describe(found))  # the figures docs/benchmarks.md quotes (-s)
        # The count saw the processes' connections at all: each process uses Redis.
        assert all(found[name] for name in processes), redis_clients.describe(found)
        # The web process's are the channel layer's pool, named after it (CLIENT SETNAME).
        web_names = {entry["name"] for entry in found["web"]}
        expected = f"{settings.REDIS_KEY_PREFIX}:web:{processes['web']}"
        assert web_names == {expected}, redis_clients.describe(found)
