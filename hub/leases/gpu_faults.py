"""A GPU failed: the hub takes it off the market, flags the lease running on it, and tells its
supplier why and how to put it back. The one home of "a GPU is unhealthy".

The agent reports what NVML saw (``gpu_health``: XIDs, ECC totals, a lost board, thermal
slowdown, all counted since the agent started); the rules here, from settings, decide which of
that is a failure. Delisting is sticky: the supplier relists the GPU (``set_gpu_terms``) once
it is fixed, which clears the mark. A relisted GPU whose agent still reports the old fault (its
counters run since the agent started) is delisted again on its next report, so the way back is
fix, restart the agent, relist. The running lease goes on: the renter decides whether results
from a failing GPU are worth keeping.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from hub.leases.models import Lease
from hub.lib import metrics
from hub.notifications.events import emit
from hub.suppliers.models import Gpu, Host
from supplier_agent.protocol import GpuHealth, GpuHealthReport

log = logging.getLogger(__name__)

HOW_TO_RELIST = (
    "Check the GPU on the host (nvidia-smi -q, and the kernel log for 'NVRM: Xid'), reset or "
    "reboot it, restart cloudgpu-agent, then put the GPU up for rent again."
)


@dataclass(frozen=True)
class Fault:
    index: int
    uuid: str
    cause: str  # a cloudgpu_gpu_delistings label: xid, ecc, lost, thermal
    detail: str

    @property
    def reason(self) -> str:
        return f"{self.detail}. {HOW_TO_RELIST}"


def fault_of(gpu: GpuHealth) -> Fault | None:
    """The failure the settings' rules see in one GPU's health, or None. Pure: it runs in the
    agent socket on every report, and only a fault costs a query."""
    if gpu.lost and settings.GPU_DELIST_LOST:
        return Fault(gpu.index, gpu.uuid, "lost", "NVML lost the GPU (it fell off the bus)")
    fatal = [xid for xid in gpu.xids if xid in settings.GPU_DELIST_XIDS]
    if fatal:
        codes = ", ".join(str(x) for x in fatal)
        return Fault(gpu.index, gpu.uuid, "xid", f"the driver reported XID {codes}")
    limit = settings.GPU_DELIST_ECC_UNCORRECTED
    if limit > 0 and gpu.ecc_uncorrected >= limit:
        return Fault(
            gpu.index,
            gpu.uuid,
            "ecc",
            f"{gpu.ecc_uncorrected} uncorrected ECC memory errors since the driver loaded",
        )
    if gpu.thermal_throttle and settings.GPU_DELIST_THERMAL:
        return Fault(gpu.index, gpu.uuid, "thermal", "the GPU is slowing down for heat")
    return None


def faults_in(report: GpuHealthReport) -> list[Fault]:
    return [fault for fault in map(fault_of, report.gpus) if fault is not None]


def delist_failed_gpus(host_id: int, faults: list[Fault]) -> list[int]:
    """Delist each failing GPU of the host not already marked, and flag the active lease on it.
    Returns the indices newly delisted; a report naming a GPU by a UUID the hub does not have at
    that index changes nothing (another board took the slot)."""
    if not faults:
        return []
    now = timezone.now()
    by_index = {fault.index: fault for fault in faults}
    delisted: list[Fault] = []
    flagged: list[tuple[str, Fault]] = []
    with transaction.atomic():
        gpus = (
            Gpu.objects.select_for_update(no_key=True)
            .filter(host_id=host_id, index__in=list(by_index), unhealthy_since__isnull=True)
            .order_by("pk")
        )
        host: Host | None = None
        for gpu in gpus:
            fault = by_index[gpu.index]
            if gpu.uuid != fault.uuid:
                continue
            # One notice per GPU newly marked: "delisted" when this takes it off the market,
            # "fault" when its supplier had it unlisted already (nothing was delisted, but it
            # stays off until relisted, which they should know before relisting it).
            kind = "gpu.delisted" if gpu.listed else "gpu.fault"
            gpu.listed = False
            gpu.unhealthy_since = now
            gpu.unhealthy_reason = fault.reason
            gpu.save(update_fields=["listed", "unhealthy_since", "unhealthy_reason"])
            delisted.append(fault)
            host = host or Host.objects.only("owner_id", "name", "hostname", "agent_id").get(
                pk=host_id
            )
            emit(
                host.owner_id,
                kind,
                {"host": host.label, "gpu": gpu.index, "uuid": gpu.uuid, "reason": fault.reason},
            )
            lease_ids = list(
                Lease.objects.filter(
                    lease_gpus__gpu=gpu,
                    lease_gpus__active=True,
                    state__in=Lease.ACTIVE_STATES,
                    gpu_fault_at__isnull=True,
                ).values_list("pk", flat=True)
            )
            Lease.objects.filter(pk__in=lease_ids, gpu_fault_at__isnull=True).update(
                gpu_fault_at=now,
                gpu_fault_reason=f"GPU {gpu.index} of this rental failed: {fault.detail}.",
            )
            flagged += [(str(lease_id), fault) for lease_id in lease_ids]
        transaction.on_commit(lambda: _after(host_id, delisted, flagged))
    return [fault.index for fault in delisted]


def _after(host_id: int, delisted: list[Fault], flagged: list[tuple[str, Fault]]) -> None:
    for fault in delisted:
        metrics.GPU_DELISTINGS.labels(fault.cause).inc()
        log.error(
            "host %s: GPU %s delisted: %s",
            host_id,
            fault.index,
            fault.detail,
            extra={"host_id": host_id, "gpu_index": fault.index},
        )
    for lease_id, fault in flagged:
        log.warning(
            "host %s, lease %s: its GPU %s failed: %s",
            host_id,
            lease_id,
            fault.index,
            fault.detail,
            extra={"host_id": host_id, "lease_id": lease_id, "gpu_index": fault.index},
        )
