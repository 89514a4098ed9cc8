"""The host's NVIDIA GPUs as NVML sees them: listing, compute processes, compute mode.

Blocking by design (NVML calls are synchronous C calls); the agent runs them through
``asyncio.to_thread``. A host without the driver is a normal case, not an error: ``available``
is false, the GPU list is empty, and ``unavailable_reason`` says why for ``doctor``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from supplier_agent.protocol import GpuProcess, GpuState

log = logging.getLogger(__name__)

# The protocol's limit for a process name.
MAX_PROCESS_NAME = 256

T = TypeVar("T")

# NVML's compute mode values, here so callers need not import pynvml.
COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_EXCLUSIVE_THREAD = 1
COMPUTE_MODE_PROHIBITED = 2
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3
COMPUTE_MODE_NAMES = {
    COMPUTE_MODE_DEFAULT: "DEFAULT",
    COMPUTE_MODE_EXCLUSIVE_THREAD: "EXCLUSIVE_THREAD",
    COMPUTE_MODE_PROHIBITED: "PROHIBITED",
    COMPUTE_MODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
}


# NVML's return codes the agent tells apart.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15


class GpuQueryError(Exception):
    """NVML could not answer a question about one GPU; ``reason`` is NVML's wording, ``code``
    its return code (None when NVML itself is unavailable)."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class ComputeModeError(GpuQueryError):
    """NVML refused to read or change a compute mode (not root, not supported, GPU lost)."""


class Nvml:
    """One NVML session for the agent's lifetime, initialised on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pynvml: ModuleType | None = None
        self._tried = False
        self._reason: str | None = None
        # (index, field, reason) already warned about: a GPU that fell off the bus would
        # otherwise log the same warning on every heartbeat.
        self._warned: set[tuple[int, str, str]] = set()
        self._warn_lock = threading.Lock()

    # --- session ------------------------------------------------------------------------------

    def _session(self) -> ModuleType | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                self._pynvml = self._init()
            return self._pynvml

    def _init(self) -> ModuleType | None:
        try:
            # Imported here, not at module level: the agent must run (and say why it sees no
            # GPU) on a host where nvidia-ml-py or the driver is missing.
            pynvml = importlib.import_module("pynvml")
        except ImportError as exc:
            self._reason = f"pynvml is not importable: {exc}"
            log.warning("NVML unavailable: %s", self._reason)
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # any failure: NVMLError, OSError from ctypes, ...
            self._reason = f"nvmlInit failed: {exc}"
            log.warning("NVML unavailable: %s", self._reason)
            return None
        self._reason = None
        return pynvml

    @property
    def available(self) -> bool:
        return self._session() is not None

    @property
    def unavailable_reason(self) -> str | None:
        """Why NVML cannot be used (``None`` when it can), for ``cloudgpu-agent doctor``."""
        self._session()
        return self._reason

    def shutdown(self) -> None:
        with self._lock:
            pynvml, self._pynvml, self._tried = self._pynvml, None, False
        if pynvml is not None:
            try:
                pynvml.nvmlShutdown()
            except Exception as exc:  # shutting down must never fail the agent's exit
                log.warning("nvmlShutdown failed: %s", exc)

    def _call(self, function: str, *args: Any) -> Any:
        """Call a pynvml function, turning any NVML error into ``GpuQueryError``."""
        pynvml = self._session()
        if pynvml is None:
            raise GpuQueryError(f"NVML is not available ({self._reason})")
        try:
            return getattr(pynvml, function)(*args)
        except pynvml.NVMLError as exc:
            raise GpuQueryError(str(exc), getattr(exc, "value", None)) from exc

    # For the agent's other NVML readers (gpu_health.py, metrics.py): same session, same errors.
    call = _call

    def handle(self, index: int) -> Any:
        return self._handle(index)

    def _handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # --- system -------------------------------------------------------------------------------

    def gpu_count(self) -> int:
        if not self.available:
            return 0
        try:
            return int(self._call("nvmlDeviceGetCount"))
        except GpuQueryError as exc:
            log.warning("could not count GPUs: %s", exc.reason)
            return 0

    def driver_version(self) -> str | None:
        if not self.available:
            return None
        try:
            return str(self._call("nvmlSystemGetDriverVersion"))
        except GpuQueryError:
            return None

    def cuda_version(self) -> str | None:
        """The CUDA version the driver supports, e.g. ``"12.8"``."""
        if not self.available:
            return None
        try:
            version = int(self._call("nvmlSystemGetCudaDriverVersion"))
        except GpuQueryError:
            return None
        return f"{version // 1000}.{version % 1000 // 10}"

    def index_for_uuid(self, uuid: str) -> int | None:
        if not self.available:
            return None
        try:
            return int(
                self._call("nvmlDeviceGetIndex", self._call("nvmlDeviceGetHandleByUUID", uuid))
            )
        except GpuQueryError:
            return None

    def uuid_for_index(self, index: int) -> str | None:
        if not self.available:
            return None
        try:
            return str(self._call("nvmlDeviceGetUUID", self._handle(index)))
        except GpuQueryError:
            return None

    # --- per GPU ------------------------------------------------------------------------------

    def gpus(self) -> list[GpuState]:
        """Every GPU NVML can still identify; a failing field gets a neutral default."""
        states = []
        for index in range(self.gpu_count()):
            state = self._sample(index)
            if state is not None:
                states.append(state)
        return states

    def _sample(self, index: int) -> GpuState | None:
        try:
            handle = self._handle(index)
            uuid = str(self._call("nvmlDeviceGetUUID", handle))
        except GpuQueryError as exc:
            # Without a UUID the hub cannot tell which GPU this is; leave it out this round.
            self._warn(index, "uuid", exc.reason)
            return None
        name = self._field(
            index, "name", "unknown", lambda: str(self._call("nvmlDeviceGetName", handle))
        )
        memory = self._field(
            index, "memory", None, lambda: self._call("nvmlDeviceGetMemoryInfo", handle)
        )
        utilization = self._field(
            index,
            "utilization",
            0,
            lambda: int(self._call("nvmlDeviceGetUtilizationRates", handle).gpu),
        )
        no_processes: list[GpuProcess] = []
        processes = self._field(index, "processes", no_processes, lambda: self._processes(handle))
        total = int(memory.total) if memory is not None else 0
        used = int(memory.used) if memory is not None else 0
        return GpuState(
            index=index,
            uuid=uuid,
            name=name or "unknown",
            memory_total_bytes=max(total, 0),
            memory_used_bytes=min(max(used, 0), max(total, 0)) if total else max(used, 0),
            utilization_pct=min(max(utilization, 0), 100),
            processes=tuple(processes),
        )

    def _field(self, index: int, field: str, default: T, read: Callable[[], T]) -> T:
        try:
            value = read()
        except GpuQueryError as exc:
            self._warn(index, field, exc.reason)
            return default
        with self._warn_lock:  # the field recovered: warn again if it breaks again
            self._warned = {w for w in self._warned if w[:2] != (index, field)}
        return value

    def _warn(self, index: int, field: str, reason: str) -> None:
        key = (index, field, reason)
        with self._warn_lock:
            first = key not in self._warned
            self._warned.add(key)
        if first:
            log.warning("GPU %d: cannot read %s: %s", index, field, reason)
        else:
            log.debug("GPU %d: still cannot read %s: %s", index, field, reason)

    def compute_processes(self, index: int) -> list[GpuProcess]:
        """Compute processes on GPU ``index``; raises ``GpuQueryError`` if NVML cannot say.

        Raising (not returning ``[]``) matters: a claim must not mistake "unknown" for "idle".
        """
        return self._processes(self._handle(index))

    def _processes(self, handle: Any) -> list[GpuProcess]:
        return [
            GpuProcess(
                pid=int(process.pid),
                name=self._process_name(int(process.pid)),
                # None when the driver cannot account per-process memory.
                memory_bytes=max(int(process.usedGpuMemory or 0), 0),
            )
            for process in self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        ]

    def _process_name(self, pid: int) -> str:
        # Names come from renters' processes: pynvml decodes them strictly (a non-UTF-8 name
        # raises) and they can be long; neither may break a heartbeat.
        try:
            return str(self._call("nvmlSystemGetProcessName", pid))[:MAX_PROCESS_NAME]
        except Exception as exc:  # fall back to /proc whatever NVML did
            log.debug("NVML cannot name pid %s: %s", pid, exc)
        try:
            # NVML cannot name processes it does not own in some containers; /proc still can.
            comm = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace")
            return comm.strip()[:MAX_PROCESS_NAME]
        except OSError:
            return ""

    def get_compute_mode(self, index: int) -> int:
        try:
            return int(self._call("nvmlDeviceGetComputeMode", self._handle(index)))
        except GpuQueryError as exc:
            raise ComputeModeError(exc.reason) from exc

    def set_compute_mode(self, index: int, exclusive: bool) -> None:
        """EXCLUSIVE_PROCESS (``exclusive``) or DEFAULT; ``ComputeModeError`` when refused."""
        mode = COMPUTE_MODE_EXCLUSIVE_PROCESS if exclusive else COMPUTE_MODE_DEFAULT
        try:
            self._call("nvmlDeviceSetComputeMode", self._handle(index), mode)
        except GpuQueryError as exc:
            raise ComputeModeError(exc.reason) from exc
