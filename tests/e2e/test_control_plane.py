"""End to end: real Daphne processes, Celery worker and beat, Postgres, Redis and real agent
processes (mock runtime, or Docker with the fake NVML), all on one hub for the module. Tests
that need a hub with settings or a Redis of its own: tests/e2e/test_control_plane_own_hub.py."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from hub.accounts.models import User
from hub.leases.models import Command, Lease
from hub.suppliers.models import Gpu, Host, HostTransition
from tests.support.agents import agent_env, configure, running_agent
from tests.support.control_plane import (
    agent_token,
    containers,
    docker_agent,
    lease_state,
    online_host,
    smoke,
    start_lease,
)
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.hub_stack import HubStack, hub_stack
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def shared_stack(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubStack]:
    """One hub (two Daphnes, a worker and beat) for the tests that need nothing special of
    it: each brings its own supplier, renter, token and agent, so they can share it (a start
    costs seconds). Tests with their own settings or Redis start their own."""
    with hub_stack(tmp_path_factory.mktemp("control-plane-hub"), webs=2) as stack:
        yield stack


@pytest.fixture
def people() -> tuple[User, User]:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    return supplier, renter


def test_a_mock_agent_on_one_daphne_gets_commands_from_the_worker(
    people: tuple[User, User], tmp_path: Path, shared_stack: HubStack
) -> None:
    supplier, renter = people
    stack = shared_stack
    token = agent_token(stack, supplier)
    state = tmp_path / "agent"
    # The agent holds its socket on the second Daphne; commands come from the Celery
    # worker, a third process, through the channel layer.
    assert configure(state, stack.url(1), token, "--runtime", "mock").returncode == 0
    assert smoke(state) == 0
    with running_agent(state, tmp_path / "agent.log"):
        host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
        assert [g.name for g in Gpu.objects.filter(host=host)] == ["NVIDIA GeForce RTX 4090"]
        assert HostTransition.objects.filter(host=host, to_status="online").exists()

        # Garbage from another socket with the same token does not disturb the agent.
        with ws_connect(
            f"ws://127.0.0.1:{stack.web_ports[0]}/api/p2p/ws/",
            additional_headers={"Authorization": f"Bearer {token}"},
        ) as rogue:
            for frame in ("{", '{"type": "ack", "v": 1}', "x" * 70000):
                rogue.send(frame)
                assert json.loads(rogue.recv(timeout=10))["type"] == "error"

        lease_id = start_lease(stack, renter, host, "--image", "busybox", "--port", "8080")
        lease = wait_for(lambda: lease_state(lease_id, "running"), timeout_s=60, what="running")
        assert set(lease.host_ports) == {"8080"}  # the mock's page, on a free host port
        assert Command.objects.filter(lease=lease, state="acked").count() == 2

        stack.manage("hub", "lease", "release", lease_id, "--reason", "renter_stop")
        lease = wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="ended")
        assert lease.end_reason == "renter_stop"
        assert not lease.lease_gpus.filter(active=True).exists()

        token_row = host.token
        stack.manage("hub", "token", "revoke", str(token_row.pk))
        wait_for(
            lambda: "rejected the token" in (tmp_path / "agent.log").read_text(),
            timeout_s=30,
            what="the revoked agent to be refused",
        )
    assert smoke(state) == 4
    logs = stack.log_text() + (tmp_path / "agent.log").read_text()
    assert token not in logs
    assert "/api/p2p/ws/" in logs  # the access log is on, and redacted


@pytest.mark.docker
def test_a_docker_lease_runs_its_container_and_release_removes_it(
    people: tuple[User, User],
    tmp_path: Path,
    shared_stack: HubStack,
    docker_client: object,
    busybox_image: str,
) -> None:
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    stack = shared_stack
    state = docker_agent(stack, agent_token(stack, supplier), table, tmp_path)
    env = agent_env(**fake_nvml_env(table.path))
    with running_agent(state, tmp_path / "agent.log", env=env):
        host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
        marker = uuid.uuid4().hex
        serve = f"mkdir /www; echo {marker} > /www/index.html; exec httpd -f -p 8080 -h /www"
        lease_id = start_lease(
            stack, renter, host, "--image", busybox_image, "--port", "8080", "--command",
            "sh", "-c", serve,
        )  # fmt: skip
        try:
            lease = wait_for(
                lambda: lease_state(lease_id, "running", "failed"),
                timeout_s=120,
                what="running",
            )
            assert lease.state == "running", lease.failure_reason
            assert [c.status for c in containers(docker_client, lease_id)] == ["running"]
            # What ran is pinned on the lease: the test image's id (allow_local_images here).
            assert lease.image_digest == docker_client.images.get(busybox_image).id  # type: ignore[attr-defined]
            port = lease.host_ports["8080"]
            assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text.strip() == marker
            assert table.compute_mode(0) == 3  # EXCLUSIVE_PROCESS while rented

            # The lease's own process on the GPU is fine; another platform's is flagged.
            container = containers(docker_client, lease_id)[0]
            own_pid = container.attrs["State"]["Pid"]  # type: ignore[attr-defined]
            table.add_process(0, pid=own_pid, name="httpd")
            wait_for(
                lambda: any(p["pid"] == own_pid for p in Gpu.objects.get(host=host).processes),
                timeout_s=30,
                what="the heartbeat showing the lease's own process",
            )
            assert Lease.objects.get(pk=lease_id).foreign_process_seen_at is None
            table.add_process(0, pid=999_999, name="crypto-miner")
            wait_for(
                lambda: Lease.objects.get(pk=lease_id).foreign_process_seen_at,
                timeout_s=30,
                what="the foreign process to be flagged",
            )
            assert Gpu.objects.get(host=host).foreign_process_seen_at is not None
            table.remove_process(0, 999_999)
            table.remove_process(0, own_pid)

            stack.manage("hub", "lease", "release", lease_id)
            wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="ended")
            assert containers(docker_client, lease_id) == []
            assert table.compute_mode(0) == 0
        finally:
            for container in containers(docker_client, lease_id):
                container.remove(force=True)  # type: ignore[attr-defined]


@pytest.mark.docker
def test_a_rental_writing_past_its_disk_allowance_ends_with_the_reason_on_its_page(
    people: tuple[User, User],
    tmp_path: Path,
    shared_stack: HubStack,
    docker_client: object,
    busybox_image: str,
) -> None:
    """Issue 33 item 1, through the real hub and agent: the supplier's 1 GiB allowance reaches
    the agent in the docker_run, its disk guard stops a full-speed writer, and the lease ends
    as `disk` with the agent's sentence among its warnings."""
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    state = docker_agent(shared_stack, agent_token(shared_stack, supplier), table, tmp_path)
    env = agent_env(**fake_nvml_env(table.path))
    with running_agent(state, tmp_path / "agent.log", env=env):
        host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
        Gpu.objects.filter(host=host).update(disk_allowance_bytes=1024**3)
        flood = "dd if=/dev/zero of=/flood bs=1M count=8192 conv=fsync; exec sleep 600"
        lease_id = start_lease(
            shared_stack, renter, host, "--image", busybox_image, "--command", "sh", "-c", flood
        )
        try:
            lease = wait_for(
                lambda: lease_state(lease_id, "ended", "failed"), timeout_s=180, what="its end"
            )
            assert lease.disk_allowance_bytes == 1024**3
            assert lease.end_reason == "disk", (lease.state, lease.failure_reason)
            assert any("over its allowance of 1.0 GiB" in w for w in lease.warnings), lease.warnings
            wait_for(lambda: containers(docker_client, lease_id) == [], timeout_s=60, what="gone")
        finally:
            for container in containers(docker_client, lease_id):
                container.remove(force=True)  # type: ignore[attr-defined]


def test_a_killed_agent_goes_offline_and_its_lease_survives_a_quick_return(
    people: tuple[User, User], tmp_path: Path, shared_stack: HubStack
) -> None:
    supplier, renter = people
    stack = shared_stack
    state = tmp_path / "agent"
    assert (
        configure(state, stack.url(), agent_token(stack, supplier), "--runtime", "mock").returncode
        == 0
    )
    with running_agent(state, tmp_path / "agent.log") as agent:
        host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
        lease_id = start_lease(stack, renter, host, "--image", "busybox")
        wait_for(lambda: lease_state(lease_id, "running"), timeout_s=60, what="running")
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()

    def offline() -> Host | None:
        return Host.objects.filter(pk=host.pk, status=Host.Status.OFFLINE).first()

    wait_for(offline, timeout_s=30, what="host offline")  # HOST_OFFLINE_AFTER_S is 3 here
    transition = HostTransition.objects.filter(host=host, to_status="offline").get()
    assert "no heartbeat" in transition.reason
    assert Lease.objects.get(pk=lease_id).host_lost_since is not None

    with running_agent(state, tmp_path / "agent2.log"):
        wait_for(lambda: online_host(supplier), timeout_s=60, what="host back online")
        lease = Lease.objects.get(pk=lease_id)
        assert lease.state == "running"
        assert lease.host_lost_since is None


@pytest.mark.docker
def test_a_container_that_exits_on_its_own_ends_its_lease_with_the_exit_code(
    people: tuple[User, User],
    tmp_path: Path,
    shared_stack: HubStack,
    docker_client: object,
    busybox_image: str,
) -> None:
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    env = agent_env(**fake_nvml_env(table.path))
    stack = shared_stack
    state = docker_agent(stack, agent_token(stack, supplier), table, tmp_path)
    with running_agent(state, tmp_path / "agent.log", env=env):
        host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
        job = "echo training; trap 'echo diverged; exit 3' TERM; sleep 600 & wait"
        lease_id = start_lease(
            stack, renter, host, "--image", busybox_image, "--command", "sh", "-c", job
        )
        try:
            wait_for(lambda: lease_state(lease_id, "running"), timeout_s=120, what="running")
            containers(docker_client, lease_id)[0].kill(signal="SIGTERM")  # type: ignore[attr-defined]
            lease = wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="ended")
            assert lease.end_reason == "exited"
            assert lease.exit_code == 3
            assert "diverged" in lease.log_tail
            assert containers(docker_client, lease_id) == []
            assert not lease.lease_gpus.filter(active=True).exists()
        finally:
            for container in containers(docker_client, lease_id):
                container.remove(force=True)  # type: ignore[attr-defined]
