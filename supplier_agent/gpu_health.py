"""What NVML says about a GPU failing: XID events, ECC error totals, a board fallen off the bus,
thermal slowdown. Read on every heartbeat (cheap NVML queries, no ``nvidia-smi``), reported to
the hub as a ``gpu_health`` message when it changes; the hub decides what counts as failed.

XIDs come as NVML events: an event set per GPU, registered when the GPU is first listed (NVML
delivers only events raised after registration) and drained without waiting on each sample.
Blocking, like everything NVML: the agent calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from supplier_agent.gpu import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    GpuQueryError,
    Nvml,
)
from supplier_agent.protocol import MAX_XIDS_REPORTED, GpuHealth, GpuState

log = logging.getLogger(__name__)

EVENT_TYPE_XID = 0x8  # nvmlEventTypeXidCriticalError
MEMORY_ERROR_UNCORRECTED = 1
MEMORY_ERROR_CORRECTED = 0
VOLATILE_ECC = 0  # since the driver loaded; the aggregate counter outlives resets
# nvmlClocksEventReasonSwThermalSlowdown | nvmlClocksEventReasonHwThermalSlowdown
THERMAL_SLOWDOWN = 0x20 | 0x40
# Events drained per GPU per sample: an XID storm must not hold the heartbeat.
MAX_EVENTS_PER_SAMPLE = 256


@dataclass
class _Watched:
    uuid: str
    events: Any = None  # the NVML event set, or None where XIDs cannot be watched
    xids: list[int] = field(default_factory=list)  # distinct, oldest first
    xid_count: int = 0


class HealthWatch:
    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._by_index: dict[int, _Watched] = {}

    def watch(self, gpus: list[GpuState]) -> None:
        """Start watching XIDs of GPUs listed for the first time (or at a new index)."""
        for gpu in gpus:
            with self._lock:
                known = self._by_index.get(gpu.index)
                if known is not None and known.uuid == gpu.uuid:
                    continue
                self._by_index[gpu.index] = _Watched(gpu.uuid, self._register(gpu.index))

    def _register(self, index: int) -> Any:
        try:
            events = self._nvml.call("nvmlEventSetCreate")
            self._nvml.call(
                "nvmlDeviceRegisterEvents", self._nvml.handle(index), EVENT_TYPE_XID, events
            )
            return events
        except GpuQueryError as exc:
            log.warning("GPU %d: XID events cannot be watched: %s", index, exc.reason)
            return None

    def sample(self) -> list[GpuHealth]:
        """Every watched GPU's health now. Under the lock throughout: the heartbeat and a
        metrics scrape (another thread) may sample at once, and both drain the same events."""
        with self._lock:
            return [self._one(index, gpu) for index, gpu in sorted(self._by_index.items())]

    def _one(self, index: int, gpu: _Watched) -> GpuHealth:
        try:
            handle = self._nvml.handle(index)
            uuid = str(self._nvml.call("nvmlDeviceGetUUID", handle))
        except GpuQueryError as exc:
            if exc.code == NVML_ERROR_GPU_IS_LOST:
                return self._report(index, gpu, lost=True)
            return self._report(index, gpu)
        if uuid != gpu.uuid:
            return self._report(index, gpu)  # re-listed at the next heartbeat's watch()
        self._drain(gpu)
        return self._report(
            index,
            gpu,
            ecc_uncorrected=self._counter(handle, MEMORY_ERROR_UNCORRECTED),
            ecc_corrected=self._counter(handle, MEMORY_ERROR_CORRECTED),
            thermal=self._thermal(handle),
        )

    def _drain(self, gpu: _Watched) -> None:
        if gpu.events is None:
            return
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                event = self._nvml.call("nvmlEventSetWait_v2", gpu.events, 0)
            except GpuQueryError as exc:
                if exc.code != NVML_ERROR_TIMEOUT:  # TIMEOUT: nothing new
                    log.debug("XID events of %s: %s", gpu.uuid, exc.reason)
                return
            xid = int(event.eventData)
            gpu.xid_count += 1
            log.error("GPU %s reported XID %d", gpu.uuid, xid)
            if xid not in gpu.xids:
                gpu.xids.append(xid)
                # Keep the first ones: the one that started it matters most.
                del gpu.xids[MAX_XIDS_REPORTED:]

    def _counter(self, handle: Any, error_type: int) -> int:
        try:
            return max(
                int(
                    self._nvml.call("nvmlDeviceGetTotalEccErrors", handle, error_type, VOLATILE_ECC)
                ),
                0,
            )
        except GpuQueryError:  # NOT_SUPPORTED on boards without ECC: nothing to count
            return 0

    def _thermal(self, handle: Any) -> bool:
        try:
            reasons = int(self._nvml.call("nvmlDeviceGetCurrentClocksEventReasons", handle))
        except GpuQueryError as exc:
            if exc.code != NVML_ERROR_NOT_SUPPORTED:
                log.debug("throttle reasons unreadable: %s", exc.reason)
            return False
        return bool(reasons & THERMAL_SLOWDOWN)

    @staticmethod
    def _report(
        index: int,
        gpu: _Watched,
        *,
        lost: bool = False,
        ecc_uncorrected: int = 0,
        ecc_corrected: int = 0,
        thermal: bool = False,
    ) -> GpuHealth:
        return GpuHealth(
            index=index,
            uuid=gpu.uuid,
            xids=tuple(gpu.xids),
            xid_count=gpu.xid_count,
            ecc_uncorrected=ecc_uncorrected,
            ecc_corrected=ecc_corrected,
            lost=lost,
            thermal_throttle=thermal,
        )
