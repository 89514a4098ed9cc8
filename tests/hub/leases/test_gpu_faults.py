"""hub.leases.gpu_faults: a GPU its agent reports failing is delisted, its lease flagged, its
supplier told why and how to relist; the rules come from settings."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from hub.leases import gpu_faults
from hub.leases.models import Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Gpu
from supplier_agent.protocol import GpuHealth, GpuHealthReport
from tests.hub import factories as f

pytestmark = pytest.mark.django_db(transaction=True)

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"


def health(**fields: Any) -> GpuHealth:
    return GpuHealth(**{"index": 0, "uuid": UUID0, **fields})


def delistings(cause: str) -> float:
    return REGISTRY.get_sample_value("cloudgpu_gpu_delistings_total", {"cause": cause}) or 0.0


@pytest.mark.parametrize(
    ("signals", "cause"),
    [
        ({"xids": (13, 79), "xid_count": 2}, "xid"),
        ({"ecc_uncorrected": 1}, "ecc"),
        ({"lost": True}, "lost"),
    ],
)
def test_the_default_rules_call_these_failures(signals: dict[str, Any], cause: str) -> None:
    fault = gpu_faults.fault_of(health(**signals))
    assert fault is not None
    assert fault.cause == cause
    assert "relist" in fault.reason or "put the GPU up for rent again" in fault.reason


@pytest.mark.parametrize(
    "signals",
    [{}, {"xids": (13, 31), "xid_count": 5}, {"ecc_corrected": 1000}, {"thermal_throttle": True}],
)
def test_application_xids_corrected_ecc_and_heat_are_not_failures(signals: dict[str, Any]) -> None:
    assert gpu_faults.fault_of(health(**signals)) is None


def test_the_rules_are_settings(settings: Any) -> None:
    settings.GPU_DELIST_XIDS = frozenset({13})
    settings.GPU_DELIST_ECC_UNCORRECTED = 0
    settings.GPU_DELIST_THERMAL = True
    assert gpu_faults.fault_of(health(xids=(13,), xid_count=1)) is not None
    assert gpu_faults.fault_of(health(ecc_uncorrected=50)) is None
    assert gpu_faults.fault_of(health(thermal_throttle=True)).cause == "thermal"  # type: ignore[union-attr]


def test_a_failed_gpu_is_delisted_its_lease_flagged_and_relisting_clears_it() -> None:
    host = f.register_host()
    lease = f.run_lease(host)
    before = delistings("xid")
    uuid = Gpu.objects.get(host=host, index=0).uuid
    report = GpuHealthReport(gpus=(health(uuid=uuid, xids=(48,), xid_count=1),))
    faults = gpu_faults.faults_in(report)
    assert gpu_faults.delist_failed_gpus(host.pk, faults) == [0]
    gpu = Gpu.objects.get(host=host, index=0)
    assert not gpu.listed
    assert gpu.unhealthy_since is not None
    assert "XID 48" in gpu.unhealthy_reason
    assert "restart cloudgpu-agent" in gpu.unhealthy_reason
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING  # the renter decides
    assert lease.gpu_fault_at is not None
    assert "GPU 0" in lease.gpu_fault_reason
    assert delistings("xid") == before + 1
    # The same report again (a reconnect) changes nothing and counts nothing.
    assert gpu_faults.delist_failed_gpus(host.pk, faults) == []
    assert delistings("xid") == before + 1
    supplier_services.set_gpu_terms(gpu.pk, listed=True)
    gpu.refresh_from_db()
    assert gpu.listed
    assert gpu.unhealthy_since is None
    assert gpu.unhealthy_reason == ""


def test_a_report_about_another_board_in_the_slot_changes_nothing() -> None:
    host = f.register_host()
    faults = gpu_faults.faults_in(
        GpuHealthReport(gpus=(GpuHealth(index=0, uuid="GPU-someone-else", lost=True),))
    )
    assert gpu_faults.delist_failed_gpus(host.pk, faults) == []
    assert Gpu.objects.get(host=host, index=0).listed
