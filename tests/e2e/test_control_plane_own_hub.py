"""End to end, each on a hub of its own (real Daphne, Celery worker and beat, Postgres, Redis,
agent processes): a lost host's lease ending after the grace, a command queued while Redis
restarts. They need settings or a Redis of their own, so they cannot share the hub of
tests/e2e/test_control_plane.py (whose worker would also dispatch their commands)."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from hub.accounts.models import User
from hub.leases.models import Command
from hub.lib.ports import free_port
from tests.support.agents import agent_env, configure, running_agent
from tests.support.control_plane import (
    agent_token,
    containers,
    docker_agent,
    lease_state,
    online_host,
    start_lease,
)
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for
from tests.support.redis_server import own_redis

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people() -> tuple[User, User]:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    return supplier, renter


@pytest.mark.docker
def test_after_the_grace_the_lease_ends_host_lost_and_no_container_is_left(
    people: tuple[User, User], tmp_path: Path, docker_client: object, busybox_image: str
) -> None:
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    env = agent_env(**fake_nvml_env(table.path))
    with hub_stack(tmp_path, LEASE_HOST_GRACE_S="2") as stack:
        state = docker_agent(stack, agent_token(stack, supplier), table, tmp_path)
        with running_agent(state, tmp_path / "agent.log", env=env) as agent:
            host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
            lease_id = start_lease(
                stack, renter, host, "--image", busybox_image, "--command", "sleep", "600"
            )
            try:
                wait_for(lambda: lease_state(lease_id, "running"), timeout_s=120, what="running")
                os.kill(agent.pid, signal.SIGKILL)
                agent.wait()
                lease = wait_for(
                    lambda: lease_state(lease_id, "ended"), timeout_s=60, what="host_lost"
                )
                assert lease.end_reason == "host_lost"
                assert [c.status for c in containers(docker_client, lease_id)] == ["running"]

                # The agent comes back still holding the claim: the hub no longer wants it.
                with running_agent(state, tmp_path / "agent2.log", env=env):
                    wait_for(
                        lambda: containers(docker_client, lease_id) == [],
                        timeout_s=60,
                        what="the orphaned container to be removed",
                    )
                    assert table.compute_mode(0) == 0
            finally:
                for container in containers(docker_client, lease_id):
                    container.remove(force=True)  # type: ignore[attr-defined]


def test_a_command_queued_while_redis_restarts_is_still_delivered_once(
    people: tuple[User, User], tmp_path: Path
) -> None:
    supplier, renter = people
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    state = tmp_path / "agent"
    first_redis = own_redis(redis_port, tmp_path / "redis-1.log")
    first_redis.__enter__()
    try:
        with hub_stack(tmp_path, redis_url=redis_url) as stack:
            assert (
                configure(
                    state, stack.url(), agent_token(stack, supplier), "--runtime", "mock"
                ).returncode
                == 0
            )
            with running_agent(state, tmp_path / "agent.log"):
                host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
                first_redis.__exit__(None, None, None)
                first_redis = None
                # Broker and channel layer are gone: the lease is still created, its reserve
                # waits in the outbox.
                lease_id = start_lease(stack, renter, host, "--image", "busybox")
                reserve = Command.objects.get(lease_id=lease_id, kind="reserve")
                assert reserve.state == "queued"
                with own_redis(redis_port, tmp_path / "redis-2.log"):
                    wait_for(
                        lambda: lease_state(lease_id, "running"), timeout_s=120, what="running"
                    )
        reserve.refresh_from_db()
        assert reserve.state == "acked"
        journal = [json.loads(line) for line in (state / "commands.jsonl").read_text().splitlines()]
        executed = [entry for entry in journal if entry["command_id"] == str(reserve.pk)]
        assert len(executed) == 1  # executed once, however often it was sent
    finally:
        if first_redis is not None:
            first_redis.__exit__(None, None, None)
