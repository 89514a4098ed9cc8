"""End to end: real Daphne processes, Celery worker and beat, Postgres, Redis and real agent
processes (mock runtime, or Docker with the fake NVML)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from hub.accounts.models import User
from hub.leases.models import Command, Lease
from hub.lib.ports import free_port
from hub.suppliers.models import Gpu, Host, HostTransition
from tests.support.agents import AGENT, agent_env, configure, running_agent
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.hub_stack import HubStack, hub_stack
from tests.support.polling import wait_for
from tests.support.redis_server import own_redis

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people() -> tuple[User, User]:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    return supplier, renter


def _token(stack: HubStack, supplier: User) -> str:
    return stack.manage(
        "hub", "token", "create", "--owner", supplier.username, "--default-price", "0"
    )


def _online_host(supplier: User) -> Host | None:
    return Host.objects.filter(owner=supplier, status=Host.Status.ONLINE).first()


def _lease_state(lease_id: str, *states: str) -> Lease | None:
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.state in states else None


def _start_lease(stack: HubStack, renter: User, host: Host, *args: str) -> str:
    return stack.manage(
        "hub", "lease", "start", "--renter", renter.username, "--host", str(host.pk), *args
    ).splitlines()[0]


def _smoke(state: Path) -> int:
    return subprocess.run(
        [AGENT, "smoke", "--state", str(state)], env=agent_env(), timeout=60, check=False
    ).returncode


def test_a_mock_agent_on_one_daphne_gets_commands_from_the_worker(
    people: tuple[User, User], tmp_path: Path
) -> None:
    supplier, renter = people
    with hub_stack(tmp_path, webs=2) as stack:
        token = _token(stack, supplier)
        state = tmp_path / "agent"
        # The agent holds its socket on the second Daphne; commands come from the Celery
        # worker, a third process, through the channel layer.
        assert configure(state, stack.url(1), token, "--runtime", "mock").returncode == 0
        assert _smoke(state) == 0
        with running_agent(state, tmp_path / "agent.log"):
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
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

            lease_id = _start_lease(stack, renter, host, "--image", "busybox", "--port", "8080")
            lease = wait_for(
                lambda: _lease_state(lease_id, "running"), timeout_s=60, what="running"
            )
            assert lease.host_ports == {"8080": 20000}
            assert Command.objects.filter(lease=lease, state="acked").count() == 2

            stack.manage("hub", "lease", "release", lease_id, "--reason", "renter_stop")
            lease = wait_for(lambda: _lease_state(lease_id, "ended"), timeout_s=60, what="ended")
            assert lease.end_reason == "renter_stop"
            assert not lease.lease_gpus.filter(active=True).exists()

            token_row = host.token
            stack.manage("hub", "token", "revoke", str(token_row.pk))
            wait_for(
                lambda: "rejected the token" in (tmp_path / "agent.log").read_text(),
                timeout_s=30,
                what="the revoked agent to be refused",
            )
        assert _smoke(state) == 4
    logs = stack.log_text() + (tmp_path / "agent.log").read_text()
    assert token not in logs
    assert "/api/p2p/ws/" in logs  # the access log is on, and redacted


def _docker_agent(stack: HubStack, token: str, table: FakeGpuTable, tmp_path: Path) -> Path:
    state = tmp_path / "agent"
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    env = agent_env(**fake_nvml_env(table.path))
    result = configure(
        state, stack.url(), token, "--gpu-devices", "none", "--lock-dir", str(locks), env=env
    )
    assert result.returncode == 0, result.stderr
    return state


def _containers(docker_client: object, lease_id: str) -> list[object]:
    return docker_client.containers.list(  # type: ignore[attr-defined]
        all=True, filters={"label": f"cloudgpu.lease={lease_id}"}
    )


@pytest.mark.docker
def test_a_docker_lease_runs_its_container_and_release_removes_it(
    people: tuple[User, User], tmp_path: Path, docker_client: object, busybox_image: str
) -> None:
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    with hub_stack(tmp_path) as stack:
        state = _docker_agent(stack, _token(stack, supplier), table, tmp_path)
        env = agent_env(**fake_nvml_env(table.path))
        with running_agent(state, tmp_path / "agent.log", env=env):
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
            marker = uuid.uuid4().hex
            serve = f"mkdir /www; echo {marker} > /www/index.html; exec httpd -f -p 8080 -h /www"
            lease_id = _start_lease(
                stack, renter, host, "--image", busybox_image, "--port", "8080", "--command",
                "sh", "-c", serve,
            )  # fmt: skip
            try:
                lease = wait_for(
                    lambda: _lease_state(lease_id, "running", "failed"),
                    timeout_s=120,
                    what="running",
                )
                assert lease.state == "running", lease.failure_reason
                assert [c.status for c in _containers(docker_client, lease_id)] == ["running"]
                port = lease.host_ports["8080"]
                assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text.strip() == marker
                assert table.compute_mode(0) == 3  # EXCLUSIVE_PROCESS while rented

                # The lease's own process on the GPU is fine; another platform's is flagged.
                container = _containers(docker_client, lease_id)[0]
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
                wait_for(lambda: _lease_state(lease_id, "ended"), timeout_s=60, what="ended")
                assert _containers(docker_client, lease_id) == []
                assert table.compute_mode(0) == 0
            finally:
                for container in _containers(docker_client, lease_id):
                    container.remove(force=True)  # type: ignore[attr-defined]


def test_a_killed_agent_goes_offline_and_its_lease_survives_a_quick_return(
    people: tuple[User, User], tmp_path: Path
) -> None:
    supplier, renter = people
    with hub_stack(tmp_path) as stack:
        state = tmp_path / "agent"
        assert (
            configure(state, stack.url(), _token(stack, supplier), "--runtime", "mock").returncode
            == 0
        )
        with running_agent(state, tmp_path / "agent.log") as agent:
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
            lease_id = _start_lease(stack, renter, host, "--image", "busybox")
            wait_for(lambda: _lease_state(lease_id, "running"), timeout_s=60, what="running")
            os.kill(agent.pid, signal.SIGKILL)
            agent.wait()

        def offline() -> Host | None:
            return Host.objects.filter(pk=host.pk, status=Host.Status.OFFLINE).first()

        wait_for(offline, timeout_s=30, what="host offline")  # HOST_OFFLINE_AFTER_S is 3 here
        transition = HostTransition.objects.filter(host=host, to_status="offline").get()
        assert "no heartbeat" in transition.reason
        assert Lease.objects.get(pk=lease_id).host_lost_since is not None

        with running_agent(state, tmp_path / "agent2.log"):
            wait_for(lambda: _online_host(supplier), timeout_s=60, what="host back online")
            lease = Lease.objects.get(pk=lease_id)
            assert lease.state == "running"
            assert lease.host_lost_since is None


@pytest.mark.docker
def test_after_the_grace_the_lease_ends_host_lost_and_no_container_is_left(
    people: tuple[User, User], tmp_path: Path, docker_client: object, busybox_image: str
) -> None:
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    env = agent_env(**fake_nvml_env(table.path))
    with hub_stack(tmp_path, LEASE_HOST_GRACE_S="2") as stack:
        state = _docker_agent(stack, _token(stack, supplier), table, tmp_path)
        with running_agent(state, tmp_path / "agent.log", env=env) as agent:
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
            lease_id = _start_lease(
                stack, renter, host, "--image", busybox_image, "--command", "sleep", "600"
            )
            try:
                wait_for(lambda: _lease_state(lease_id, "running"), timeout_s=120, what="running")
                os.kill(agent.pid, signal.SIGKILL)
                agent.wait()
                lease = wait_for(
                    lambda: _lease_state(lease_id, "ended"), timeout_s=60, what="host_lost"
                )
                assert lease.end_reason == "host_lost"
                assert [c.status for c in _containers(docker_client, lease_id)] == ["running"]

                # The agent comes back still holding the claim: the hub no longer wants it.
                with running_agent(state, tmp_path / "agent2.log", env=env):
                    wait_for(
                        lambda: _containers(docker_client, lease_id) == [],
                        timeout_s=60,
                        what="the orphaned container to be removed",
                    )
                    assert table.compute_mode(0) == 0
            finally:
                for container in _containers(docker_client, lease_id):
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
                    state, stack.url(), _token(stack, supplier), "--runtime", "mock"
                ).returncode
                == 0
            )
            with running_agent(state, tmp_path / "agent.log"):
                host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
                first_redis.__exit__(None, None, None)
                first_redis = None
                # Broker and channel layer are gone: the lease is still created, its reserve
                # waits in the outbox.
                lease_id = _start_lease(stack, renter, host, "--image", "busybox")
                reserve = Command.objects.get(lease_id=lease_id, kind="reserve")
                assert reserve.state == "queued"
                with own_redis(redis_port, tmp_path / "redis-2.log"):
                    wait_for(
                        lambda: _lease_state(lease_id, "running"), timeout_s=120, what="running"
                    )
        reserve.refresh_from_db()
        assert reserve.state == "acked"
        journal = [json.loads(line) for line in (state / "commands.jsonl").read_text().splitlines()]
        executed = [entry for entry in journal if entry["command_id"] == str(reserve.pk)]
        assert len(executed) == 1  # executed once, however often it was sent
    finally:
        if first_redis is not None:
            first_redis.__exit__(None, None, None)


@pytest.mark.docker
def test_a_container_that_exits_on_its_own_ends_its_lease_with_the_exit_code(
    people: tuple[User, User], tmp_path: Path, docker_client: object, busybox_image: str
) -> None:
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    env = agent_env(**fake_nvml_env(table.path))
    with hub_stack(tmp_path) as stack:
        state = _docker_agent(stack, _token(stack, supplier), table, tmp_path)
        with running_agent(state, tmp_path / "agent.log", env=env):
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
            job = "echo training; trap 'echo diverged; exit 3' TERM; sleep 600 & wait"
            lease_id = _start_lease(
                stack, renter, host, "--image", busybox_image, "--command", "sh", "-c", job
            )
            try:
                wait_for(lambda: _lease_state(lease_id, "running"), timeout_s=120, what="running")
                _containers(docker_client, lease_id)[0].kill(signal="SIGTERM")  # type: ignore[attr-defined]
                lease = wait_for(
                    lambda: _lease_state(lease_id, "ended"), timeout_s=60, what="ended"
                )
                assert lease.end_reason == "exited"
                assert lease.exit_code == 3
                assert "diverged" in lease.log_tail
                assert _containers(docker_client, lease_id) == []
                assert not lease.lease_gpus.filter(active=True).exists()
            finally:
                for container in _containers(docker_client, lease_id):
                    container.remove(force=True)  # type: ignore[attr-defined]
