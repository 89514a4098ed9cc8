"""supplier_agent.gpu_health and the agent's metrics endpoint against the fake pynvml: XID
events, ECC totals, a board fallen off the bus, thermal slowdown; dcgm-exporter's names."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hub.lib.ports import free_port
from supplier_agent import metrics
from supplier_agent.gpu import Nvml
from supplier_agent.gpu_health import HealthWatch
from tests.support.fake_gpus import FakeGpuTable, gpu_uuid, installed_fake_nvml

XID_FALLEN_OFF_THE_BUS = 79
XID_DOUBLE_BIT_ECC = 48
XID_APP_FAULT = 13  # a program's fault, not the board's


@pytest.fixture
def table(tmp_path: Path) -> FakeGpuTable:
    return FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=2)


@pytest.fixture
def watched(table: FakeGpuTable) -> Iterator[tuple[Nvml, HealthWatch]]:
    with installed_fake_nvml(table.path):
        nvml = Nvml()
        watch = HealthWatch(nvml)
        watch.watch(nvml.gpus())
        yield nvml, watch
        nvml.shutdown()


def test_healthy_gpus_report_nothing_wrong(watched: tuple[Nvml, HealthWatch]) -> None:
    _, watch = watched
    health = watch.sample()
    assert [g.uuid for g in health] == [gpu_uuid(0), gpu_uuid(1)]
    assert all(g.healthy for g in health)


def test_xids_raised_after_watching_are_reported_on_their_gpu(
    table: FakeGpuTable, watched: tuple[Nvml, HealthWatch]
) -> None:
    _, watch = watched
    table.raise_xid(1, XID_DOUBLE_BIT_ECC)
    table.raise_xid(1, XID_APP_FAULT)
    table.raise_xid(1, XID_DOUBLE_BIT_ECC)
    first, second = watch.sample()
    assert first.healthy
    assert second.xids == (XID_DOUBLE_BIT_ECC, XID_APP_FAULT)
    assert second.xid_count == 3
    # Counted since the agent started: a later sample still says so, without new events.
    assert watch.sample()[1].xid_count == 3


def test_xids_from_before_the_watch_are_not_delivered(tmp_path: Path) -> None:
    table = FakeGpuTable.create(tmp_path / "gpus.json")
    table.raise_xid(0, XID_FALLEN_OFF_THE_BUS)
    with installed_fake_nvml(table.path):
        nvml = Nvml()
        watch = HealthWatch(nvml)
        watch.watch(nvml.gpus())
        assert watch.sample()[0].xid_count == 0
        nvml.shutdown()


def test_ecc_thermal_and_lost_boards(
    table: FakeGpuTable, watched: tuple[Nvml, HealthWatch]
) -> None:
    nvml, watch = watched
    table.add_ecc_errors(0, uncorrected=2, corrected=5)
    table.update_gpu(1, clocks_event_reasons=0x40)
    first, second = watch.sample()
    assert (first.ecc_uncorrected, first.ecc_corrected) == (2, 5)
    assert second.thermal_throttle
    table.update_gpu(1, lost=True)
    lost = watch.sample()[1]
    assert lost.lost
    assert lost.uuid == gpu_uuid(1)  # the last UUID it had: NVML cannot read it any more
    assert [g.index for g in nvml.gpus()] == [0]  # and the heartbeat leaves it out


def test_the_metrics_endpoint_speaks_dcgm_exporters_names(
    table: FakeGpuTable, watched: tuple[Nvml, HealthWatch]
) -> None:
    nvml, watch = watched
    table.update_gpu(0, utilization=87, temperature=66, power_usage=312_500)
    table.raise_xid(0, XID_DOUBLE_BIT_ECC)
    collector = metrics.AgentCollector(
        metrics.AgentView(connected=lambda: True, reconnects=lambda: 3, leases=lambda: 1),
        nvml,
        watch,
    )
    port = free_port()
    server = metrics.serve(f"127.0.0.1:{port}", collector)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    found = {
        (s.name, s.labels.get("gpu")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert found[("DCGM_FI_DEV_GPU_UTIL", "0")] == 87
    assert found[("DCGM_FI_DEV_GPU_TEMP", "0")] == 66
    assert found[("DCGM_FI_DEV_POWER_USAGE", "0")] == pytest.approx(312.5)
    assert found[("DCGM_FI_DEV_XID_ERRORS", "0")] == XID_DOUBLE_BIT_ECC
    assert found[("cloudgpu_agent_gpu_xid_errors_total", "0")] == 1
    assert found[("cloudgpu_agent_hub_connected", None)] == 1
    assert found[("cloudgpu_agent_reconnects_total", None)] == 3
    assert found[("cloudgpu_agent_leases", None)] == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9835", ("127.0.0.1", 9835)),
        ("9835", ("127.0.0.1", 9835)),
        ("[::1]:1", ("::1", 1)),
    ],
)
def test_metrics_addresses(text: str, expected: tuple[str, int]) -> None:
    assert metrics.parse_address(text) == expected


@pytest.mark.parametrize("text", ["localhost:http", "127.0.0.1:0", ":70000"])
def test_bad_metrics_addresses_are_refused_with_the_reason(text: str) -> None:
    with pytest.raises(metrics.MetricsAddressError, match="--metrics"):
        metrics.parse_address(text)
