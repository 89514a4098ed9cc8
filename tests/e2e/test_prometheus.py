"""A real Prometheus server scrapes a running hub (Daphne, worker, beat, their metrics added up
through PROMETHEUS_MULTIPROC_DIR) and real agents' --metrics: targets up, connected agents and
leases counted right, and a GPU the fake NVML fails (XID) delisted, its lease flagged, the
metrics moved and the alert firing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import psutil
import pytest

from hub.accounts.models import User
from hub.leases.models import Lease
from hub.lib.metrics_dir import prepare_multiproc_dir
from hub.lib.ports import free_port
from hub.suppliers.models import Gpu
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
from tests.support.hub_stack import HubStack, hub_stack
from tests.support.polling import wait_for
from tests.support.prometheus_server import Job, Prometheus, prometheus_server

pytestmark = pytest.mark.django_db(transaction=True)

METRICS_TOKEN = f"metrics-{uuid.uuid4().hex}"
AGENT_METRICS_TOKEN = f"agent-metrics-{uuid.uuid4().hex}"
XID_DOUBLE_BIT_ECC = 48


@pytest.fixture
def people() -> tuple[User, User]:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    return supplier, renter


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[HubStack]:
    # Only the token lets a scraper in: an empty allow-list, loopback included.
    (tmp_path / "hub").mkdir()
    with hub_stack(
        tmp_path / "hub",
        PROMETHEUS_MULTIPROC_DIR=str(prepare_multiproc_dir(tmp_path / "prometheus-values")),
        METRICS_TOKEN=METRICS_TOKEN,
        METRICS_ALLOW_IPS="",
    ) as stack:
        yield stack


def _scraping(
    stack: HubStack, tmp_path: Path, agent_port: int
) -> AbstractContextManager[Prometheus]:
    hub_target = f"127.0.0.1:{stack.web_ports[0]}"
    return prometheus_server(
        tmp_path / "prometheus",
        [
            Job("cloudgpu-hub", hub_target, bearer_token=METRICS_TOKEN),
            Job("cloudgpu-agent", f"127.0.0.1:{agent_port}", bearer_token=AGENT_METRICS_TOKEN),
        ],
    )


def test_prometheus_counts_the_connected_agent_and_its_lease(
    people: tuple[User, User], tmp_path: Path, stack: HubStack
) -> None:
    supplier, renter = people
    # Without the token, even from loopback: refused.
    assert httpx.get(f"{stack.url()}/metrics", timeout=10).status_code == 401
    agent_port = free_port()
    state = tmp_path / "agent"
    assert (
        configure(state, stack.url(), agent_token(stack, supplier), "--runtime", "mock").returncode
        == 0
    )
    # The agent's endpoint on every address, so behind its token (from a file, never argv).
    token_file = tmp_path / "agent-metrics-token"
    token_file.write_text(AGENT_METRICS_TOKEN + "\n")
    with (
        _scraping(stack, tmp_path, agent_port) as prometheus,
        running_agent(
            state,
            tmp_path / "agent.log",
            *("--metrics", f"0.0.0.0:{agent_port}"),
            env=agent_env(CLOUDGPU_METRICS_TOKEN_FILE=str(token_file)),
        ) as agent,
    ):
        host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
        prometheus.wait_for_value('up{job="cloudgpu-hub"}', 1)
        prometheus.wait_for_value('up{job="cloudgpu-agent"}', 1)
        agent_metrics = f"http://127.0.0.1:{agent_port}/metrics"
        assert httpx.get(agent_metrics, timeout=10).status_code == 401
        assert AGENT_METRICS_TOKEN not in " ".join(psutil.Process(agent.pid).cmdline())
        prometheus.wait_for_value("sum(cloudgpu_agents_connected)", 1)
        prometheus.wait_for_value('sum(cloudgpu_hosts{status="online"})', 1)
        prometheus.wait_for_value("cloudgpu_agent_hub_connected", 1)
        prometheus.wait_for_value('sum(cloudgpu_leases{state="running"})', 0)

        lease_id = start_lease(stack, renter, host, "--image", "busybox", "--port", "8080")
        wait_for(lambda: lease_state(lease_id, "running"), timeout_s=60, what="running")
        prometheus.wait_for_value('sum(cloudgpu_leases{state="running"})', 1)
        prometheus.wait_for_value("cloudgpu_agent_leases", 1)
        # Counted in the web process (acks) and the worker (dispatch): added up in one scrape.
        prometheus.wait_for_value('sum(cloudgpu_command_ack_seconds_count{kind="reserve"})', 1)
        prometheus.wait_for_value('sum(cloudgpu_commands_finished_total{outcome="ok"})', 2)
        prometheus.wait_for_value("sum(cloudgpu_lease_start_seconds_count)", 1)
        assert (prometheus.value("sum(cloudgpu_heartbeats_total)") or 0) >= 1
        # Flushes run in the worker, every HOST_STATS_FLUSH_INTERVAL_S: that process's values.
        wait_for(
            lambda: (prometheus.value("sum(cloudgpu_telemetry_flush_seconds_count)") or 0) >= 1,
            timeout_s=60,
            what="a telemetry flush counted",
        )

        stack.manage("hub", "lease", "release", lease_id)
        wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="ended")
        prometheus.wait_for_value('sum(cloudgpu_leases{state="running"})', 0)
    # The agent is gone: its socket no longer counts.
    assert (
        "cloudgpu_agents_connected 0.0"
        in httpx.get(
            f"{stack.url()}/metrics",
            headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
            timeout=10,
        ).text
    )


@pytest.mark.docker
def test_an_xid_on_a_rented_gpu_delists_it_flags_the_lease_and_fires_the_alert(
    people: tuple[User, User],
    tmp_path: Path,
    stack: HubStack,
    docker_client: object,
    busybox_image: str,
) -> None:
    supplier, renter = people
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    state = docker_agent(stack, agent_token(stack, supplier), table, tmp_path)
    env = agent_env(**fake_nvml_env(table.path))
    agent_port = free_port()
    lease_id = ""
    with (
        _scraping(stack, tmp_path, agent_port) as prometheus,
        running_agent(
            state, tmp_path / "agent.log", "--metrics", f"127.0.0.1:{agent_port}", env=env
        ),
    ):
        try:
            host = wait_for(lambda: online_host(supplier), timeout_s=60, what="host online")
            lease_id = start_lease(
                stack, renter, host, "--image", busybox_image, "--command", "sleep", "600"
            )
            lease = wait_for(
                lambda: lease_state(lease_id, "running", "failed"), timeout_s=120, what="running"
            )
            assert lease.state == "running", lease.failure_reason
            prometheus.wait_for_value('sum(cloudgpu_gpu_delistings_total{cause="xid"})', 0)
            prometheus.wait_for_value('DCGM_FI_DEV_GPU_UTIL{job="cloudgpu-agent",gpu="0"}', 0)

            table.raise_xid(0, XID_DOUBLE_BIT_ECC)
            table.add_ecc_errors(0, uncorrected=1)
            gpu = wait_for(
                lambda: Gpu.objects.filter(host=host, unhealthy_since__isnull=False).first(),
                timeout_s=60,
                what="the GPU delisted",
            )
            assert not gpu.listed
            assert "XID 48" in gpu.unhealthy_reason
            lease = Lease.objects.get(pk=lease_id)
            assert lease.state == "running"  # flagged, not ended: the renter decides
            assert lease.gpu_fault_at is not None
            assert "GPU 0" in lease.gpu_fault_reason

            prometheus.wait_for_value('sum(cloudgpu_gpu_delistings_total{cause="xid"})', 1)
            prometheus.wait_for_value("sum(cloudgpu_leases_gpu_fault)", 1)
            prometheus.wait_for_value('DCGM_FI_DEV_XID_ERRORS{job="cloudgpu-agent"}', 48)
            prometheus.wait_for_value('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job="cloudgpu-agent"}', 1)
            prometheus.wait_for_value(
                'count(ALERTS{alertname="CloudGPUGpuDelisted",alertstate="firing"})', 1
            )

            stack.manage("hub", "lease", "release", lease_id)
            wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="ended")
            prometheus.wait_for_value('sum(cloudgpu_gpus{state="unhealthy"})', 1)
        finally:
            for container in containers(docker_client, lease_id) if lease_id else []:
                container.remove(force=True)  # type: ignore[attr-defined]
